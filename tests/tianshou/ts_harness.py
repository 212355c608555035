"""A Tianshou training loop that ends in a chosen way, run in its own process group by test_tianshou.py.

    python -c "import ts_harness as H; H.main(VECTOR, ENDING, DIRECTORY)"

VECTOR: dummy, subproc, shmem. ENDING: close (collects, then close()), wait (collects until a signal from
outside ends it: Ctrl-C to the group, SIGKILL to a worker). It prints ``ready PID...`` (the worker pids) once
the env ledgers have spilled, so that the test knows when to act.
"""

import os
import sys
import time

import gymnasium as gym

from stepledger import read, LedgerError
from stepledger.tianshou import ledger_env_fns

import ts_envs

FLUSH_INTERVAL = 0.3


def make_env():
    return gym.make("Pendulum-v1", max_episode_steps=30)


def main(vector, ending, directory):
    venv = ts_envs.vector_env(vector, ledger_env_fns(make_env, 2, directory, flush_interval=FLUSH_INTERVAL))
    collector = ts_envs.random_collector(venv, directory, flush_interval=FLUSH_INTERVAL)
    collector.reset()
    pids = [str(w.process.pid) for w in venv.workers if hasattr(w, "process")]
    told = False
    started = time.monotonic()
    while True:
        collector.collect(n_step=20)
        if ending == "close" and time.monotonic() - started > 1.0:
            collector.close()
            return
        if not told and time.monotonic() - started > 1.0 and _spilled(directory):
            print("ready", *pids, flush=True)
            told = True
        if time.monotonic() - started > 60:
            sys.exit("no signal came")


def _spilled(directory):
    try:
        with read(directory) as led:
            return len(led.streams) == 2 and all(len(s) for s in led.streams.values())
    except (LedgerError, OSError):
        return False
