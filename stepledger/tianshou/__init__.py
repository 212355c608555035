"""Tianshou: both sides of the boundary for its vector envs and its Collector.

- env side: ``ledger_env_fns(make_env, n, directory)`` (or ``LedgerEnvFn``) gives the ``env_fns`` of
  ``DummyVectorEnv``, ``SubprocVectorEnv`` or ``ShmemVectorEnv``: ``LedgerEnv`` around each env, in its
  worker, with its index;
- trainer side: ``LedgerCollector``, a ``Collector`` that records the transitions its replay buffer hands out.

One folder holds the library's support: ``envs`` and ``collector`` (the two sides), ``faults``
(``FaultyVectorEnv``, ``inject_in_worker``), ``check`` (``check_collector``, ``stepledger check --trainer
tianshou``), ``library`` (its line in ``stepledger.libraries``). Needs the ``[tianshou]`` extra; the names are
imported on first use, so that importing this package does not import Tianshou. docs/TIANSHOU.md has the whole
story.
"""

from typing import TYPE_CHECKING

from stepledger._moved import lazy_face

if TYPE_CHECKING:  # what an editor and a type checker see; at run time each name is imported on first use
    from stepledger.tianshou.check import check_collector
    from stepledger.tianshou.collector import LedgerCollector, LedgerMultiAgentCollector
    from stepledger.tianshou.envs import LedgerEnvFn, LedgerPettingZooEnvFn, ledger_env_fns, ledger_pettingzoo_env_fns
    from stepledger.tianshou.faults import VECTOR_FAULTS, FaultyVectorEnv, inject_in_worker

_NAMES = {
    **dict.fromkeys(("LedgerEnvFn", "LedgerPettingZooEnvFn", "ledger_env_fns", "ledger_pettingzoo_env_fns"), "envs"),
    **dict.fromkeys(("LedgerCollector", "LedgerMultiAgentCollector"), "collector"),
    **dict.fromkeys(("VECTOR_FAULTS", "FaultyVectorEnv", "inject_in_worker"), "faults"),
    **dict.fromkeys(("check_collector",), "check"),
}
__all__ = sorted(_NAMES)
if not TYPE_CHECKING:  # a type checker sees only the names above: a misspelt one is an error, not Any
    __getattr__, __dir__ = lazy_face(__name__, _NAMES)
