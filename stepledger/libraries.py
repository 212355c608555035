"""The libraries stepledger adapts: one line each. The command line and ``check`` find them here.

Each name is a folder, ``stepledger/<name>/``, holding the library's adapters, its fault injector
(``faults.py``), its rollouts for ``stepledger check`` (``check.py``) and ``library.py``, whose
``LIBRARY`` describes it (``Library`` below). The descriptor imports nothing of the library it adapts,
so that the command line can list every library without importing any. docs/LIBRARIES.md has the
contract a library's folder follows.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from typing import Any, Callable

from stepledger.errors import LedgerError

def positive_int(text: str) -> int:
    """An argparse type: a positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a positive integer, got %r" % text) from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1, got %d" % value)
    return value


LIBRARIES = (
    "gymnasium",
    "sb3",
    "pettingzoo",
    "rllib",
    "tianshou",
    "torchrl",
)


@dataclass(frozen=True)
class Library:
    """What a library's folder provides, as its ``library.py`` declares it.

    Attributes:
        name: its folder, ``stepledger.<name>``.
        summary: one line: the library, then what its adapters do (its name before the colon names it in
            messages).
        extra: the pip extra that installs what it needs (``plugrl-stepledger[<extra>]``), or None.
        requires: the import names it needs, checked before its check runs.
        trainer: its ``stepledger check --trainer`` name, or None where it has no check of its own.
        trainer_help: what ``--trainer <trainer>`` runs, for ``stepledger check --help``.
        check: ``"module:function"``, the check that ``--trainer`` runs: ``function(args, progress)``
            returns a CheckReport (``args``: the parsed command line).
        vectors: the ``--vector`` kinds it gives ``check_boundary``: its ``check`` module's
            ``vector(kind, autoreset)`` builds one.
        options: its own options of ``stepledger check``, as ``(flag, argparse keyword arguments)``.

    The wrappers that change values on purpose are not here: ``stepledger.known_wrappers`` is their one list,
    keyed by the package that defines them, because the placement warning and the report's hints (below
    this layer) read it.
    """

    name: str
    summary: str
    extra: str | None = None
    requires: tuple[str, ...] = ()
    trainer: str | None = None
    trainer_help: str | None = None
    check: str | None = None
    vectors: tuple[str, ...] = ()
    options: tuple[tuple[str, dict[str, Any]], ...] = ()

    def require(self, what: str) -> None:
        """Raise a one-line LedgerError naming the extra to install if a module it needs is missing."""
        for module in self.requires:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                hint = " pip install 'plugrl-stepledger[%s]'" % self.extra if self.extra else ""
                raise LedgerError("%s needs %s:%s (%s)" % (what, self.summary_name, hint, exc)) from None

    @property
    def summary_name(self) -> str:
        return self.summary.split(":", 1)[0]

    def function(self, ref: str) -> Callable[..., Any]:
        module, _, name = ref.partition(":")
        return getattr(importlib.import_module(module), name)


def library(name: str) -> Library:
    """The descriptor of library ``name``."""
    if name not in LIBRARIES:
        raise ValueError("no library %r (there are %s)" % (name, ", ".join(LIBRARIES)))
    return importlib.import_module("stepledger.%s.library" % name).LIBRARY


def every() -> list[Library]:
    """Every library's descriptor, in the table's order."""
    return [library(name) for name in LIBRARIES]


def by_trainer(trainer: str) -> Library:
    """The library whose check ``--trainer trainer`` runs."""
    for lib in every():
        if lib.trainer == trainer:
            return lib
    raise ValueError("no library checks --trainer %r" % (trainer,))


def trainer_help() -> str:
    """The help of ``stepledger check --trainer``: each library's trainer and what it runs."""
    parts = []
    for lib in every():
        if lib.trainer:
            needs = " (needs the [%s] extra)" % lib.extra if lib.extra else ""
            parts.append("%s: %s%s" % (lib.trainer, lib.trainer_help or lib.summary, needs))
    return "; ".join(parts)


def vector_help() -> str:
    """The help of ``--vector``: the vector envs each library gives."""
    return ", ".join("%s's %s%s" % (lib.summary_name, " or ".join(lib.vectors),
                                    " (the [%s] extra)" % lib.extra if lib.extra else "")
                     for lib in every() if lib.vectors)


def vector_kinds() -> tuple[str, ...]:
    """Every ``--vector`` kind of every library, in the table's order."""
    return tuple(kind for lib in every() for kind in lib.vectors)


def vector(kind: str, autoreset: str = "next") -> Any:
    """The vector env of ``kind`` for ``check_boundary``, from the library that gives it."""
    for lib in every():
        if kind in lib.vectors:
            lib.require("check_boundary: vector=%r" % kind)
            return importlib.import_module("stepledger.%s.check" % lib.name).vector(kind, autoreset)
    raise ValueError("no library gives vector=%r (there are %s)" % (kind, ", ".join(vector_kinds())))
