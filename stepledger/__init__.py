"""stepledger: find silent faults at the environment-trainer boundary.

Keep a ledger on each side of the boundary (``LedgerEnv`` in the env's
process; ``LedgerVectorEnv`` or ``stepledger.sb3.LedgerVecEnv`` around the
trainer's vector env, or ``TrainerLedger`` driven by any trainer), then
``compare`` the two: it names the env, episode, step and field of the first
difference.
"""

from .__about__ import __version__
from .compare import Report, compare
from .core import IMPLEMENTATION as CORE
from .env import LedgerEnv
from .errors import LedgerError, SettingsError, UnsupportedSpaceError
from .live import BoundaryFault
from .read import read
from .trainer import TrainerLedger
from .vector import LedgerVectorEnv

__all__ = ["BoundaryFault", "CORE", "LedgerEnv", "LedgerError", "LedgerVectorEnv", "Report", "SettingsError",
           "TrainerLedger", "UnsupportedSpaceError", "__version__", "compare", "read"]
