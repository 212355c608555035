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


def reference(harness, tmp_path_factory, keep_values=False):
    """Both sides' streams of the script run to its end, once per harness (with keep_values: and their kept
    values, {side: {env: {member: array}}})."""
    key = harness, keep_values
    if key not in _REFERENCES:
        d = str(tmp_path_factory.mktemp("reference-" + harness))
        lines, err = K.finish(K.start(harness, "reference", d, REFERENCE_STEPS, keep_values=keep_values))
        assert lines and lines[-1].startswith("done"), err[-3000:]
        env, _ = K.streams(d)
        trainer, _ = K.streams(os.path.join(d, "trainer.npz"))
        _REFERENCES[key] = env, trainer
        if keep_values:
            _REFERENCES[key] += ({"env": K.kept_values(d), "trainer": K.kept_values(os.path.join(d, "trainer.npz"))},)
    return _REFERENCES[key]


def check(directory, harness, known, tmp_path_factory, monkeypatch=None):
    ref_env, ref_trainer = reference(harness, tmp_path_factory)[:2]
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
    if when == "step-no-spill":
        assert not _segments(d), _segments(d)  # every event read is from a mapped part
    check(d, harness, known, tmp_path_factory)


def _segments(directory):
    return sorted(os.path.relpath(os.path.join(root, name), directory) for root, _, names in os.walk(directory)
                  for name in names if name.startswith("seg-"))


@pytest.mark.parametrize("harness", ["async-fork", "subproc", "sync"])
@pytest.mark.parametrize("when", ["step", "step-no-spill"])
def test_sigkill_with_kept_values_loses_no_event(tmp_path, tmp_path_factory, harness, when):
    """keep_values=True on both sides: every event is read back all the same (the mapped part holds its events,
    not their values); the kept values read are those of the events in spills, each the one the run to its end
    kept, and compare, clean, says of each ledger read from its mapped part that the rest's values are not kept."""
    rng = np.random.default_rng([7, HARNESSES.index(harness), when == "step"])
    d = str(tmp_path)
    proc = K.start(harness, "run", d, 0, flush=1000.0 if when == "step-no-spill" else 0.05, keep_values=True)
    lines = K.kill_at(proc, int(rng.integers(20, 1200)), rng)
    rest, err = K.finish(proc)
    known = K.known_counts(lines + rest)
    assert known, err[-3000:]
    assert bool(_segments(d)) == (when == "step"), _segments(d)
    ref_env, ref_trainer, ref_values = reference(harness, tmp_path_factory, keep_values=True)
    for side, path, ref in (("env", d, ref_env), ("trainer", os.path.join(d, "trainer.npz"), ref_trainer)):
        got, _ = K.streams(path)
        assert K.check_prefix(got, ref, known) == {i: 0 for i in known}, side
        for i, members in K.kept_values(path).items():
            kept = len(members.get("values_obs_0", ()))  # no member at all where no file holds any
            assert kept <= len(got[i]["kind"]), (side, i)
            if when == "step-no-spill":
                assert kept == 0, (side, i, kept)  # no spill came: every event is from the mapped part
            for name, arr in members.items():
                assert np.array_equal(arr, ref_values[side][i][name][:kept]), (side, i, name)
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, str(report)
    died = [n for n in report.notes if "from its mapped part" in n]
    assert died and all("from its mapped part), but not their kept values (a mapped part holds digests only: "
                        "values up to its last spill)" in n for n in died), report.notes


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
