"""What compare's Report and the episode check's EpisodeReport share: truthy when nothing differs,
``str()`` their lines, ``to_json()`` their ``to_dict()``."""

from __future__ import annotations

from typing import Any, Sequence

from stepledger.report import jsonout as _jsonout


class DifferenceReport:
    """A report whose ``differences`` list what differs; subclasses give ``lines()`` and ``to_dict()``."""

    differences: Sequence[Any] = ()

    @property
    def ok(self) -> bool:
        return not self.differences

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def lines(self) -> list[str]:
        """The report's lines, as ``str()`` joins them."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        raise NotImplementedError

    def to_json(self) -> str:
        return _jsonout.dumps(self.to_dict())
