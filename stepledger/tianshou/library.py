"""Tianshou's entry in the table of libraries (import-light: nothing of Tianshou or torch is imported here)."""

from ..faults import ENV_SIDE_FAULTS

LIBRARY = dict(
    name="tianshou",
    extra="tianshou",
    requires=("tianshou",),
    faults=ENV_SIDE_FAULTS,  # with --tianshou-place worker (the default); vector: stepledger.tianshou.faults.VECTOR_FAULTS
    options=(
        ("--tianshou-vector", dict(choices=("dummy", "subproc", "shmem"), default="subproc",
                                   help="with --trainer tianshou: Tianshou's DummyVectorEnv, SubprocVectorEnv or "
                                        "ShmemVectorEnv")),
        ("--tianshou-place", dict(choices=("worker", "vector"), default="worker",
                                  help="with --trainer tianshou: inject each fault in the worker, outside LedgerEnv "
                                       "(the env-side faults), or between the vector env and the collector (the "
                                       "trainer-side faults, swaps among them)")),
    ),
    check="stepledger.tianshou.check:check",
    value_changing_wrappers=("HERReplayBuffer", "HERReplayBufferManager", "HERVectorReplayBuffer",
                             "CachedReplayBuffer"),
    summary="Tianshou: LedgerEnv in the workers of Dummy/Subproc/ShmemVectorEnv (ledger_env_fns), LedgerCollector "
            "records what the replay buffer hands out",
)
