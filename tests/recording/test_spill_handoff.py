"""Periodic spills are written by the spiller thread, never on the step path (issue 12's overhead figure).

When a periodic spill is due, the recording call that notices hands it to the process's spiller thread
and returns: that thread writes copies of what no segment holds, and the recording thread's next call
lets go of those events (it drops them from the front of its buffers; what came since stays). Only a
process over its memory limit, a recording with kept values, or one with no spiller thread still
writes on the step path. What is checked here, with real vector envs and real files:

- no write happens on the stepping thread while it steps, and the spiller's writes happen;
- the events are let go of, so memory stays bounded by about an interval of events;
- nothing is lost or written twice: the closed ledgers equal ledgers recorded with no spill, and a
  process SIGKILLed in the middle of handed spills leaves segments that read as an exact prefix of them.
"""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import functools
import math
import os
import signal
import subprocess
import sys
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

import envs_for_tests as E
from stepledger import LedgerEnv, LedgerVectorEnv, read
from stepledger import core
from stepledger.recording import recording

TESTS_DIR = testpaths.TESTS_DIR
N_ENVS = 3
FILES = ["trainer.npz"] + ["env-%d.npz" % i for i in range(N_ENVS)]


def _build(directory, interval):
    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv(
        [functools.partial(lambda i: LedgerEnv(E.CountEnv(length=4 + i), directory, index=i,
                                               flush_interval=interval), i) for i in range(N_ENVS)]),
        os.path.join(directory, "trainer.npz"), flush_interval=interval)
    envs.reset(seed=0)
    return envs


def _actions(t):
    return np.array([(t + i) % 3 for i in range(N_ENVS)])


def _recordings(envs):
    return [envs.ledger.recording] + [env._recording for env in envs.env.envs]


def _columns(path):
    with read(path) as led:
        return {i: s.columns for i, s in led.streams.items()}, led.partial


def _reference(directory, steps):
    envs = _build(directory, math.inf)
    for t in range(steps):
        envs.step(_actions(t))
    envs.close()
    return {p: _columns(os.path.join(directory, p))[0] for p in FILES}


def test_periodic_spills_are_written_off_the_step_path_and_lose_or_repeat_nothing(tmp_path, monkeypatch):
    writes = []  # (thread, file) of each ledger file written
    real = recording.write_ledger

    def spy(path, *args, **kwargs):
        writes.append((threading.get_ident(), os.path.basename(os.path.dirname(path))))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(recording, "write_ledger", spy)
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns often: the spiller copies in the middle of steps
    limit = core.memory_limit()
    # no spill by memory, whatever else this process holds (recordings of earlier tests in this worker): those
    # are the step's own (test_memory_over_its_limit_still_spills_on_the_step_path)
    core.set_memory_limit(1 << 40)
    try:
        d = str(tmp_path / "handed")
        envs = _build(d, 0.01)
        recs = _recordings(envs)
        me = threading.get_ident()
        t, deadline = 0, time.monotonic() + 120
        # Step until every ledger has been spilled by the spiller and let go of by the steps a few times
        # (however busy the machine), and at least 2000 steps.
        while t < 2000 or any(rec.spills < 4 or rec._spilled_events == 0 for rec in recs):
            assert time.monotonic() < deadline, [(rec.spills, rec._spilled_events) for rec in recs]
            envs.step(_actions(t))
            t += 1
        on_step_path = [w for w in writes if w[0] == me]
        assert on_step_path == [], on_step_path
        assert len(writes) >= 4 * len(recs)
        for rec in recs:
            held = sum(len(b) for b in rec.buffers)
            assert held < rec.n_events(), (rec.path, held, rec.n_events())  # events were let go of
        envs.close()
    finally:
        sys.setswitchinterval(previous)
        core.set_memory_limit(limit)
    expected = _reference(str(tmp_path / "reference"), t)
    for p in FILES:
        got, partial = _columns(os.path.join(d, p))
        assert not partial
        assert sorted(got) == sorted(expected[p])
        for i, cols in got.items():
            for name, column in cols.items():
                assert np.array_equal(column, expected[p][i][name]), (p, i, name)


def test_memory_over_its_limit_still_spills_on_the_step_path(tmp_path, monkeypatch):
    # Past the memory limit memory must come back at once: that spill is the step's own, handed to nobody.
    writes = []
    real = recording.write_ledger

    def spy(path, *args, **kwargs):
        writes.append(threading.get_ident())
        return real(path, *args, **kwargs)

    monkeypatch.setattr(recording, "write_ledger", spy)
    limit = core.memory_limit()
    envs = _build(str(tmp_path), math.inf)  # no periodic spill at all
    try:
        core.set_memory_limit(2000)
        for t in range(200):
            envs.step(_actions(t))
    finally:
        core.set_memory_limit(limit)
    assert threading.get_ident() in writes
    assert all(rec.spills > 0 for rec in _recordings(envs))
    envs.close()


_KILLED = """
import functools, os, signal, sys
import gymnasium as gym, numpy as np
import envs_for_tests as E
from stepledger import LedgerEnv, LedgerVectorEnv
sys.setswitchinterval(1e-5)
d, n = sys.argv[1], int(sys.argv[2])
envs = LedgerVectorEnv(gym.vector.SyncVectorEnv(
    [functools.partial(lambda i: LedgerEnv(E.CountEnv(length=4 + i), d, index=i, flush_interval=0.01), i)
     for i in range(n)]), os.path.join(d, "trainer.npz"), flush_interval=0.01)
envs.reset(seed=0)
recs = [envs.ledger.recording] + [env._recording for env in envs.env.envs]
t = 0
while t < 1500 or any(rec.spills < 6 or rec._spilled_events == 0 for rec in recs):
    envs.step(np.array([(t + i) % 3 for i in range(n)]))
    t += 1
print("steps", t, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # in the middle of stepping: handed spills under way, events not let go of
"""


def test_killed_while_spills_are_handed_off_leaves_an_exact_prefix(tmp_path):
    d = str(tmp_path / "killed")
    os.makedirs(d)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", _KILLED, d, str(N_ENVS)], env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    steps = int(proc.stdout.split()[1])
    expected = _reference(str(tmp_path / "reference"), steps)
    for p in FILES:
        got, partial = _columns(os.path.join(d, p))
        assert partial
        for i, cols in got.items():
            n = len(cols["kind"])
            full = expected[p][i]
            assert 0 < n <= len(full["kind"]), (p, i, n)
            for name, column in cols.items():
                assert np.array_equal(column, full[name][:n]), (p, i, name)  # no gap, nothing twice


@pytest.mark.parametrize("k", [0, 1, 17, 40])
def test_drop_front_is_the_same_in_both_cores(k):
    from stepledger import _core as C
    from stepledger import _fallback as F
    seen = []
    for impl in (C, F):
        buf = impl.StreamBuffer(16)  # grows on the way: the events moved are those of a grown buffer
        for i in range(40):
            buf.append(i % 2, 3 * i, 3 * i + 1, 3 * i + 2, i % 3 == 0, i % 5 == 0)
        used = impl.memory_in_use()
        buf.drop_front(k)
        assert used - impl.memory_in_use() == k * 27 == k * recording.S.BYTES_PER_EVENT
        buf.append(1, 7, 8, 9, False, True)  # and it goes on recording after them
        seen.append(buf.columns())
        held = len(buf)
        with pytest.raises(ValueError, match="%d events asked, %d held" % (held + 1, held)):
            buf.drop_front(held + 1)
        buf.release()
    for name in seen[0]:
        assert np.array_equal(seen[0][name], seen[1][name]), name
    assert list(seen[0]["h_obs"]) == [3 * i for i in range(k, 40)] + [7]
