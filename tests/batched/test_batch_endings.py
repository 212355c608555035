"""Runs that end badly (docs/ENDINGS.md) with the env side of a batch: Ctrl-C, SIGTERM and SIGKILL of a real
training process whose CartPoleVectorEnv has LedgerBatchEnv innermost and LedgerVectorEnv outermost. Every
ledger reads and compare exits 0, with no difference."""

import os
import signal
import subprocess
import sys
import time

import pytest

from stepledger import compare, read

SCRIPT = r'''
import sys, time, gymnasium as gym, numpy as np
from stepledger import LedgerVectorEnv
from stepledger.gymnasium import LedgerBatchEnv
d = sys.argv[1]
envs = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="vector_entry_point", max_episode_steps=30)
envs = LedgerVectorEnv(LedgerBatchEnv(envs, d, flush_interval=0.3), d + "/trainer.npz", flush_interval=0.3)
envs.reset(seed=0)
rng = np.random.default_rng(0)
k = 0
while True:
    envs.step(rng.integers(0, 2, 4))
    k += 1
    if k == 300:
        print("ready", flush=True)
    if k >= 300:
        time.sleep(0.001)
'''

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _start(d):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, d], stdout=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    assert p.stdout.readline().strip() == "ready"
    return p


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["ctrl-c", "sigterm", "sigkill"])
def test_batch_run_ended_by_a_signal_compares_clean(tmp_path, sig):
    d = str(tmp_path)
    p = _start(d)
    time.sleep(1.0)  # several spill intervals
    os.killpg(p.pid, sig)
    p.wait(timeout=60)
    env_path = os.path.join(d, "env-0-3.npz")
    with read(env_path) as env, read(os.path.join(d, "trainer.npz")) as tr:
        assert sorted(env.streams) == [0, 1, 2, 3] and env.side == "env"
        assert all(len(s) > 250 for s in env.streams.values())
        assert env.partial == (sig == signal.SIGKILL) and tr.partial == (sig == signal.SIGKILL)
        assert env.meta["run"] == tr.meta["run"]
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, report.lines()
    cli = subprocess.run([sys.executable, "-m", "stepledger", "compare", d, os.path.join(d, "trainer.npz")],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO), timeout=120)
    assert cli.returncode == 0, cli.stdout + cli.stderr
