"""One env's trainer stream in slices across several trainer files (each learner of several records the slices
of episodes it is given: RLlib's learners with num_learners > 1), stitched by compare by their offsets.

The env side is real ``LedgerEnv``s around CartPole; each learner is a ``TrainerLedger`` that gives the offset
of each slice (``set_fragments``) before its events. Slices that tile the env's stream compare clean; a gap
is a line naming the env, its events and the files, and the difference it makes is reported at its event; an
overlap is the difference, at its first event, naming its events and the files (the stitched stream holds them
once); a learner killed (SIGKILL) before its final file ends the env's stream at the gap it leaves.
"""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import os
import signal
import subprocess
import sys
import threading

import gymnasium as gym
import numpy as np
import pytest

from stepledger import LedgerEnv, LedgerError, TrainerLedger, compare
from stepledger.format import schema as S
from stepledger.recording.recording import Recording
from stepledger.format.spaces import LeafLayout

TESTS_DIR = testpaths.TESTS_DIR
ROOT = os.path.dirname(TESTS_DIR)
ENVS = 2
TIMEOUT = 120


def play(directory, episodes=3, steps=25):
    """Real CartPole episodes through LedgerEnv(index=i), i < ENVS: per env a list of episodes, each a dict of
    obs (m + 1), actions, rewards, terminated, truncated (m each)."""
    out = {}
    for i in range(ENVS):
        env = LedgerEnv(gym.make("CartPole-v1"), directory, index=i)
        env.action_space.seed(i)
        eps = []
        for k in range(episodes):
            obs, _ = env.reset(seed=100 * i + k)
            ep = {"obs": [obs], "actions": [], "rewards": [], "terminated": [], "truncated": []}
            for _ in range(steps):
                a = env.action_space.sample()
                obs, r, te, tr, _ = env.step(a)
                for key, v in (("obs", obs), ("actions", a), ("rewards", r), ("terminated", te), ("truncated", tr)):
                    ep[key].append(v)
                if te or tr:
                    break
            eps.append({key: np.asarray(v) for key, v in ep.items()})
        env.close()
        out[i] = eps
    return out


def slices_of(data, cut=7):
    """(env, episode, t0, t1) slices: each episode cut at step ``cut``, as RLlib's sharding slices one."""
    out = []
    for i, eps in data.items():
        for k, ep in enumerate(eps):
            m = len(ep["actions"])
            out += [(i, k, 0, min(cut, m))] + ([(i, k, cut, m)] if m > cut else [])
    return out


def base_offsets(data):
    """The offset of each episode's reset in its env's whole stream: a reset, then its steps."""
    out = {}
    for i, eps in data.items():
        at = 0
        for k, ep in enumerate(eps):
            out[i, k] = at
            at += 1 + len(ep["actions"])
    return out


class Learner:
    """One learner's trainer file: the slices it was given, each offset given before its events."""

    def __init__(self, path, flush_interval=None):
        self.ledger = TrainerLedger(path, ENVS, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                                    gym.spaces.Discrete(2), flush_interval=flush_interval)
        self.fragments, self.rows, self.end = {}, {}, {}

    def record(self, data, bases, sl):
        i, k, t0, t1 = sl
        ep = data[i][k]
        offset = bases[i, k] + (0 if t0 == 0 else 1 + t0)
        if self.end.get(i) != offset:
            self.fragments.setdefault(i, []).append((offset, self.rows.get(i, 0)))
            self.ledger.set_fragments(self.fragments)
        if t0 == 0:
            self.ledger.env_reset(i, ep["obs"][0])
        self.ledger.env_steps(i, ep["actions"][t0:t1], ep["obs"][t0 + 1:t1 + 1], ep["rewards"][t0:t1],
                              ep["terminated"][t0:t1], ep["truncated"][t0:t1])
        n = (1 if t0 == 0 else 0) + t1 - t0
        self.rows[i] = self.rows.get(i, 0) + n
        self.end[i] = offset + n


def learners(directory, data, assign):
    """Two learners' files; ``assign(n, slice)`` gives the learners (a list) that get the n-th slice."""
    bases = base_offsets(data)
    files = [os.path.join(directory, "trainer-learner-%d.npz" % j) for j in (0, 1)]
    ls = [Learner(p) for p in files]
    for n, sl in enumerate(slices_of(data)):
        for j in assign(n, sl):
            ls[j].record(data, bases, sl)
    for learner in ls:
        learner.ledger.close()
    return files


def test_slices_of_one_env_in_two_learners_files_stitch_and_compare_clean(tmp_path):
    d = str(tmp_path)
    data = play(d)
    # an episode's first slice to one learner, the rest to the other
    files = learners(d, data, lambda n, sl: [0] if sl[2] == 0 else [1])
    report = compare(d, files)
    assert report.ok and report.envs == [0, 1] and report.notes == [], str(report)
    assert report.trainer_files == ["trainer-learner-0.npz", "trainer-learner-1.npz"]
    # a glob or the directory finds them too; the cli says so
    assert compare(d, os.path.join(d, "trainer-learner-*.npz")).ok and compare(d, d).ok
    from stepledger.cli.main import main
    assert main(["compare", d, d]) == 0


def test_a_gap_between_slices_is_named_with_its_files_and_found_at_its_event(tmp_path):
    d = str(tmp_path)
    data = play(d)
    dropped = (1, 1, 7, len(data[1][1]["actions"]))  # env 1, episode 1, steps 7 on: given to no learner
    files = learners(d, data, lambda n, sl: [] if sl == dropped else [0] if sl[2] == 0 else [1])
    report = compare(d, files)
    assert not report.ok and [x.env for x in report.differences] == [1], str(report)
    first = base_offsets(data)[1, 1] + 8
    last = first + len(data[1][1]["actions"]) - 7 - 1
    gap = [n for n in report.notes if n.startswith("env 1: its events %d to %d are in no trainer file" % (first, last))]
    assert gap and "the slice before them is in trainer-learner-0.npz" in gap[0], report.notes
    diff = report.differences[0]
    assert (diff.episode, diff.step) == (1, 8), str(report)  # the first event the learners never got: step 8


def test_an_overlap_between_slices_is_named_and_found_at_its_event(tmp_path):
    d = str(tmp_path)
    data = play(d)
    twice = (0, 2, 0, 7)  # env 0, episode 2's first slice: given to both learners
    files = learners(d, data, lambda n, sl: [0, 1] if sl == twice else [0] if sl[2] == 0 else [1])
    report = compare(d, files)
    assert [x.env for x in report.differences] == [0], str(report)
    diff, b = report.differences[0], base_offsets(data)[0, 2]
    # at the first event both files hold (the episode's reset), naming the events and both files
    assert (diff.what, diff.event, diff.episode, diff.step) == ("overlap", b, 2, 0), str(report)
    assert diff.line() == ("env 0, episode 2, step 0: its events %d to %d are in two trainer files "
                           "(trainer-learner-1.npz and trainer-learner-0.npz): a learner got them twice" % (b, b + 7))
    assert diff.line() in str(report).splitlines() and report.notes == [], str(report)
    # the stitched stream holds those events once: in step with the env's, the same length
    assert diff.trainer_events == diff.env_events == sum(1 + len(ep["actions"]) for ep in data[0]), str(report)
    out = diff.to_dict()
    assert (out["type"], out["event"], out["episode"], out["step"], out["events"], out["files"]) == \
        ("overlap", b, 2, 0, [b, b + 7], ["trainer-learner-1.npz", "trainer-learner-0.npz"]), out
    from stepledger.cli.main import main
    assert main(["compare", d] + files) == 1


def test_an_overlap_after_an_earlier_difference_is_a_line_of_its_own(tmp_path):
    d = str(tmp_path)
    data = play(d)
    data[0][1]["rewards"][3] = 0.5  # the trainer got another reward at env 0, episode 1, step 4
    twice = (0, 2, 0, 7)
    files = learners(d, data, lambda n, sl: [0, 1] if sl == twice else [0] if sl[2] == 0 else [1])
    report = compare(d, files)
    diff, b = report.differences[0], base_offsets(data)[0, 2]
    assert (diff.env, diff.what, diff.episode, diff.step, diff.fields) == (0, "fields", 1, 4, ("reward",)), str(report)
    assert report.notes == ["env 0: its events %d to %d are in two trainer files (trainer-learner-1.npz and "
                            "trainer-learner-0.npz): a learner got them twice" % (b, b + 7)], report.notes


def test_without_offsets_an_env_in_two_files_is_still_refused(tmp_path):
    d = str(tmp_path)
    data = play(d)
    files = learners(d, data, lambda n, sl: [0] if sl[2] == 0 else [1])
    plain = os.path.join(d, "trainer-plain.npz")
    led = TrainerLedger(plain, ENVS, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2))
    ep = data[0][0]
    led.env_reset(0, ep["obs"][0])
    led.close()
    with pytest.raises(LedgerError, match=r"env 0 appears in more than one trainer file"):
        compare(d, files + [plain])


def test_damaged_offsets_are_refused_with_one_line(tmp_path):
    d = str(tmp_path)
    play(d, episodes=1)
    path = os.path.join(d, "trainer-learner-0.npz")
    rec = Recording(path, "trainer", range(ENVS), LeafLayout(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)),
                    LeafLayout(gym.spaces.Discrete(2)), np.float32, False,
                    {S.META_FRAGMENTS: {"0": [[5, 3], [0, 1]]}})
    from stepledger import core
    rec.buffers[0].append(S.KIND_RESET, 1, 0, core.reward_bits(0.0, True), False, False)
    rec.close()
    with pytest.raises(LedgerError, match=r"^trainer-learner-0.npz: the fragments of env 0 in its meta are damaged"):
        compare(d, path)


CHILD = """
import math, sys, time, numpy as np
sys.path[:0] = [%(tests)r, %(here)r]
import test_trainer_slices as t
# its recording begins now, as the run's do; it spills when it flushes, not by time (a busy machine may take
# longer than the default interval to reach the kill, and the idle spiller would write what it must lose)
learner = t.Learner(%(path)r, flush_interval=math.inf)
print('ready', flush=True)
sys.stdin.readline()
data = {i: [dict(np.load(%(data)r + '-%%d-%%d.npz' %% (i, k))) for k in range(3)] for i in range(t.ENVS)}
bases = t.base_offsets(data)
rest = [sl for sl in t.slices_of(data) if sl[2] != 0]
for sl in rest:
    if sl[1] == 0:
        learner.record(data, bases, sl)
learner.ledger.flush()
for sl in rest:  # recorded, never written: the process is killed before its next spill
    if sl[1] > 0:
        learner.record(data, bases, sl)
print('flushed', flush=True)
time.sleep(120)
"""


def test_a_learner_killed_before_its_final_file_loses_no_slice(tmp_path):
    d = str(tmp_path)
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    code = CHILD % {"tests": TESTS_DIR, "here": os.path.dirname(os.path.abspath(__file__)), "data": str(tmp_path / "data"),
                    "path": os.path.join(d, "trainer-learner-1.npz")}
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=environ)
    watchdog = threading.Timer(TIMEOUT, proc.kill)  # a hung child is killed: its lines never come
    watchdog.start()
    try:
        assert proc.stdout.readline().strip() == "ready"
        data = play(d)  # the envs run while both learners record
        for i, eps in data.items():
            for k, ep in enumerate(eps):
                np.savez(str(tmp_path / ("data-%d-%d.npz" % (i, k))), **ep)
        survivor = Learner(os.path.join(d, "trainer-learner-0.npz"))
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "flushed"
        bases = base_offsets(data)
        for sl in slices_of(data):
            if sl[2] == 0:
                survivor.record(data, bases, sl)
        survivor.ledger.close()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stdin.close()
        proc.stdout.close()
    assert not os.path.exists(os.path.join(d, "trainer-learner-1.npz"))  # only its spill segments
    report = compare(d, d)
    # learner 1 had the later slices of each episode, and wrote those of episode 0 before it was killed; those it
    # recorded after are read from its mapped part, placed by the fragments it noted there: no slice is lost, no
    # difference, no gap, and the file's note says how it ended
    assert report.ok and report.envs == [0, 1], str(report)
    assert report.partial == {"env": False, "trainer": True}
    ended = [n for n in report.notes if n.startswith("trainer-learner-1.npz: its process died, and every event "
                                                     "it recorded is read")]
    assert len(ended) == 1, report.notes
    assert not [n for n in report.notes if "trainer file" in n or "records end" in n], report.notes
