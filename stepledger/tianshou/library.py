"""Tianshou's entry in the table of libraries (``stepledger.libraries``); it imports nothing of Tianshou."""

from stepledger.libraries import Library

LIBRARY = Library(
    name="tianshou",
    summary="Tianshou: ledger_env_fns puts LedgerEnv in the workers of its vector envs; LedgerCollector records "
            "what the replay buffer hands out",
    extra="tianshou",
    requires=("tianshou",),
    trainer="tianshou",
    trainer_help="Tianshou's Collector (LedgerCollector) on --tianshou-vector, --num-envs envs, random actions",
    check="stepledger.tianshou.check:check_from_cli",
    options=(
        ("--tianshou-vector", dict(choices=("dummy", "subproc", "shmem"), default="subproc",
                                   help="with --trainer tianshou: Tianshou's DummyVectorEnv, SubprocVectorEnv or "
                                        "ShmemVectorEnv")),
        ("--tianshou-place", dict(choices=("worker", "vector"), default="worker",
                                  help="with --trainer tianshou: inject each fault in the worker, outside LedgerEnv "
                                       "(the env-side faults), or between the vector env and the collector (the "
                                       "trainer-side faults, the swaps among them)")),
    ),
)
