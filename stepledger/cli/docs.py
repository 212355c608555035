"""The documentation pages, reachable from an installed package: ``stepledger docs PAGE``.

A wheel carries the pages in ``stepledger/docs/`` (setup.py copies the
checkout's ``docs/*.md`` there when it builds); a checkout or an editable
install reads them from ``docs/`` next to the package.
"""

import os

from stepledger.errors import LedgerError

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # stepledger/
_PLACES = (os.path.join(_PACKAGE, "docs"), os.path.join(os.path.dirname(_PACKAGE), "docs"))


def _directory():
    for place in _PLACES:
        if os.path.isdir(place) and any(n.endswith(".md") for n in os.listdir(place)):
            return place
    raise LedgerError("the documentation pages are not installed with this copy of stepledger (looked in %s)"
                      % " and ".join(_PLACES))


def page_names():
    """The page names, lower case and without ``.md``: ``report``, ``format``, ..."""
    return sorted(n[:-3].lower() for n in os.listdir(_directory()) if n.endswith(".md"))


def page_text(name):
    """The text of page ``name`` (``report``, ``REPORT`` or ``REPORT.md``); LedgerError if there is none."""
    directory = _directory()
    want = name.lower()
    if want.endswith(".md"):
        want = want[:-3]
    for entry in os.listdir(directory):
        if entry.endswith(".md") and entry[:-3].lower() == want:
            with open(os.path.join(directory, entry), encoding="utf-8") as f:
                return f.read()
    raise LedgerError("no documentation page %r; the pages are: %s" % (name, ", ".join(page_names())))
