"""Local and remote writing behind one interface (stepledger/format/place.py): each place provides every
operation of it, and Recording calls them without asking which place it has."""

import ast
import inspect

from stepledger.format.local import LocalLedger
from stepledger.format.place import LedgerPlace
from stepledger.format.remote import RemoteLedger
from stepledger.recording import recording


def _operations():
    return [name for name, value in vars(LedgerPlace).items() if callable(value) and not name.startswith("_")]


def test_each_place_provides_every_operation_of_the_interface():
    assert len(_operations()) >= 15
    for place in (LocalLedger, RemoteLedger):
        assert issubclass(place, LedgerPlace)
        missing = [name for name in _operations() if getattr(place, name) is getattr(LedgerPlace, name)]
        assert missing == [], (place.__name__, missing)
        for name in _operations():  # called with the interface's arguments
            ours = list(inspect.signature(getattr(LedgerPlace, name)).parameters)
            theirs = list(inspect.signature(getattr(place, name)).parameters)
            assert theirs[:len(ours)] == ours, (place.__name__, name, theirs)


def test_recording_never_asks_which_place_it_has():
    tree = ast.parse(inspect.getsource(recording.Recording))
    asked = [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
             and node.attr in ("remote", "_remote", "is_remote", "RemoteLedger", "LocalLedger")]
    asked += [node.id for node in ast.walk(tree) if isinstance(node, ast.Name)
              and node.id in ("RemoteLedger", "LocalLedger", "isinstance")]
    assert asked == []
    # and every operation of the interface is used by it
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert set(_operations()) - used == set()
