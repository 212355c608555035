"""A TorchRL collection loop that ends in a chosen way, run in its own process group by test_torchrl.py.

    python -c "import trl_harness as H; H.main(VECTOR, ENDING, DIRECTORY)"

VECTOR: serial, parallel. ENDING: close (collects, then shutdown()), wait (collects until a signal from outside
ends it: Ctrl-C to the group, SIGKILL to a worker). It prints ``ready PID...`` (ParallelEnv's worker pids) once
the env ledgers have spilled, so that the test knows when to act.
"""

import sys
import time

from stepledger import LedgerError, read
from stepledger.torchrl import LedgerCollector, ledger_env_fns

import trl_envs

FLUSH_INTERVAL = 0.3


def main(vector, ending, directory):
    fns = ledger_env_fns(trl_envs.Make(limit=30), 2, directory, flush_interval=FLUSH_INTERVAL)
    env = trl_envs.batched(vector, fns)
    c = LedgerCollector(trl_envs.collector("single", env, 20, -1), directory + "/trainer.npz", fns,
                        flush_interval=FLUSH_INTERVAL)
    pids = [str(p.pid) for p in getattr(env, "_workers", ())]
    told, started = False, time.monotonic()
    for _ in c:
        if ending == "close" and time.monotonic() - started > 1.0:
            c.shutdown()
            return
        if not told and time.monotonic() - started > 1.0 and _spilled(directory):
            print("ready", *pids, flush=True)
            told = True
        if time.monotonic() - started > 120:
            sys.exit("no signal came")


def _spilled(directory):
    try:
        with read(directory) as led:
            return len(led.streams) == 2 and all(len(s) for s in led.streams.values())
    except (LedgerError, OSError):
        return False
