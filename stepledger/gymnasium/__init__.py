"""Gymnasium: ``LedgerEnv`` (the env side, around each env) and ``LedgerVectorEnv`` (the trainer side, around the
vector env).

One folder holds the library's support: ``env`` and ``vector`` (the two ledgers), ``faults`` (FaultyEnv,
FaultyVectorEnv), ``check`` (check_boundary, ``stepledger check``), ``library`` (its line in
``stepledger.libraries``). Gymnasium is a dependency of stepledger, so its names are imported here at once.
"""

from stepledger.gymnasium.batch import LedgerBatchEnv
from stepledger.gymnasium.env import LedgerEnv
from stepledger.gymnasium.vector import LedgerVectorEnv

__all__ = ["LedgerBatchEnv", "LedgerEnv", "LedgerVectorEnv"]
