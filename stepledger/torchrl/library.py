"""TorchRL's entry in the table of libraries (``stepledger.libraries``); it imports nothing of TorchRL."""

from stepledger.libraries import Library

LIBRARY = Library(
    name="torchrl",
    summary="TorchRL: ledger_env_fns puts LedgerEnv in the workers of ParallelEnv and SerialEnv; LedgerCollector "
            "records each batch a collector hands out",
    extra="torchrl",
    requires=("torchrl", "tensordict"),
    trainer="torchrl",
    trainer_help="TorchRL's Collector (LedgerCollector) on --torchrl-vector, --num-envs envs, random actions",
    check="stepledger.torchrl.check:check_from_cli",
    options=(
        ("--torchrl-vector", dict(choices=("serial", "parallel"), default="parallel",
                                  help="with --trainer torchrl: TorchRL's SerialEnv or ParallelEnv")),
        ("--torchrl-place", dict(choices=("worker", "batched"), default="worker",
                                 help="with --trainer torchrl: worker: the env-side faults in the worker, outside "
                                      "LedgerEnv, and the swaps between envs on the batched env (FaultyTransform); "
                                      "batched: every trainer-side fault on the batched env")),
    ),
)
