"""Gymnasium's entry in the table of libraries (``stepledger.libraries``)."""

from stepledger.libraries import Library

LIBRARY = Library(
    name="gymnasium",
    summary="Gymnasium: LedgerEnv around each env, LedgerVectorEnv around the vector env",
    requires=("gymnasium",),
    trainer="vector",
    check="stepledger.gymnasium.check:check_from_cli",
    vectors=("sync", "async"),
)
