"""Stable-Baselines3's entry in the table of libraries (``stepledger.libraries``)."""

from stepledger.libraries import Library

LIBRARY = Library(
    name="sb3",
    summary="Stable-Baselines3: LedgerVecEnv around the VecEnv",
    extra="sb3",
    requires=("stable_baselines3",),
    vectors=("subproc", "dummy"),
)
