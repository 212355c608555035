"""Gymnasium's entry in the table of libraries (``stepledger.libraries``)."""

from stepledger.libraries import Library

LIBRARY = Library(
    name="gymnasium",
    summary="Gymnasium: LedgerEnv around each env, LedgerVectorEnv around the vector env",
    requires=("gymnasium",),
    trainer="vector",
    trainer_help="the vector env chosen by --vector, stepped with random actions",
    check="stepledger.gymnasium.check:check_from_cli",
    vectors=("sync", "async"),
)
