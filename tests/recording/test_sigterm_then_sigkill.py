"""A process that handles SIGTERM itself, and is SIGKILLed after it (Ray ends its actors so).

stepledger's SIGTERM handler writes every ledger of the process (state "signal") and hands the
signal to the program's own handler, which may go on; nothing is closed, so the spill directory
and the lock stay next to each final file. If a SIGKILL follows, they are left there. This test
sends those signals to a real process and checks that no event is lost, that compare finds no
difference and says only how the run ended, and that the next run into the directory removes them.
"""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import os
import signal
import subprocess
import sys

import pytest

import ending_harness as H

from stepledger.format import schema as S
from stepledger import compare, read
from stepledger.format.ledgerfile import LedgerFile

TESTS_DIR = testpaths.TESTS_DIR
TIMEOUT = 60
LEDGERS = ("env-0.npz", "env-1.npz", "trainer.npz")

SCRIPT = r"""
import signal
# blocked first, before any thread starts (numpy's OpenBLAS threads at its import, stepledger's spiller thread),
# each of which inherits the mask: a SIGTERM is then taken by the main thread only, between two steps (one taken
# by another thread would run Python's handler in the main thread at its next bytecode, in a step)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
import functools, os, sys, time
import gymnasium as gym, numpy as np
from stepledger import LedgerEnv, LedgerVectorEnv
directory, after, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
got = []
in_step = False
if after != "close":
    signal.signal(signal.SIGTERM, lambda signum, frame: got.append(in_step))  # the program's own: it goes on
def make(i):
    return LedgerEnv(gym.make("CartPole-v1"), directory, index=i, flush_interval=0.05)
envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([functools.partial(make, i) for i in range(2)]),
                       os.path.join(directory, "trainer.npz"), flush_interval=0.05)
envs.reset(seed=0)
t = 0
def step():
    # a SIGTERM is acted on between two steps (a SIGTERM in the middle of one is test_signal_windows.py's)
    global t, in_step
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    in_step = True
    envs.step(np.array([t % 2, (t // 3) % 2]))
    in_step = False
    t += 1
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
while t < steps or (after != "close" and not got):
    step()
    if t == steps:
        print("ready", flush=True)
    if t >= steps:
        time.sleep(0.0005)
if after == "close":
    envs.close()
    sys.exit(0)
print("got", t, int(got[0]), flush=True)  # 1: stepledger acted on it in a step (see the test)
while after == "goes-on" and not os.path.exists(directory + ".go"):  # the test has looked at the files
    time.sleep(0.01)
while after == "goes-on":  # records on after its SIGTERM: spills past what the SIGTERM wrote
    step()
    time.sleep(0.0005)
time.sleep(600)  # stops recording: the SIGKILL finds it idle
"""


def _environ():
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, env.get("PYTHONPATH")) if p)
    return env


def _run(directory, after, steps):
    return subprocess.Popen([sys.executable, "-c", SCRIPT, directory, after, str(steps)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_environ(), start_new_session=True)


def _segments(directory, name):
    spill = os.path.join(directory, name + ".spill")
    return [n for n in os.listdir(spill) if n.startswith("seg-")] if os.path.isdir(spill) else []


def _states(directory):
    """{ledger: state} of the final files written so far (each file's own, whatever segments follow it)."""
    out = {}
    for name in LEDGERS:
        try:
            lf = LedgerFile(os.path.join(directory, name))
        except Exception:
            continue
        out[name] = lf.meta.get(S.META_STATE)
        lf.close()
    return out


def _lengths(directory):
    """{ledger: (events of each stream, read from segments)} as a reader finds them now."""
    out = {}
    for name in LEDGERS:
        with read(os.path.join(directory, name)) as led:
            out[name] = ({i: len(s) for i, s in led.streams.items()}, led.partial)
    return out


@pytest.mark.parametrize("after", ["stops", "goes-on"])
def test_a_sigterm_written_ledger_then_sigkill_loses_nothing_and_the_next_run_cleans_up(tmp_path, after):
    d = str(tmp_path)
    proc = _run(d, after, 200)
    try:
        assert proc.stdout.readline().startswith("ready"), proc.stderr.read()[-3000:]
        # spilled: every ledger has segments before the SIGTERM (a busy machine takes its time)
        H.wait_for(lambda: all(_segments(d, n) for n in LEDGERS), TIMEOUT)
        proc.send_signal(signal.SIGTERM)
        line = proc.stdout.readline()
        assert line.startswith("got"), proc.stderr.read()[-3000:]
        stepped, mid = int(line.split()[1]), line.split()[2] == "1"
        # A SIGTERM that comes while the spiller thread writes waits for the end of a write; if the main thread
        # began one meanwhile (in a step), stepledger acts at its end, in that step: the rest of the step is
        # recorded after the files it wrote (the program's handler goes on), in the next spill and mapped part
        assert _states(d) == {n: S.STATE_SIGNAL for n in LEDGERS}  # written before the program's handler ran
        signalled = _lengths(d)
        if not mid:
            assert not any(partial for _, partial in signalled.values()), signalled
        assert all(n >= stepped for streams, _ in signalled.values() for n in streams.values()), (stepped, signalled)
        if after == "goes-on":  # until the segments hold more than the files the SIGTERM wrote
            open(d + ".go", "w").close()
            H.wait_for(lambda: all(partial for _, partial in _lengths(d).values()), TIMEOUT)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(TIMEOUT)
    finally:
        H.reap(proc)

    for name in LEDGERS:  # what SIGTERM left, and SIGKILL did not let go: each final file's segments and lock
        assert os.path.isfile(os.path.join(d, name + S.LOCK_SUFFIX)), os.listdir(d)
        assert _segments(d, name), name
    # (a) no event lost: each ledger reads as at least what the SIGTERM wrote, and both sides alike
    final = _lengths(d)
    for name in LEDGERS:
        streams, partial = final[name]
        assert partial is (after == "goes-on") or mid, (name, partial)
        for i, n in streams.items():
            assert n >= signalled[name][0][i], (name, i, n, signalled[name])
    envs = {**final["env-0.npz"][0], **final["env-1.npz"][0]}
    trainer = final["trainer.npz"][0]
    assert sorted(envs) == sorted(trainer) == [0, 1]
    # all of it, up to the one step in flight: in the files the SIGTERM wrote, or (going on) in the segments and
    # mapped parts the SIGKILL left
    assert all(abs(envs[i] - trainer[i]) <= 2 for i in (0, 1)), (envs, trainer)
    # (b) compare: no difference, and its notes say how the run ended, nothing else
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, str(report)
    # going on, each ledger's events after its last spill are read from its mapped part, and the note says how
    # many: the env files share a note only when their counts agree
    ended = ("written when its process got SIGTERM" if after == "stops" and not mid
             else "its process died, and every event it recorded is read")
    endings = [n for n in report.notes if not n.startswith("env ")]  # the trainer file's, the env files'
    assert len(endings) in ((2,) if after == "stops" and not mid else (2, 3)) and \
        all(ended in n or mid and "written when its process got SIGTERM" in n for n in endings), report.notes
    assert all(sum(name in n for n in endings) == 1 for name in LEDGERS), report.notes
    # going on, the two sides' last spills before the SIGKILL were at other points: said, as for any SIGKILL
    ends = [n for n in report.notes if n.startswith("env ")]
    # going on, the SIGKILL may find a step under way: the env it was in says so, as a crash does
    died = [n for n in ends if n.startswith(("env 0: its process died during step ", "env 1: its process died "
                                             "during step ")) and n.endswith("; the step never returned)")]
    assert died == [] or after == "goes-on", died
    ends = [n for n in ends if n not in died]
    assert all(n.startswith("env %d: records end at different points" % i) and n.endswith("events both sides "
               "have agree") for i, n in enumerate(ends)), ends
    assert ends == [] or after == "goes-on" or mid, ends
    assert str(report).splitlines()[0] == "0 of 2 envs differ"
    # stepledger show: one line for a ledger's spill directory, with its count of segments, not one a segment
    shown = subprocess.run([sys.executable, "-m", "stepledger", "show", os.path.join(d, "env-0.npz")],
                           capture_output=True, text=True, timeout=TIMEOUT, env=_environ())
    assert shown.returncode == 0, shown.stderr
    n = len([seg for seg in _segments(d, "env-0.npz") if S.TMP_INFIX not in seg])  # a SIGKILL may cut a spill short
    what = ("1 spill segment next to the final file env-0.npz: read in its place only if it is of a later "
            "recording or holds more" if n == 1 else "%d spill segments next to the final file env-0.npz: read in "
            "its place only if they are of a later recording or hold more" % n)
    spill_lines = [line for line in shown.stdout.splitlines() if ".spill" in line and S.TMP_INFIX not in line]
    assert spill_lines == ["  not a ledger: env-0.npz.spill/ (%s)" % what], shown.stdout

    # (c) the next run into the directory (a short one, closed, that never spills) removes what was left
    proc = _run(d, "close", 20)
    try:
        assert proc.wait(TIMEOUT) == 0, proc.stderr.read()[-3000:]
    finally:
        H.reap(proc)
    assert sorted(os.listdir(d)) == sorted(LEDGERS)
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok and report.notes == [], str(report)
    assert {name: streams for name, (streams, _) in _lengths(d).items()} == \
        {"env-0.npz": {0: 21}, "env-1.npz": {1: 21}, "trainer.npz": {0: 21, 1: 21}}
