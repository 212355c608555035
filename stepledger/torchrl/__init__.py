"""TorchRL: both sides of the boundary for its batched envs and its collectors.

- env side: ``ledger_env_fns(make_env, n, directory)`` (or ``LedgerEnvFn``) gives the ``create_env_fn`` of
  ``ParallelEnv`` or ``SerialEnv``: ``LedgerEnv`` around each Gymnasium env, in its worker, with its index,
  handed to ``LedgerGymWrapper`` (TorchRL's ``GymWrapper`` that puts the index in every step;
  ``LedgerIndex`` does the same as a transform, for a stack of one's own);
- trainer side: ``LedgerCollector``, which records each batch a ``Collector``, ``MultiSyncCollector`` or
  ``MultiAsyncCollector`` hands out.

One folder holds the library's support: ``envs`` and ``collector`` (the two sides), ``faults``
(``inject_in_worker`` in the workers, ``FaultyTransform`` on the batched env), ``check`` (``check_collector``,
``stepledger check --trainer torchrl``), ``library`` (its line in ``stepledger.libraries``). Needs the
``[torchrl]`` extra; the names are imported on first use, so that importing this package does not import
TorchRL. docs/TORCHRL.md has the whole story.
"""

from typing import TYPE_CHECKING

from stepledger._moved import lazy_face

if TYPE_CHECKING:  # what an editor and a type checker see; at run time each name is imported on first use
    from stepledger.torchrl.check import check_collector
    from stepledger.torchrl.collector import LedgerCollector, spaces_of
    from stepledger.torchrl.envs import (INDEX_KEY, LedgerEnvFn, LedgerGymMixin, LedgerGymWrapper, LedgerIndex,
                                         ledger_env_fns, ledger_inside)
    from stepledger.torchrl.faults import ENV_SIDE_FAULTS, TRAINER_SIDE_FAULTS, FaultyTransform, inject_in_worker

_NAMES = {
    **dict.fromkeys(("INDEX_KEY", "LedgerEnvFn", "LedgerGymMixin", "LedgerGymWrapper", "LedgerIndex",
                     "ledger_env_fns", "ledger_inside"), "envs"),
    **dict.fromkeys(("LedgerCollector", "spaces_of"), "collector"),
    **dict.fromkeys(("ENV_SIDE_FAULTS", "TRAINER_SIDE_FAULTS", "FaultyTransform", "inject_in_worker"), "faults"),
    **dict.fromkeys(("check_collector",), "check"),
}
__all__ = sorted(_NAMES)
if not TYPE_CHECKING:  # a type checker sees only the names above: a misspelt one is an error, not Any
    __getattr__, __dir__ = lazy_face(__name__, _NAMES)
