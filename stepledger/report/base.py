"""What compare's Report and the episode check's EpisodeReport share: truthy when nothing differs,
``str()`` their lines, ``to_json()`` their ``to_dict()``."""

from stepledger.report import jsonout as _jsonout


class DifferenceReport:
    """A report whose ``differences`` list what differs; subclasses give ``lines()`` and ``to_dict()``."""

    differences = ()

    @property
    def ok(self):
        return not self.differences

    def __bool__(self):
        return self.ok

    def __str__(self):
        return "\n".join(self.lines())

    def to_json(self):
        return _jsonout.dumps(self.to_dict())
