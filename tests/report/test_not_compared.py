"""Trainer streams with no env ledger of their run are not compared, and not a difference, for either reason:
the run is still going (its env ledger has written nothing yet), or the env ledger there is another run's."""

import functools
import os

import gymnasium as gym
import numpy as np

import envs_for_tests as E
from stepledger import LedgerEnv, LedgerVectorEnv, compare


def _run(directory, n, steps):
    # no periodic spill within the test, however slow the machine: only the flushes it makes write
    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv(
        [functools.partial(LedgerEnv, E.CountEnv(length=4), directory, index=i, flush_interval=3600)
         for i in range(n)]), os.path.join(directory, "trainer.npz"), flush_interval=3600)
    envs.reset(seed=0)
    for _ in range(steps):
        envs.step(np.zeros(n, np.int64))
    return envs


def test_a_run_in_progress_whose_env_has_not_written_yet(tmp_path):
    d = str(tmp_path)
    envs = _run(d, 2, 10)
    try:
        envs.env.envs[0].flush()  # env 0 has written; env 1 not yet
        envs.ledger.flush()   # the trainer ledger, in progress
        report = compare(d, os.path.join(d, "trainer.npz"))
        assert report.ok and report.envs == [0] and report.differences == [], str(report)
        assert report.notes.count("env 1: no env ledger of this run yet (the trainer ledger is in progress, 11 "
                                  "events so far): not compared") == 1, report.notes
    finally:
        envs.close()
    assert compare(d, os.path.join(d, "trainer.npz")).envs == [0, 1]  # closed: both there


def test_an_env_ledger_of_another_run_is_one_line_also_while_the_run_goes_on(tmp_path):
    d = str(tmp_path)
    _run(d, 2, 20).close()  # an earlier run: env-0.npz, env-1.npz
    envs = _run(d, 2, 10)
    try:
        envs.env.envs[0].flush()  # this run's env 0; env-1.npz is still the earlier run's
        envs.ledger.flush()
        report = compare(d, os.path.join(d, "trainer.npz"))
        assert report.ok and report.envs == [0] and report.differences == [], str(report)
        about_env_1 = [n for n in report.notes if n.startswith(("env-1.npz", "env 1:"))]
        assert len(about_env_1) == 1 and about_env_1[0].startswith("env-1.npz is from another run (run "), \
            report.notes
        assert about_env_1[0].endswith(": not compared")
    finally:
        envs.close()
