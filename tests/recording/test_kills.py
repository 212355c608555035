"""Real kills of real processes at seeded random moments: nothing recorded is lost, nothing else is read.

Each case runs tests/crash_harness.py (two CartPole envs under a real vector env, both ledgers in, spills every
0.05 s so that kills land in spills and merges too) in its own process group and kills it: SIGKILL to every
process during a step, during the close, a worker's segfault inside ``env.step`` (ctypes), and runs whose
spills never come (the mapped part holds everything). The events the test knows were recorded come from the
script's own lines on a pipe, outside the killed processes; every one of them must be read back, on the env side
and the trainer side, and what is read must be the first events of the same script run to its end (nothing
half-written, nothing of another). benchmarks/kill_soak.py runs the same cases by the hundred.
"""

import testpaths  # noqa: F401 (where the suite and the repository are: tests/testpaths.py)
import os
import signal
import time

import numpy as np
import pytest

import crash_harness as K

from stepledger import compare
from stepledger.report import parallel

HARNESSES = ["async-fork", "async-forkserver", "async-spawn", "sync", "subproc", "dummy"]
REFERENCE_STEPS = 2500


_REFERENCES = {}


def reference(harness, tmp_path_factory):
    """Both sides' streams of the script run to its end, once per harness."""
    if harness not in _REFERENCES:
        d = str(tmp_path_factory.mktemp("reference-" + harness))
        lines, err = K.finish(K.start(harness, "reference", d, REFERENCE_STEPS))
        assert lines and lines[-1].startswith("done"), err[-3000:]
        env, _ = K.streams(d)
        trainer, _ = K.streams(os.path.join(d, "trainer.npz"))
        _REFERENCES[harness] = env, trainer
    return _REFERENCES[harness]


def check(directory, harness, known, tmp_path_factory, monkeypatch=None):
    ref_env, ref_trainer = reference(harness, tmp_path_factory)
    env, env_meta = K.streams(directory)
    trainer, _ = K.streams(os.path.join(directory, "trainer.npz"))
    lost = K.check_prefix(env, ref_env, known)
    lost_t = K.check_prefix(trainer, ref_trainer, known)
    assert lost == {i: 0 for i in known} and lost_t == {i: 0 for i in known}, (lost, lost_t)
    # and compare finds no difference: the streams end apart only by the step in flight (a note, not a fault)
    report = compare(directory, os.path.join(directory, "trainer.npz"))
    assert report.ok, str(report)
    if monkeypatch is not None:
        # compare over worker processes gives the same report: a stream read in part from a mapped part is
        # in the parent's memory only (it raised AttributeError: '_MapPart' object has no attribute 'release')
        monkeypatch.setattr(parallel, "MIN_EVENTS_A_WORKER", 1)
        assert str(compare(directory, os.path.join(directory, "trainer.npz"), jobs=2)) == str(report)
    return env_meta


@pytest.mark.parametrize("harness", HARNESSES)
@pytest.mark.parametrize("when", ["step", "step-no-spill", "close"])
def test_sigkill_loses_nothing(tmp_path, tmp_path_factory, harness, when):
    rng = np.random.default_rng([HARNESSES.index(harness), ["step", "step-no-spill", "close"].index(when)])
    d = str(tmp_path)
    target = int(rng.integers(20, 1200))
    if when == "close":
        proc = K.start(harness, "close", d, target)
        lines = []
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("closing"):
                time.sleep(float(rng.uniform(0, 0.05)))  # somewhere in the close: the final file, the removals
                os.killpg(proc.pid, signal.SIGKILL)
                break
    else:
        proc = K.start(harness, "run", d, 0, flush=1000.0 if when == "step-no-spill" else 0.05)
        lines = K.kill_at(proc, target, rng)
    rest, err = K.finish(proc)
    known = K.known_counts(lines + rest)
    assert known, err[-3000:]
    check(d, harness, known, tmp_path_factory)


@pytest.mark.parametrize("harness", ["async-fork", "subproc", "sync"])
def test_segfault_in_env_step_loses_nothing(tmp_path, tmp_path_factory, harness, monkeypatch):
    d = str(tmp_path)
    at = int(np.random.default_rng(7 + len(harness)).integers(30, 600))
    proc = K.start(harness, "segv", d, at)
    lines, err = K.finish(proc, timeout=20)
    known = K.known_counts(lines)
    assert known, err[-3000:]
    check(d, harness, known, tmp_path_factory, monkeypatch)
    env, _ = K.streams(d)
    # env 1 died in its step number ``at``: every event before it is there, and that step's is not
    steps = int(np.sum(env[1]["kind"] == 1))
    assert steps == at - 1, (steps, at)
    # and compare says where, with the action it had taken (CartPole's: 0 or 1)
    report = compare(d, os.path.join(d, "trainer.npz"))
    episode, step = int(env[1]["episode"][-1]), int(env[1]["step"][-1]) + 1
    line = "env 1: its process died during step %d of episode %d (it had taken action " % (step, episode)
    assert any(n.startswith(line) and n.endswith("; the step never returned)") for n in report.notes), report.notes
