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

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import os
import signal
import subprocess
import sys

import pytest

from stepledger.format import schema as S
from stepledger import read

TESTS_DIR = testpaths.TESTS_DIR

SCRIPT = """
import os, signal, sys, time
import envs_for_tests as E
from stepledger import LedgerEnv
from stepledger.recording import spiller
env = LedgerEnv(E.CountEnv(length=4), sys.argv[1], index=0)
env.reset()
for _ in range(9):
    env.step(0)
lock = {"registry": spiller.LOCK, "recording": env._recording._lock}[sys.argv[2]]
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


# ---------------------------------------------------------------- Ctrl-C inside a write

def _ctrl_c_right_after(rec, name):
    """Send this process a real SIGINT right after ``rec.name`` returns (inside the write that called it)."""
    original = getattr(rec, name)

    def then_ctrl_c(*args, **kwargs):
        result = original(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return result

    setattr(rec, name, then_ctrl_c)
    return lambda: delattr(rec, name)


def test_a_ctrl_c_between_writing_a_segment_and_letting_go_of_its_events_waits_for_the_write(tmp_path):
    """A Ctrl-C whose KeyboardInterrupt came after a spill wrote its segment and before the buffers let go
    of those events left them both in the segment and in memory: the final file then held them twice
    (the trainer's stream longer than the env's, a false alarm). It is raised once the write is done."""
    import functools
    import gymnasium as gym
    import numpy as np
    import envs_for_tests as E
    from stepledger import LedgerEnv, LedgerVectorEnv, compare, read
    d = str(tmp_path)
    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv(
        [functools.partial(lambda i: LedgerEnv(E.CountEnv(length=4), d, index=i), i) for i in range(3)]),
        os.path.join(d, "trainer.npz"))
    envs.reset(seed=0)
    for _ in range(10):
        envs.step(np.zeros(3, np.int64))
    rec = envs.ledger.recording
    undo = _ctrl_c_right_after(rec, "_write_spill")
    try:
        with pytest.raises(KeyboardInterrupt):
            envs.flush()
    finally:
        undo()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    for _ in range(5):
        envs.step(np.zeros(3, np.int64))
    envs.close()
    with read(os.path.join(d, "trainer.npz")) as led:
        assert {i: len(s) for i, s in led.streams.items()} == {0: 16, 1: 16, 2: 16}  # 1 reset + 15 steps
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok and report.notes == [], str(report)


def test_a_ctrl_c_inside_a_write_is_raised_after_it_and_only_in_the_main_thread():
    from stepledger.recording import hooks
    with pytest.raises(KeyboardInterrupt):
        with hooks.writing():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the interpreter looks at its signals on the way round
                pass
            inside = "finished"
    assert inside == "finished" and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # a handler of the program's own is called with it, once the write is done
    got = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        with hooks.writing():
            with hooks.writing():  # nested: held once, let through once
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):
                    pass
            assert got == []
        assert got == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)
    # another thread's write sets nothing aside: only the main thread gets KeyboardInterrupt
    import threading
    seen = []
    t = threading.Thread(target=lambda: seen.append(hooks._hold_sigint()))
    t.start()
    t.join()
    assert seen == [False] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


# ---------------------------------------------------------------- SIGTERM during another thread's write

SCRIPT_OTHER_THREAD = """
import os, signal, sys, threading, time
import envs_for_tests as E
from stepledger import LedgerEnv
from stepledger.recording import hooks
got, events = [], [0]
# the program's own handler (it goes on): the one stepledger hands the signal to once its ledgers are written
signal.signal(signal.SIGTERM, lambda signum, frame: got.append((threading.current_thread().name, events[0])))
env = LedgerEnv(E.CountEnv(length=1000), sys.argv[1], index=0)
env.reset()
events[0] += 1
entered, leave = threading.Event(), threading.Event()
def write():  # as the idle spiller writes a segment
    with hooks.writing():
        entered.set()
        leave.wait()
writer = threading.Thread(target=write, name="writer")
writer.start()
entered.wait()
os.kill(os.getpid(), signal.SIGTERM)  # lands during the other thread's write: acted on once it is done
for _ in range(5):
    env.step(0)
    events[0] += 1
leave.set()
writer.join()
deadline = time.monotonic() + 20
while not got and time.monotonic() < deadline:
    env.step(0)
    events[0] += 1
print(got, flush=True)
os._exit(0)  # no close(): the file is the one the SIGTERM wrote
"""


def test_a_sigterm_during_another_threads_write_is_acted_on_in_the_main_thread(tmp_path):
    # The thread whose write held the signal back hands it to the main thread: the program's handler runs there
    # (as Python runs handlers), and the ledger the SIGTERM wrote holds every event recorded until it ran.
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", SCRIPT_OTHER_THREAD, str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (thread, recorded), = eval(proc.stdout)
    assert thread == "MainThread", proc.stdout
    with read(str(tmp_path / "env-0.npz")) as led:
        assert not led.partial and led.meta[S.META_STATE] == S.STATE_SIGNAL
        assert len(led.streams[0]) == recorded >= 6
