"""stepledger: find silent faults at the environment-trainer boundary.

Keep a ledger on each side of the boundary (``LedgerEnv`` in the env's
process; ``LedgerVectorEnv`` or ``stepledger.sb3.LedgerVecEnv`` around the
trainer's vector env, or ``TrainerLedger`` driven by any trainer; ``EnvLedger``
for a batch of envs at a vector env's own output), then
``compare`` the two: it names the env, episode, step and field of the first
difference.
"""

from stepledger.__about__ import __version__
from stepledger.report.compare import Report, compare
from stepledger.core import IMPLEMENTATION as CORE
from stepledger.gymnasium.env import LedgerEnv
from stepledger.errors import LedgerError, SettingsError, UnsupportedSpaceError
from stepledger.recording.live import BoundaryFault
from stepledger.report.read import read
from stepledger.recording.trainer import TrainerLedger
from stepledger.recording.envbatch import EnvLedger
from stepledger.gymnasium.vector import LedgerVectorEnv

from stepledger import _moved

_moved.install()  # the import paths from before the package had folders (stepledger.check, stepledger.vector, ...)

__all__ = ["BoundaryFault", "CORE", "EnvLedger", "LedgerEnv", "LedgerError", "LedgerVectorEnv", "Report", "SettingsError",
           "TrainerLedger", "UnsupportedSpaceError", "__version__", "compare", "read"]
