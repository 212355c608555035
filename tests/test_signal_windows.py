"""SIGTERM that lands while the process is inside stepledger's own bookkeeping.

Python runs a signal handler in the main thread between two bytecodes, so it can
land while that thread holds one of stepledger's locks: the registry of open
recordings (taken when a LedgerEnv is built or closed) or a recording's own lock
(taken by a spill, a flush or a close). The handler then writes and closes every
ledger, taking those locks again. A lock that the same thread cannot take twice
would hang the process forever, with no ledger written. Each test sends a real
SIGTERM to a real process at that moment and asserts that the process ends by
the signal, in time, with its ledger written.
"""

import os
import signal
import subprocess
import sys

import pytest

from stepledger import _schema as S
from stepledger import read

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

SCRIPT = """
import os, signal, sys, time
import envs_for_tests as E
from stepledger import LedgerEnv, recording
env = LedgerEnv(E.CountEnv(length=4), sys.argv[1], index=0)
env.reset()
for _ in range(9):
    env.step(0)
lock = {"registry": recording._LOCK, "recording": env._recording._lock}[sys.argv[2]]
with lock:  # as when the signal lands while a LedgerEnv is built, or a spill has begun
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
print("the signal was not acted on")
"""


@pytest.mark.parametrize("held", ["registry", "recording"])
def test_sigterm_while_a_lock_is_held_writes_the_ledger_and_ends_the_process(tmp_path, held):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), held], capture_output=True, text=True,
                              env=env, timeout=25)
    except subprocess.TimeoutExpired:
        pytest.fail("the process hung on SIGTERM with stepledger's %s lock held" % held)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    with read(str(tmp_path / "env-0.npz")) as led:
        assert not led.partial and led.meta[S.META_STATE] == S.STATE_SIGNAL
        assert len(led.streams[0]) == 10
