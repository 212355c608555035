"""Import paths from before the package had folders, kept working.

Until version 0.7 every module sat directly in ``stepledger/``. Code that imports
``stepledger.check``, ``stepledger.spaces`` or ``stepledger.faults.FaultyEnv``
still runs: each old module name is an alias of the module that now holds it
(the same module object, so patching one patches the other), and each name that
left its old module is found where it lives now. Both are resolved on first use,
so an alias costs nothing until it is imported.

The two tables below are the one place that says where things went.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
from types import ModuleType
from typing import Any, Callable, Sequence

#: old module name -> the module that holds it now
MODULES = {
    "stepledger.check": "stepledger.faults.check",
    "stepledger.compare": "stepledger.report.compare",
    "stepledger.demo": "stepledger.cli.demo",
    "stepledger.docs": "stepledger.cli.docs",
    "stepledger.env": "stepledger.gymnasium.env",
    "stepledger.episode_tap": "stepledger.report.episodes.tap",
    "stepledger.episodes": "stepledger.report.episodes",
    "stepledger.junit": "stepledger.report.junit",
    "stepledger.ledgerfile": "stepledger.format.ledgerfile",
    "stepledger.live": "stepledger.recording.live",
    "stepledger.processes": "stepledger.format.processes",
    "stepledger.progress": "stepledger.cli.progress",
    "stepledger.read": "stepledger.report.read",
    "stepledger.spaces": "stepledger.format.spaces",
    "stepledger.stack": "stepledger.recording.placement",
    "stepledger.storage": "stepledger.format.storage",
    "stepledger.trainer": "stepledger.recording.trainer",
    "stepledger.uploader": "stepledger.format.remote",
    "stepledger.vector": "stepledger.gymnasium.vector",
}

#: module now -> {name that left it: the module that holds the name now}
NAMES = {
    "stepledger.faults": {
        "FaultyEnv": "stepledger.gymnasium.faults",
        "FaultyVectorEnv": "stepledger.gymnasium.faults",
        "FaultyVecEnv": "stepledger.sb3.faults",
        "FaultyParallelEnv": "stepledger.pettingzoo.faults",
    },
    # Names that left recording/recording.py when it was split by job (issue 23); for code written
    # against the first layout.
    "stepledger.recording.recording": {
        "attend": "stepledger.recording.hooks",
        "spill_everything": "stepledger.recording.hooks",
        "open_recording": "stepledger.recording.spiller",
        "check_directory": "stepledger.recording.checks",
        "check_path": "stepledger.recording.checks",
        "check_reward_dtype": "stepledger.recording.checks",
        "flush_interval": "stepledger.recording.checks",
    },
    "stepledger.faults.check": {
        "VECTORS": "stepledger.gymnasium.check",
        "check_boundary": "stepledger.gymnasium.check",
        "SB3_FORM_BLIND": "stepledger.pettingzoo.check",
        "SUPERSUIT_FORMS": "stepledger.pettingzoo.check",
        "check_parallel": "stepledger.pettingzoo.check",
        "parallel_env_factory": "stepledger.pettingzoo.check",
        "supersuit_rollout": "stepledger.pettingzoo.check",
    },
}


def _new_name(name: str) -> str | None:
    if name in MODULES:
        return MODULES[name]
    for old, new in MODULES.items():  # a module inside a package that moved (stepledger.episodes.logs)
        if name.startswith(old + "."):
            return new + name[len(old):]
    return None


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module name and hands back the module that holds it now."""

    def find_spec(self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> Any:
        new = _new_name(name) if name.startswith("stepledger.") else None
        if new is None:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec: Any) -> ModuleType:
        return importlib.import_module(_new_name(spec.name) or spec.name)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the module it names ran when it was imported


def install() -> None:
    """Put the alias finder first, and alias the old names of modules the package has already imported (so that
    ``import stepledger.compare`` does not replace the package's ``compare`` function with a module)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
    for old, new in MODULES.items():
        if new in sys.modules and old not in sys.modules:
            sys.modules[old] = sys.modules[new]


def names_of(module: str) -> Callable[[str], Any]:
    """A module's ``__getattr__`` for the names that left it: ``__getattr__ = names_of(__name__)``."""
    moved = NAMES.get(module, {})

    def __getattr__(name: str) -> Any:
        where = moved.get(name)
        if where is None:
            raise AttributeError("module %r has no attribute %r" % (module, name))
        return getattr(importlib.import_module(where), name)
    return __getattr__


def lazy_face(module: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for a library's package: its public names, each imported from its module
    (``names``: name -> submodule) on first use, so that importing the package (for its ``library`` descriptor)
    does not import the library it adapts."""

    def __getattr__(name: str) -> Any:
        sub = names.get(name)
        if sub is None:
            raise AttributeError("module %r has no attribute %r" % (module, name))
        value = getattr(importlib.import_module(module + "." + sub), name)
        setattr(sys.modules[module], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(names) | set(vars(sys.modules[module])))

    # A public name that is also its submodule's name (stepledger.rllib.instrument, the function, in
    # instrument.py): importing that submodule first (``import stepledger.rllib.faults`` imports it) would
    # have the import system set the package's attribute to the submodule, and ``stepledger.rllib.instrument(
    # config, path)`` would then fail with "'module' object is not callable". The package keeps the name.
    shadowed = {name for name, sub in names.items() if name == sub}
    if shadowed:
        class _Face(types.ModuleType):
            def __setattr__(self, name: str, value: Any) -> None:
                if name in shadowed and isinstance(value, types.ModuleType):
                    value = getattr(value, name)
                super().__setattr__(name, value)
        sys.modules[module].__class__ = _Face
    return __getattr__, __dir__
