"""compare in worker processes (``jobs=``, ``--jobs``) on batch files (``env-N-M.npz``, several envs in one file):
the envs of each batch are paired with the trainer side's exactly as one process pairs them, forked or spawned
(spawned workers open the batch files by name, as Ray tasks do: tests/report/test_compare_ray.py runs the same
batches on a real Ray cluster), a fault between the two sides located at the same env and event, and a batch file
of another run leaves all of its envs out, not only its first."""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import multiprocessing
import os
import shutil
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

import stepledger
from stepledger import compare
from stepledger.gymnasium import LedgerBatchEnv
from stepledger.report import parallel
from stepledger.report.read import env_indices_of

ROOT, TESTS_DIR = testpaths.ROOT, testpaths.TESTS_DIR
_CLI = ("import sys; import stepledger.report.parallel as p; p.MIN_EVENTS_A_WORKER = 1; "
        "from stepledger.cli.main import main; sys.exit(main(sys.argv[1:]))")


def write_batches(d, faulty=None, steps=150, run=None):
    """Three CartPoleVectorEnv batches of one run (envs 0-3, 4-6 and 7: env-0-3.npz, env-4-6.npz, env-7.npz) and
    one trainer ledger of the 8 envs; ``faulty`` = (env, vector step): the trainer receives that env's reward
    doubled at that step."""
    os.makedirs(d, exist_ok=True)
    sizes = [(0, 4), (4, 3), (7, 1)]
    tr = stepledger.TrainerLedger(os.path.join(d, "trainer.npz"), 8, gym.spaces.Box(-5, 5, (4,)),
                                  gym.spaces.Discrete(2), autoreset_mode="next_step")
    batches = [LedgerBatchEnv(gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point",
                                           max_episode_steps=20), d, first=first) for first, n in sizes]
    for b in batches:
        b.ledger.link(run or tr.run)
    tr.reset(np.concatenate([b.reset(seed=k)[0] for k, b in enumerate(batches)]))
    rng = np.random.default_rng(1)
    for t in range(steps):
        a = rng.integers(0, 2, 8)
        tr.actions(a)
        out = [b.step(a[first:first + n]) for b, (first, n) in zip(batches, sizes)]
        obs, rew, te, trunc = (np.concatenate([o[j] for o in out]) for j in range(4))
        if faulty is not None and t == faulty[1]:
            rew = rew.copy()
            rew[faulty[0]] *= 2
        tr.step(obs, rew, te, trunc)
    for b in batches:
        b.close()
    tr.close()
    assert sorted(os.listdir(d)) == ["env-0-3.npz", "env-4-6.npz", "env-7.npz", "trainer.npz"]
    return d, os.path.join(d, "trainer.npz")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("batches")
    return {"clean": write_batches(str(base / "clean")), "faulty": write_batches(str(base / "faulty"), (5, 77))}


def test_batch_file_names_give_all_their_envs():
    assert env_indices_of("env-4-6.npz") == range(4, 7)
    assert env_indices_of("env-7.npz") == range(7, 8)
    assert env_indices_of("env-0-3.dup-0123abcd.npz") == range(0, 4)
    assert env_indices_of("env-2-5.copy-0a1b2c3d.npz") == range(2, 6)
    assert env_indices_of("trainer.npz") is None and env_indices_of("env-unindexed-00ff.npz") is None


@pytest.mark.parametrize("which, start", [("clean", "fork"), ("faulty", "fork"), ("faulty", "spawn")])
def test_workers_pair_batch_files_as_one_process_does(runs, which, start, workers_used, monkeypatch):
    """Forked workers read the files the parent opened; spawned ones (a second each to start) open them by name."""
    env_dir, trainer = runs[which]
    monkeypatch.setattr(parallel, "_context", lambda: multiprocessing.get_context(start))
    jobs = (2, 3) if start == "fork" else (2,)
    for count_all in (False, True) if start == "fork" else (True,):
        one = compare(env_dir, trainer, count_all=count_all, jobs=1)
        assert one.envs == list(range(8))
        if which == "clean":
            assert one.ok, one.lines()
        else:
            # one event a vector step and env (a step, or its next-step reset), after the first reset
            assert [(d.env, d.fields, d.event) for d in one.differences] == [(5, ("reward",), 78)], one.lines()
        for n in jobs:
            many = compare(env_dir, trainer, count_all=count_all, jobs=n)
            assert str(many) == str(one) and many.to_json() == one.to_json()
    assert workers_used == list(jobs) * (2 if start == "fork" else 1)


def test_the_command_with_jobs_prints_what_one_process_prints(runs):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, TESTS_DIR, env.get("PYTHONPATH")) if p)
    env_dir, trainer = runs["faulty"]
    got = [subprocess.run([sys.executable, "-c", _CLI, "compare", env_dir, trainer, "--jobs", jobs],
                          capture_output=True, text=True, env=env, timeout=180) for jobs in ("1", "2")]
    assert got[0].returncode == got[1].returncode == 1, got[0].stderr
    assert got[0].stdout == got[1].stdout and "env 5" in got[0].stdout


def test_a_batch_file_of_another_run_leaves_all_its_envs_out(runs, tmp_path, workers_used):
    """env-4-6.npz replaced by the same batch of another run: envs 4, 5 and 6 are not compared (a line says why),
    with workers as in one process."""
    env_dir, trainer = runs["clean"]
    d = str(tmp_path / "mixed")
    shutil.copytree(env_dir, d)
    other = write_batches(str(tmp_path / "other"), run="another-run-id")[0]
    shutil.copy(os.path.join(other, "env-4-6.npz"), os.path.join(d, "env-4-6.npz"))
    one = compare(d, os.path.join(d, "trainer.npz"), jobs=1)
    assert one.envs == [0, 1, 2, 3, 7] and one.ok, one.lines()
    assert any("env-4-6.npz" in n for n in one.notes), one.notes
    many = compare(d, os.path.join(d, "trainer.npz"), jobs=2)
    assert str(many) == str(one) and many.to_json() == one.to_json()
