"""Stable-Baselines3: ``LedgerVecEnv``, the trainer-side ledger around an SB3 VecEnv.

    from stepledger.sb3 import LedgerVecEnv
    venv = LedgerVecEnv(SubprocVecEnv([make_env(i) for i in range(8)]), "ledger/trainer.npz")

One folder holds the library's support: ``vec_env`` (LedgerVecEnv, StopOnBoundaryFault, LogLiveCheck), ``faults``
(FaultyVecEnv, its injector), ``check`` (its vector envs for ``check_boundary``), ``library`` (its line in
``stepledger.libraries``). Importing this package does not import SB3; each name does, on first use.
"""

from typing import TYPE_CHECKING

from stepledger._moved import lazy_face

if TYPE_CHECKING:  # what an editor and a type checker see; at run time each name is imported on first use
    from stepledger.sb3.vec_env import BoundaryFault, LedgerVecEnv, LogLiveCheck, StopOnBoundaryFault
    from stepledger.sb3.faults import FaultyVecEnv

_NAMES = {
    **dict.fromkeys(('BoundaryFault', 'LedgerVecEnv', 'LogLiveCheck', 'StopOnBoundaryFault'), 'vec_env'),
    **dict.fromkeys(('FaultyVecEnv',), 'faults'),
}
__all__ = sorted(_NAMES)
if not TYPE_CHECKING:  # a type checker sees only the names above: a misspelt one is an error, not Any
    __getattr__, __dir__ = lazy_face(__name__, _NAMES)
