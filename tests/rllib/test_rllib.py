"""stepledger.rllib on a real local Ray cluster (``ray.init(num_cpus=2)``): short PPO runs, each in a subprocess
(tests/rllib_harness.py) with a timeout and ``ray.shutdown()`` always.

These run in their own venv (Ray 2.60 pins gymnasium 1.2.2): tests/rllib/test_rllib_venv.py builds it and runs this
file there. Elsewhere they skip with that reason.
"""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

pytest.importorskip("ray.rllib", reason="Ray RLlib is not installed here: tests/rllib/test_rllib_venv.py runs these "
                                        "tests in a venv of their own")

import stepledger.rllib  # noqa: E402
from stepledger.format import schema as S  # noqa: E402
from stepledger import compare, read  # noqa: E402
from stepledger.check import is_located  # noqa: E402
from stepledger.faults import read_record  # noqa: E402

ROOT = testpaths.ROOT
TESTS = testpaths.TESTS_DIR
HARNESS = os.path.join(TESTS, "rllib_harness.py")


def run(specs, timeout=420, env=None):
    """The harness in a subprocess (one Ray session for the list of runs); returns what each run did."""
    environ = dict(env or os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, TESTS, environ.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, HARNESS, json.dumps(specs)], capture_output=True, text=True,
                          timeout=timeout, env=environ, cwd=TESTS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1])


def env_indices(directory):
    names = [os.path.basename(p) for p in glob.glob(os.path.join(directory, "env-*.npz"))]
    return sorted(int(re.match(r"env-(\d+)\.npz$", n).group(1)) for n in names if re.match(r"env-\d+\.npz$", n))


GONE = ("not closed (its process is gone)", "its process died, and every event it recorded is read")


def noted_gone(notes, name):
    """Whether a note of ``notes`` says the ledger ``name``'s process is gone: read up to its last spill, or
    whole with the events of its mapped part (docs/ENDINGS.md)."""
    return any(re.search(r"(^|[ ,:])%s[ ,]" % re.escape(name), n) and any(g in n for g in GONE) for n in notes)


def linked_by_run(d, trainer, monkeypatch):
    """Every env ledger in ``d`` and every trainer file ``trainer`` names carries instrument's one run id, and
    compare pairs them by it: with the recordings' times taken to overlap nowhere, it compares the same envs.
    The report it gives then."""
    with read(d) as envs:
        env_runs = {i: s.meta.get(S.META_RUN) for i, s in envs.streams.items()}
    trainer_runs = set()
    for f in glob.glob(os.path.join(trainer, "trainer*.npz")) if os.path.isdir(trainer) else [trainer]:
        with read(f) as tr:
            trainer_runs.add(tr.meta.get(S.META_RUN))
    assert len(trainer_runs) == 1 and None not in trainer_runs, trainer_runs
    assert set(env_runs.values()) == trainer_runs, env_runs
    report = compare(d, trainer)
    import stepledger.report.compare as C
    monkeypatch.setattr(C, "CLOCK_SLACK", -1e12)  # any time-based check would call every env another run's
    by_id = compare(d, trainer)
    assert str(by_id) == str(report) and sorted(by_id.envs) == sorted(report.envs), str(by_id)
    return report


def trainer_streams(path):
    """The envs the trainer ledger has events of (it keeps empty streams for runners RLlib may recreate)."""
    with read(path) as ledger:
        return sorted(i for i, s in ledger.streams.items() if len(s))


# One Ray session (one subprocess, tests/rllib/conftest.py's shared_runs) runs every run below in turn, and
# test_rllib_multiagent.py's, each with its own algorithm: Ray's start and the harness's imports are paid once.
# The run ended by ray.shutdown() alone comes last.
CLEAN = ["cartpole-2-learners", "pendulum-async"]
FAULTS = [("wrapper", "obs:f16"), ("connector", "obs:f16"), ("connector", "reward:f16"),
          ("connector", "terminated:spurious")]  # on envs 0, 1, 2 and 3 of one Pendulum run


def specs(base):
    """This file's runs, by name, their paths under ``base`` (a pathlib.Path); "shutdown" last."""
    specs = {
        # several learners: RLlib slices one env's episodes across them, each writes its own trainer file
        "cartpole-2-learners": {"env": "CartPole-v1", "learners": 2, "iterations": 2},
        # Box actions; the sub-envs step in processes of their own (gymnasium's AsyncVectorEnv)
        "pendulum-async": {"env": "Pendulum-v1", "learners": 0, "iterations": 2, "vectorize": "async"},
        # a fault on each env, each from its own injector, each recording where it struck
        "faults": {"env": "Pendulum-v1", "iterations": 1, "faults": [
            {"fault": fault, "env": k, "at": 20, "record": str(base / "faults" / ("fault-%d.json" % k)), "place": place}
            for k, (place, fault) in enumerate(FAULTS)]},
        # DQN: a replay buffer between the runners and the learner, so the trainer side records on each runner
        "dqn": {"algo": "DQN", "env": "CartPole-v1", "iterations": 2},
        # evaluation runners; runner 2 killed and recreated by RLlib
        "recreate": {"env": "CartPole-v1", "iterations": 1, "evaluation": 1, "recreate": 2, "flush_interval": 0.2},
        # instrument(..., live=True): a reward rounded through float16 on its way from env 1 is one boundary fault
        # in RLlib's results
        "live": {"env": "Pendulum-v1", "iterations": 2, "live": True, "fault": {
            "fault": "reward:f16", "env": 1, "at": 20, "record": str(base / "live-fault.json"), "place": "wrapper"}},
        # last: a run ended by ray.shutdown() alone
        "shutdown": {"env": "CartPole-v1", "iterations": 2, "end": "shutdown", "flush_interval": 0.2},
    }
    for name, spec in specs.items():
        spec.update(path=str(base / name), runners=2, envs=2)
    return specs


@pytest.fixture(scope="module")
def runs(shared_runs):
    return shared_runs["single"]


def trainer_files(d):
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, "trainer*.npz")))


@pytest.mark.parametrize("name", CLEAN)
def test_clean_run_compares_clean_with_exactly_the_expected_env_files(runs, name, monkeypatch):
    spec, out = runs[name]
    d = spec["path"]
    assert out["iterations"] == 2
    assert env_indices(d) == [0, 1, 2, 3]
    report = linked_by_run(d, d, monkeypatch)  # the directory holds the trainer files too
    assert report.ok, str(report)
    assert sorted(report.envs) == [0, 1, 2, 3]
    files = trainer_files(d)
    assert report.trainer_files == files
    steps, held = 0, {}
    for f in files:
        with read(os.path.join(d, f)) as ledger:
            steps += sum(int((s.columns["kind"][:] == 1).sum()) for s in ledger.streams.values())
            for i, s in ledger.streams.items():
                if len(s):
                    held.setdefault(i, []).append(f)
    assert sorted(held) == [0, 1, 2, 3]
    assert steps == out["env_steps"]  # PPO trains on every step sampled, each recorded once
    if spec["learners"] == 2:
        # each learner writes its own file, of the slices of episodes it trained on
        assert files == ["trainer-learner-0.npz", "trainer-learner-1.npz"]
        assert any(len(names) == 2 for names in held.values()), held  # an env sliced across both learners
        assert compare(d, os.path.join(d, "trainer-learner-*.npz")).ok
    else:
        assert files == ["trainer.npz"]
    if spec.get("vectorize") == "async":
        with read(d) as ledger:  # the env ledgers were written by the AsyncVectorEnv's worker processes
            pids = {s.meta.get("pid") for s in ledger.streams.values()}
        assert len(pids) == 4 and not pids & set(out["runner_pids"].values()), (pids, out["runner_pids"])


@pytest.mark.parametrize("env,place,fault", [(k, p, f) for k, (p, f) in enumerate(FAULTS)])
def test_each_injected_fault_is_located_at_its_recorded_env_episode_step_and_field(runs, env, place, fault):
    spec, _ = runs["faults"]
    d = spec["path"]
    injected = read_record(spec["faults"][env]["record"])
    assert injected is not None and injected["env"] == env and injected["fault"] == fault, injected
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert [x.env for x in report.differences] == [0, 1, 2, 3], str(report)  # each env its own fault, no other
    assert is_located(report.by_env()[env], injected), (str(report), injected)


def test_the_trainer_side_records_first_in_each_learners_connector_pipeline_a_private_name_of_ray(runs):
    # Ray 2.60 has no public way to the pipeline a learner runs; PPO's learner prepends its
    # AddOneTsToEpisodesAndTruncate (which renames id_ and adds a step) to Learner._learner_connector in build().
    # stepledger.rllib prepends its recorder there (docs/RLLIB.md, "Ray's private names"). A Ray without it
    # is refused by name: instrument's build_algo raises no_learner_pipeline's line, in every run here.
    import ray
    for name, learners in (("cartpole-2-learners", 2), ("pendulum-async", 1)):
        pieces = runs[name][1]["learner_pieces"]
        assert len(pieces) == learners and all(p is not None for p in pieces), \
            "%s: %s" % (pieces, stepledger.rllib.no_learner_pipeline("PPOTorchLearner"))
        for p in pieces:
            assert p[:2] == ["StepledgerLearnerTap", "AddOneTsToEpisodesAndTruncate"], (ray.__version__, p)
    assert stepledger.rllib.learner_pipeline(object()) is None
    line = str(stepledger.rllib.no_learner_pipeline(type("SomeLearner", (), {})))
    assert line == ("stepledger.rllib: the SomeLearner learner of this Ray (%s) has no connector pipeline at "
                    "_learner_connector, where the trainer side records what it trains on (Ray 2.60 has one); use "
                    "instrument(..., placement='runner')" % ray.__version__), line


def test_off_policy_runs_record_the_trainer_side_on_each_runner_and_compare_clean(runs):
    spec, out = runs["dqn"]
    d = spec["path"]
    assert env_indices(d) == [0, 1, 2, 3]
    assert trainer_files(d) == ["trainer-runner-0.npz", "trainer-runner-2.npz"]  # each runner's, by its first env
    assert trainer_streams(os.path.join(d, "trainer-runner-0.npz")) == [0, 1]
    assert trainer_streams(os.path.join(d, "trainer-runner-2.npz")) == [2, 3]
    report = compare(d, os.path.join(d, "trainer-runner-*.npz"))
    assert report.ok, str(report)
    assert sorted(report.envs) == [0, 1, 2, 3]


def test_a_run_stopped_by_shutdown_alone_leaves_env_ledgers_up_to_the_last_flush_and_no_difference(runs):
    # ray.shutdown() without algo.stop(): no close(). Ray sends each runner's process SIGTERM, then SIGKILL
    # soon after; stepledger's SIGTERM handler writes the final ledgers of the envs it gets to before the
    # SIGKILL (state "signal"), and the others are left as their spill segments, made every flush_interval
    # (and at the end of each sample() past one). Which envs end which way depends on the machine's load (one
    # run here had two of each, the CI run at 6314400 none); either way every env's events up to its last
    # spill are there, and the streams that end at different points in a run that ended so are not a difference.
    spec, out = runs["shutdown"]
    d = spec["path"]
    assert out["iterations"] == 2
    with read(d) as ledger:
        assert sorted(ledger.streams) == [0, 1, 2, 3]
        assert all(len(s.columns["kind"][:]) > 0 for s in ledger.streams.values())
        states = {i: s.meta.get("state") for i, s in ledger.streams.items()}
    signalled = sorted(i for i, state in states.items() if state == S.STATE_SIGNAL)
    spilled = sorted(i for i, state in states.items() if state == S.STATE_OPEN)
    assert sorted(signalled + spilled) == [0, 1, 2, 3], states  # never "closed": no close() was called
    assert env_indices(d) == signalled, "a final env-N.npz is one written on SIGTERM, never one of a close()"
    for i in spilled:  # its spill segments, or its mapped part (killed before its first spill)
        assert glob.glob(os.path.join(d, "env-%d.npz.spill" % i, "seg-*.npz")) or \
            glob.glob(os.path.join(d, "env-%d.npz.live-*" % i)), "env %d left neither" % i
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, str(report)
    notes = "\n".join(report.notes)
    # every env's events are in its ledger (issue 30): the env side never stops before the trainer's end
    assert "the env side stopped" not in notes, report.notes
    for i in spilled:
        assert noted_gone(report.notes, "env-%d.npz" % i), report.notes
    if signalled:
        assert "written when its process got SIGTERM" in notes, report.notes


def test_evaluation_runners_record_nothing_and_a_recreated_runner_gets_new_indices(runs, monkeypatch):
    spec, out = runs["recreate"]
    d = spec["path"]
    assert out["runner_pids_after"]["2"] != out["runner_pids"]["2"], out  # RLlib brought runner 2 back
    # runner 2's first envs (2 and 3) end where its process died; the recreated one records as envs 4 and 5;
    # the evaluation runner's envs write nothing (their episodes reach no learner)
    assert env_indices(d) == [0, 1, 4, 5]
    # The killed runner's envs left spill segments (the harness killed it once each had spilled), and their
    # mapped parts the events since (docs/ENDINGS.md)
    spilled = sorted(int(os.path.basename(p)[4:-10]) for p in glob.glob(os.path.join(d, "env-*.npz.spill")))
    assert spilled == [2, 3], spilled
    assert not glob.glob(os.path.join(d, "*unindexed*")) and not glob.glob(os.path.join(d, "*.dup-*"))
    assert trainer_streams(os.path.join(d, "trainer.npz")) == [0, 1, 2, 3, 4, 5]
    # the killed runner's envs are of the run by its id, however long before the learner's first update they
    # were last written
    report = linked_by_run(d, os.path.join(d, "trainer.npz"), monkeypatch)
    assert sorted(report.envs) == [0, 1, 2, 3, 4, 5], (str(report), os.listdir(d))
    assert report.ok, str(report)
    assert noted_gone(report.notes, "env-2.npz") and noted_gone(report.notes, "env-3.npz"), report.notes


def test_a_driver_killed_by_sigkill_mid_training_leaves_every_ledger_and_compares_clean(tmp_path):
    # SIGKILL to the process that built the algorithm, mid-training: its own trainer side (with two learners,
    # the learners' actors) and the runners' env ledgers die with it, or are killed by Ray, with no close().
    # What is left is every ledger: its spills, then its mapped part; compare treats it as an interrupted run.
    import psutil
    d = str(tmp_path / "killed")
    spec = {"path": d, "env": "CartPole-v1", "runners": 2, "envs": 2, "learners": 2, "iterations": 1,
            "end": "kill", "flush_interval": 0.2}
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, TESTS, environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, HARNESS, json.dumps([spec])], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=environ, cwd=TESTS, start_new_session=True)
    family = []
    try:
        watchdog = threading.Timer(420, proc.kill)  # the run's timeout: a hung run is killed, its line never comes
        watchdog.start()
        try:
            line = "-"
            while line and not line.startswith("trained 1"):
                line = proc.stdout.readline()  # "trained 1": the learners have spilled; the second iteration is on
        finally:
            watchdog.cancel()
        assert line.startswith("trained 1"), "the run did not get through its first iteration"
        # mid-training, once every ledger has spilled (its process's idle spiller writes a segment an interval
        # after it was due, whether it records or not): then SIGKILL
        ledgers = ["env-%d.npz" % i for i in range(4)] + ["trainer-learner-%d.npz" % k for k in range(2)]
        deadline = time.monotonic() + 120
        while not all(glob.glob(os.path.join(d, name + ".spill", "seg-*.npz")) for name in ledgers):
            assert time.monotonic() < deadline and proc.poll() is None, "not every ledger spilled: %s" % (
                sorted(os.listdir(d)) if os.path.isdir(d) else "no %s" % d)
            time.sleep(0.05)
        family = psutil.Process(proc.pid).children(recursive=True)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        psutil.wait_procs(family, timeout=20)  # the cluster this driver started goes with it, or is killed here
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for p in family:  # Ray's agents may take a while to see their raylet gone
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(family, timeout=30)
    assert env_indices(d) == [], "no env ledger was closed, so none is final"
    assert trainer_files(d) == [], "no trainer ledger was closed, so none is final"
    with read(d) as ledger:  # each env's spill segments, then its mapped part
        assert sorted(ledger.streams) == [0, 1, 2, 3]
        assert {s.meta.get("state") for s in ledger.streams.values()} == {"open"}
    report = compare(d, d)
    assert report.ok, str(report)
    assert sorted(report.envs) == [0, 1, 2, 3]
    assert report.partial == {"env": True, "trainer": True}
    # every event of the killed env runners is read, from their mapped parts after their spills (issue 30)
    assert not any("the env side stopped" in n for n in report.notes), report.notes
    assert any(n.startswith("trainer-learner-") and any(g in n for g in GONE) for n in report.notes), report.notes


def test_every_ledger_goes_through_s3fs_to_an_s3_server_and_compare_reads_them_there(s3_server, tmp_path,
                                                                                      monkeypatch):
    server = s3_server
    server.configure(monkeypatch)
    monkeypatch.setenv("STEPLEDGER_UNPUBLISHED", str(tmp_path / "unpublished"))
    bucket = "rllib-" + uuid.uuid4().hex[:10]
    server.make_bucket(bucket)
    url = "s3://%s/run-17" % bucket
    # the runners are Ray workers started by the driver's local cluster: they get the driver's environment,
    # as a cluster's nodes would have their own credentials
    run({"path": url, "env": "Pendulum-v1", "runners": 2, "envs": 2, "learners": 0, "iterations": 1},
        env=dict(os.environ))
    fs = server.filesystem()
    names = sorted(os.path.basename(p) for p in fs.ls("%s/run-17" % bucket))
    # every ledger published in storage. A runner that Ray kills between publishing its final file and
    # removing its spilled segments (as algo.stop() ends the actors; seen in CI at a load of 10) leaves
    # them beside it: its final file holds them all and is what is read
    assert [n for n in names if not n.endswith(".spill")] == [
        "env-0.npz", "env-1.npz", "env-2.npz", "env-3.npz", "trainer.npz"], names
    assert not os.path.exists(tmp_path / "unpublished") or not os.listdir(tmp_path / "unpublished")
    report = compare(url, url + "/trainer.npz")
    assert report.ok, str(report)
    assert sorted(report.envs) == [0, 1, 2, 3]
    assert report.partial == {"env": False, "trainer": False}, str(report)  # the final files, not segments
    from stepledger.cli.main import main
    assert main(["compare", url, url + "/trainer.npz"]) == 0


def own_ray(environ):
    """``environ`` with RAY_ADDRESS=local: a plain ``ray.init()`` in the child starts a cluster of its own rather
    than joining one another process left running on this machine (which refuses ``num_cpus``)."""
    return dict(environ, RAY_ADDRESS="local")


def test_stepledger_check_runs_on_rllib(tmp_path):
    environ = own_ray(dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)))
    proc = subprocess.run([sys.executable, "-m", "stepledger", "check", "CartPole-v1", "--trainer", "rllib",
                           "--runners", "1", "--num-envs", "2", "--faults", "obs:f16",
                           "--dir", str(tmp_path / "check")], capture_output=True, text=True, timeout=600,
                          env=environ, cwd=str(tmp_path))
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "clean run: no difference" in out
    assert re.search(r"obs:f16\s+caught and located\s+\(injected at env 1, episode \d+, step \d+\)", out), out


def _rllib_blocks():
    out = []
    for page in ["README.md"] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        with open(os.path.join(ROOT, page)) as f:
            out += re.findall(r"```python rllib\n(.*?)```", f.read(), flags=re.S)
    return out


def test_the_readme_rllib_quickstart_runs_as_printed(tmp_path):
    blocks = _rllib_blocks()
    assert blocks and "stepledger.rllib.instrument" in blocks[0]
    script = tmp_path / "quickstart.py"
    script.write_text(blocks[0])
    environ = own_ray(dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=420, env=environ,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == "0 of 4 envs differ", proc.stdout
    cmd = subprocess.run([sys.executable, "-m", "stepledger", "compare", "ledger", "ledger/trainer.npz"],
                         capture_output=True, text=True, timeout=120, env=environ, cwd=str(tmp_path))
    assert cmd.returncode == 0 and cmd.stdout.strip() == "0 of 4 envs differ", cmd.stdout + cmd.stderr


def test_live_check_counts_go_to_rllibs_metrics(runs):
    # each runner checks the episodes sample() returns against LedgerEnv's live tokens
    from stepledger.recording.live import METRIC_CHECKED, METRIC_FAULTS
    spec, out = runs["live"]
    d = spec["path"]
    injected = read_record(spec["fault"]["record"])
    assert injected is not None and injected["env"] == 1
    metrics = out["metrics"]
    assert metrics[METRIC_FAULTS] == 1, metrics
    with read(os.path.join(d, "trainer.npz")) as ledger:  # what the learner trained on: the episodes checked
        trained = sum(len(s) for s in ledger.streams.values())
    # and, at algo.stop(), the resets no sample() had returned yet (one per env at most)
    assert trained - 4 <= metrics[METRIC_CHECKED] <= trained, (metrics, trained)
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert [x.env for x in report.differences] == [1] and is_located(report.by_env()[1], injected), str(report)
