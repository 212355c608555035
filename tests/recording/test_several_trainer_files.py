"""compare with several trainer files: one per learner or trainer process.

Given as a list, a glob, a directory of them, or the env directory itself; each env in exactly
one of them. Runs that end badly hold as with one file: a learner killed before its final file,
a trainer file of an earlier run left in the directory. Object storage too.
"""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import gymnasium as gym
import numpy as np
import pytest

import ending_harness as H
from stepledger import LedgerError, compare
from stepledger.format import schema as S
from stepledger.report.compare import CLOCK_SLACK
from stepledger.recording.recording import Recording
from stepledger.format.spaces import LeafLayout

TESTS_DIR = testpaths.TESTS_DIR
ROOT = os.path.dirname(TESTS_DIR)
BOX = gym.spaces.Box(-1, 1, (2,), np.float32)
ACT = gym.spaces.Discrete(2)
TIMEOUT = 120


def _environ():
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, TESTS_DIR, env.get("PYTHONPATH")) if p)
    return env


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "stepledger", *args], capture_output=True, text=True,
                          env=env or _environ(), timeout=TIMEOUT)


def events(env, n_steps=6, start=None):
    """An env's events: a reset, then steps; digests that differ from env to env."""
    start = 1000 * (env + 1) if start is None else start
    out = [(S.KIND_RESET, start, 0, 0.0, False, False)]
    for k in range(1, n_steps + 1):
        out.append((S.KIND_STEP, start + k, 7, 0.5 * k, False, k == n_steps))
    return out


def ledger(path, side, streams, reward_dtype=np.float32, close=True):
    """A ledger of explicit events, written as a recording writes it: streams maps env -> events."""
    from stepledger import core
    rec = Recording(path, side, sorted(streams), LeafLayout(BOX), LeafLayout(ACT), reward_dtype, False)
    f32 = np.dtype(reward_dtype) == np.float32
    for k, env in enumerate(sorted(streams)):
        for kind, ho, ha, r, te, tr in streams[env]:
            rec.buffers[k].append(kind, ho, ha, core.reward_bits(r, f32), te, tr)
    if close:
        rec.close()
    return rec


def run(directory, layout, env_events=None, trainer_events=None):
    """Env ledgers env-N.npz for every env of ``layout`` (trainer file name -> its envs), and the trainer files."""
    env_events = env_events or {}
    trainer_events = trainer_events or {}
    os.makedirs(directory, exist_ok=True)
    for envs in layout.values():
        for e in envs:
            ledger(os.path.join(directory, "env-%d.npz" % e), "env", {e: env_events.get(e, events(e))})
    for name, envs in layout.items():
        ledger(os.path.join(directory, name), "trainer", {e: trainer_events.get(e, events(e)) for e in envs})
    return directory


TWO_LEARNERS = {"trainer-0.npz": [0, 1], "trainer-1.npz": [2, 3]}


# ---------------------------------------------------------------- the ways of naming them

def test_a_list_a_glob_a_directory_and_the_env_directory_itself(tmp_path):
    d = run(str(tmp_path / "ledger"), TWO_LEARNERS)
    t0, t1 = os.path.join(d, "trainer-0.npz"), os.path.join(d, "trainer-1.npz")
    only = tmp_path / "trainers"
    only.mkdir()
    for n in TWO_LEARNERS:
        os.link(os.path.join(d, n), str(only / n))
    for spec in ([t0, t1], os.path.join(d, "trainer-*.npz"), os.path.join(d, "*.npz"), d, str(only),
                 [t0, os.path.join(d, "trainer-*.npz")]):  # a file named twice is read once
        report = compare(d, spec)
        assert report.ok and report.envs == [0, 1, 2, 3] and report.notes == [], (spec, str(report))
        assert str(report) == "0 of 4 envs differ"
    # one trainer file alone: the other learner's envs are on the env side only
    report = compare(d, t0)
    assert [(x.env, x.what, x.side) for x in report.differences] == [(2, "one_side", "env"), (3, "one_side", "env")]


def test_cli_takes_several_files_a_glob_or_a_directory(tmp_path):
    d = run(str(tmp_path / "ledger"), TWO_LEARNERS)
    for args in ([os.path.join(d, "trainer-0.npz"), os.path.join(d, "trainer-1.npz")],  # a shell-expanded glob
                 [os.path.join(d, "trainer-*.npz")], [d], [d + "/"]):
        out = cli("compare", d, *args)
        assert out.returncode == 0 and out.stdout.strip() == "0 of 4 envs differ", (args, out.stdout, out.stderr)
    out = cli("compare", d, d, "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["envs"] == [0, 1, 2, 3]


def test_a_difference_in_the_second_file_json_and_junit(tmp_path):
    d = run(str(tmp_path / "ledger"), TWO_LEARNERS,
            trainer_events={3: events(3)[:4] + [(S.KIND_STEP, 9999, 7, 2.0, False, False)] + events(3)[5:]})
    junit = str(tmp_path / "report.xml")
    out = cli("compare", d, os.path.join(d, "trainer-*.npz"), "--json", "--junit", junit)
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert report["n_differ"] == 1 and report["differences"][0]["env"] == 3
    assert report["differences"][0]["episode"] == 0 and report["differences"][0]["step"] == 4
    assert report["differences"][0]["fields"] == ["obs"]
    assert report["differences"][0]["trainer_file"] == "trainer-1.npz"
    assert report["trainer_files"] == ["trainer-0.npz", "trainer-1.npz"]
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert sorted(cases) == ["env 0", "env 1", "env 2", "env 3"]
    assert [n for n, c in cases.items() if c.find("failure") is not None] == ["env 3"]
    text = cli("compare", d, d)
    assert text.returncode == 1 and text.stdout.splitlines()[0] == "env 3, episode 0, step 4: obs differs"


# ---------------------------------------------------------------- each env in exactly one file

def test_an_env_in_two_trainer_files_is_refused_naming_both(tmp_path):
    d = run(str(tmp_path / "ledger"), {"trainer-0.npz": [0, 1, 2], "trainer-1.npz": [2, 3]})
    with pytest.raises(LedgerError) as info:
        compare(d, os.path.join(d, "trainer-*.npz"))
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("env 2 appears in more than one trainer file (trainer-0.npz and trainer-1.npz)"), msg
    out = cli("compare", d, d, "--json")
    assert out.returncode == 2 and "env 2 appears in more than one trainer file" in out.stderr
    assert json.loads(out.stdout)["ok"] is False and len(out.stderr.strip().splitlines()) == 1
    # several envs shared: the first is named, the others counted
    d2 = run(str(tmp_path / "two"), {"a.npz": [0, 1, 2], "b.npz": [0, 1, 2]})
    with pytest.raises(LedgerError, match=r"^env 0 appears .*\(a.npz and b.npz\) and so do 2 more envs"):
        compare(d2, d2)


def test_a_stream_with_no_events_does_not_count_as_appearing(tmp_path):
    d = run(str(tmp_path / "ledger"), TWO_LEARNERS)
    # a learner that holds a stream for env 2 but never got an event for it
    ledger(os.path.join(d, "trainer-0.npz"), "trainer", {0: events(0), 1: events(1), 2: []})
    report = compare(d, d)
    assert report.ok and report.envs == [0, 1, 2, 3], str(report)


def test_trainer_files_recorded_differently_are_refused(tmp_path):
    d = run(str(tmp_path / "ledger"), {"trainer-0.npz": [0, 1]})
    ledger(os.path.join(d, "env-2.npz"), "env", {2: events(2)})
    ledger(os.path.join(d, "trainer-1.npz"), "trainer", {2: events(2)}, reward_dtype=np.float64)
    out = cli("compare", d, d)
    assert out.returncode == 2
    assert out.stderr.strip() == ("stepledger: trainer-1.npz was recorded with another reward dtype than "
                                  "trainer-0.npz (\"float64\", not \"float32\"): the trainer files of one run "
                                  "record alike")


def test_what_names_no_trainer_ledger_is_refused_with_one_line(tmp_path):
    d = run(str(tmp_path / "ledger"), TWO_LEARNERS)
    envs_only = tmp_path / "envs"
    envs_only.mkdir()
    ledger(str(envs_only / "env-0.npz"), "env", {0: events(0)})
    cases = [
        ([d, os.path.join(d, "nothing-*.npz")], "no trainer ledgers match this pattern"),
        ([str(envs_only), str(envs_only)], "no trainer ledgers (*.npz other than env-N.npz) in this directory"),
        ([os.path.join(d, "trainer-0.npz"), d], "given in the wrong order"),
        ([d, os.path.join(d, "trainer-0.npz"), os.path.join(d, "env-0.npz")], "not a trainer-side ledger"),
    ]
    for args, words in cases:
        out = cli("compare", *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert words in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1


def test_other_files_in_the_directory_are_passed_over_with_a_line(tmp_path):
    d = run(str(tmp_path / "ledger"), TWO_LEARNERS)
    np.savez(os.path.join(d, "episodes.npz"), r=np.arange(3.0))  # not a ledger (an episode log, say)
    ledger(os.path.join(d, "copy-of-env-0.npz"), "env", {0: events(0)})  # an env-side ledger under another name
    report = compare(d, d)
    assert report.ok and report.envs == [0, 1, 2, 3]
    assert any(n.startswith(os.path.join(d, "episodes.npz") + ": not read as a trainer ledger") for n in report.notes)
    assert any("copy-of-env-0.npz: not read as a trainer ledger (an env-side ledger)" in n for n in report.notes)
    # named on its own, the same file is refused
    with pytest.raises(LedgerError, match="not a ledger"):
        compare(d, [os.path.join(d, "trainer-0.npz"), os.path.join(d, "episodes.npz")])


# ---------------------------------------------------------------- runs that end badly

_KILLED_LEARNER = """
import os, signal, sys
sys.path[:0] = [%(tests)r, %(here)r]
import test_several_trainer_files as T
rec = T.ledger(%(path)r, "trainer", {2: T.events(2)[:4], 3: T.events(3)[:3]}, close=False)
rec.spill()  # what a periodic spill leaves on disk
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_learner_killed_before_its_final_file_is_read_from_its_segments(tmp_path):
    d = str(tmp_path / "ledger")
    os.makedirs(d)
    # learner 0 records while learner 1 runs (the files of one run are told by their overlapping times)
    learner0 = ledger(os.path.join(d, "trainer-0.npz"), "trainer", {0: events(0), 1: events(1)}, close=False)
    for e in (0, 1):
        ledger(os.path.join(d, "env-%d.npz" % e), "env", {e: events(e)})
    proc = subprocess.run([sys.executable, "-c", _KILLED_LEARNER % {"tests": TESTS_DIR, "here": os.path.dirname(os.path.abspath(__file__)),
                                                                    "path": os.path.join(d, "trainer-1.npz")}],
                          env=_environ(), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    for e in (2, 3):  # learner 1's envs, written as their run ends
        ledger(os.path.join(d, "env-%d.npz" % e), "env", {e: events(e)})
    learner0.close()
    assert not os.path.exists(os.path.join(d, "trainer-1.npz")) and os.path.isdir(os.path.join(d, "trainer-1.npz.spill"))
    for spec in (os.path.join(d, "trainer-*.npz"), d):
        report = compare(d, spec)
        assert report.ok and report.envs == [0, 1, 2, 3], str(report)  # a killed learner is not a difference
        assert report.partial["trainer"]
        ends = [n for n in report.notes if n.startswith(("env 2:", "env 3:"))]
        assert len(ends) == 2 and all("records end at different points" in n for n in ends), report.notes
        # its events since its last spill are read from its mapped part (none there: the older note)
        assert any(n.startswith(("trainer-1.npz: its process died, and every event it recorded is read",
                                 "trainer-1.npz: not closed (its process is gone)")) for n in report.notes), report.notes
    out = cli("compare", d, os.path.join(d, "trainer-*.npz"))
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_trainer_file_of_an_earlier_run_left_in_the_directory(tmp_path):
    d = run(str(tmp_path / "ledger"), TWO_LEARNERS)  # run 1: two learners
    time.sleep(CLOCK_SLACK + 0.3)
    run(d, {"trainer-0.npz": [0, 1]})  # run 2: one learner, two envs; run 1's trainer-1.npz stays
    for spec in (d, os.path.join(d, "trainer-*.npz")):
        report = compare(d, spec)
        assert report.ok and report.envs == [0, 1], str(report)
        assert any(n.startswith("trainer-1.npz is from an earlier run (written ") and n.endswith(": not compared")
                   for n in report.notes), report.notes
        assert any(n.startswith("env-2.npz is from another run") for n in report.notes), report.notes
        assert report.to_dict()["trainer_files"] == ["trainer-0.npz"]
    # run 3 with two learners again, and an env of learner 1 that differs: reported, not passed over
    time.sleep(CLOCK_SLACK + 0.3)
    run(d, TWO_LEARNERS, trainer_events={2: events(2, start=5)})
    report = compare(d, d)
    assert [x.env for x in report.differences] == [2] and report.notes == [], str(report)


def test_trainer_files_that_carry_one_run_id_are_one_run_whatever_their_times(tmp_path):
    # stepledger.rllib gives each learner's file and each env ledger its run's id: a learner whose file was
    # last written long before the other began (it trained on the first iteration only) is of the run
    d = str(tmp_path / "ledger")
    os.makedirs(d)

    def linked(name, side, streams):
        rec = ledger(os.path.join(d, name), side, streams, close=False)
        rec.link("0123456789abcdef", None if side == "trainer" else min(streams))
        rec.close()

    for e in (2, 3):
        linked("env-%d.npz" % e, "env", {e: events(e)})
    linked("trainer-1.npz", "trainer", {2: events(2), 3: events(3)})
    time.sleep(CLOCK_SLACK + 0.3)
    for e in (0, 1):
        linked("env-%d.npz" % e, "env", {e: events(e)})
    linked("trainer-0.npz", "trainer", {0: events(0), 1: events(1)})
    for spec in (d, os.path.join(d, "trainer-*.npz")):
        report = compare(d, spec)
        assert report.ok and report.envs == [0, 1, 2, 3] and report.notes == [], str(report)
        assert report.to_dict()["trainer_files"] == ["trainer-0.npz", "trainer-1.npz"]


def test_compare_while_the_learners_write(tmp_path):
    """Two learners still recording (a flush each): in progress, not a difference."""
    d = str(tmp_path / "ledger")
    os.makedirs(d)
    for e in range(4):
        ledger(os.path.join(d, "env-%d.npz" % e), "env", {e: events(e)})
    recs = [ledger(os.path.join(d, n), "trainer", {e: events(e)[:3] for e in envs}, close=False)
            for n, envs in TWO_LEARNERS.items()]
    try:
        for r in recs:
            r.write()
        report = compare(d, d)
        assert report.ok and report.envs == [0, 1, 2, 3], str(report)
        assert sum(1 for n in report.notes if ": in progress, last written" in n) == 2, report.notes
    finally:
        for r in recs:
            r.close()


# ---------------------------------------------------------------- object storage

@pytest.fixture
def bucket(s3_server, monkeypatch, tmp_path):
    import uuid
    s3_server.configure(monkeypatch)
    monkeypatch.setenv("STEPLEDGER_UNPUBLISHED", str(tmp_path / "unpublished"))
    return s3_server, s3_server.make_bucket("t-" + uuid.uuid4().hex[:12])


def test_globs_and_directories_at_a_url(bucket, tmp_path):
    server, name = bucket
    url = "s3://%s/run-1" % name
    # the learners record while their envs do (uploads take their time: ledgers of one run overlap)
    learners = [ledger(url + "/trainer-0.npz", "trainer", {0: events(0), 1: events(1)}, close=False),
                ledger(url + "/trainer-1.npz", "trainer", {2: events(2), 3: [events(3)[0]]}, close=False)]
    for e in range(4):
        ledger("%s/env-%d.npz" % (url, e), "env", {e: events(e)})
    for rec in learners:
        rec.close()  # env 3's trainer stream stops early
    for spec in (url + "/trainer-*.npz", url, url + "/", [url + "/trainer-0.npz", url + "/trainer-1.npz"]):
        report = compare(url, spec)
        assert [(x.env, x.what) for x in report.differences] == [(3, "length")], (spec, str(report))
        assert report.envs == [0, 1, 2, 3]
    with pytest.raises(LedgerError, match=r"s3://.*/run-1/nothing-\*\.npz: no trainer ledgers match"):
        compare(url, url + "/nothing-*.npz")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
    env.update(server.environ())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, TESTS_DIR, env.get("PYTHONPATH")) if p)
    out = cli("compare", url, url + "/trainer-*.npz", "--json", env=env)
    assert out.returncode == 1 and json.loads(out.stdout)["differences"][0]["env"] == 3, out.stderr
    # a deferred index at a URL: the file is named once the index is known
    from stepledger import LedgerEnv
    import envs_for_tests as E
    lazy = LedgerEnv(E.CountEnv(), url + "/lazy")
    lazy.set_index(6)
    lazy.reset(seed=0)
    lazy.close()
    with pytest.warns(RuntimeWarning, match="had no index at its first event"):
        lost = LedgerEnv(E.CountEnv(), url + "/lazy")
        lost.reset(seed=0)
    lost.close()
    from stepledger.format import storage
    names = storage.listdir(url + "/lazy")
    assert "env-6.npz" in names and any(n.startswith(S.UNINDEXED_PREFIX) for n in names), names


# ---------------------------------------------------------------- real learners: processes, vector envs, TrainerLedger

_LEARNER = """
import functools, sys, time
import gymnasium as gym, numpy as np
import envs_for_tests as E
from stepledger import LedgerEnv, TrainerLedger
d, learner, n_total, ending = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
mine = [2 * learner, 2 * learner + 1]  # the global indices of this learner's envs
venv = gym.vector.AsyncVectorEnv([functools.partial(LedgerEnv, E.CountEnv(length=3 + g), d, flush_interval=0.3)
                                  for g in mine], context="fork")
venv.set_attr("stepledger_index", mine)  # the env side: global indices, given after construction
led = TrainerLedger("%s/trainer-%d.npz" % (d, learner), n_total, venv.single_observation_space,
                    venv.single_action_space, flush_interval=0.3)
print("recording", flush=True)  # its recording began: it starts stepping when told
sys.stdin.readline()
obs, _ = venv.reset(seed=learner)
for k, g in enumerate(mine):
    led.env_reset(g, obs[k])
ended = np.zeros(2, bool)
t0, t = time.monotonic(), 0
while True:
    actions = np.array([t % 3, (t + 1) % 3])
    obs, rewards, terminated, truncated, _ = venv.step(actions)
    for k, g in enumerate(mine):  # per-env events, as a learner sees episodes (NEXT_STEP: a reset after an end)
        if ended[k]:
            led.env_reset(g, obs[k])
        else:
            led.env_steps(g, actions[k:k + 1], obs[k:k + 1], rewards[k:k + 1], terminated[k:k + 1],
                          truncated[k:k + 1])
    ended = terminated | truncated
    t += 1
    if ending == "close" and t == 40:
        break
    if ending == "wait" and t == 40:
        print("ready", flush=True)
    if ending == "wait" and t > 40:
        time.sleep(0.002)
led.close()
venv.close()
print("done", flush=True)
"""


def _learners(d, n_total, endings):
    """A process for each learner of ``endings`` ({learner: ending}), started together: each steps once every
    one's recording has begun (the recordings of one run overlap in time, however late a busy machine
    starts a process)."""
    procs = [subprocess.Popen([sys.executable, "-W", "ignore", "-c", _LEARNER, d, str(k), str(n_total), ending],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_environ(), start_new_session=True) for k, ending in sorted(endings.items())]
    for proc in procs:
        line = proc.stdout.readline()
        assert line.startswith("recording"), proc.stderr.read()[-3000:]
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return procs


def _finish(proc, written=None, meanwhile=None):
    """Wait for a learner to end; or with ``written``, SIGKILL it once that holds of what it spilled."""
    try:
        if written:
            H.kill_group_when_ready(proc, written, TIMEOUT, meanwhile)
        else:
            proc.wait(TIMEOUT)
            assert proc.returncode == 0, proc.stderr.read()[-3000:]
    finally:
        proc.stdin.close()
        H.reap(proc)


def test_two_learner_processes_with_async_vector_envs(tmp_path):
    d = str(tmp_path / "ledger")
    os.makedirs(d)
    procs = _learners(d, 4, {0: "close", 1: "close"})
    for p in procs:
        _finish(p)
    report = compare(d, os.path.join(d, "trainer-*.npz"))
    assert report.ok and report.envs == [0, 1, 2, 3] and report.notes == [], str(report)
    out = cli("compare", d, d, "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["trainer_files"] == ["trainer-0.npz", "trainer-1.npz"]
    # the same envs recorded by one learner file twice over is refused, naming the env and both files
    os.link(os.path.join(d, "trainer-1.npz"), os.path.join(d, "trainer-1-copy.npz"))
    out = cli("compare", d, d)
    assert out.returncode == 2
    assert "env 2 appears in more than one trainer file (trainer-1-copy.npz and trainer-1.npz)" in out.stderr


def test_a_learner_killed_mid_run_then_a_rerun_with_one_learner(tmp_path):
    d = str(tmp_path / "ledger")
    os.makedirs(d)
    victim = os.path.join(d, "trainer-1.npz")
    spilled = []

    def survivor():  # learner 0 runs from start to end while learner 1 records
        _finish(_learners(d, 4, {0: "close"})[0])
        spilled.append(sum(H.on_disk(victim).values()))

    # learner 1 is killed once a spill of its own came after learner 0's end, and its envs' spills are on disk
    _finish(_learners(d, 4, {1: "wait"})[0], meanwhile=survivor,
            written=lambda: sum(H.on_disk(victim).values()) > spilled[0] and
            all(H.on_disk(d).get(e, 0) > 0 for e in (2, 3)))
    assert not os.path.exists(os.path.join(d, "trainer-1.npz"))  # only its spill segments
    for spec in (os.path.join(d, "trainer-*.npz"), d):
        report = compare(d, spec)
        assert report.ok and report.envs == [0, 1, 2, 3], str(report)  # a killed learner is no boundary fault
        assert report.partial == {"env": True, "trainer": True}
        # its events since its last spill are read from its mapped part (none there: the older note)
        assert any(n.startswith(("trainer-1.npz: its process died, and every event it recorded is read",
                                 "trainer-1.npz: not closed (its process is gone)")) for n in report.notes), report.notes
    time.sleep(CLOCK_SLACK + 0.3)
    # the same directory again, one learner of two envs: run 1's learner 1 and its envs are left behind
    _finish(_learners(d, 2, {0: "close"})[0])
    report = compare(d, d)
    assert report.ok and report.envs == [0, 1], str(report)
    assert any(n.startswith("trainer-1.npz is from an earlier run") for n in report.notes), report.notes
    assert sum(1 for n in report.notes if n.startswith(("env-2.npz is from another run",
                                                         "env-3.npz is from another run"))) == 2, report.notes


def test_a_glob_takes_no_lock_temporary_or_env_file(tmp_path):
    d = run(str(tmp_path / "ledger"), TWO_LEARNERS)
    for name in ("trainer-0.npz.lock", "trainer-1.npz.tmp-99999-abcd", "notes.txt"):
        with open(os.path.join(d, name), "w") as f:
            f.write("{}")
    report = compare(d, os.path.join(d, "*"))
    assert report.ok and report.envs == [0, 1, 2, 3] and report.notes == [], str(report)
