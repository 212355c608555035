"""The live check's counts in SB3's logger: a real PPO learn() writing CSV and JSON, read back."""

import csv
import functools
import json
import os
import re

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.logger import configure  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

from stepledger import LedgerEnv, read  # noqa: E402
from stepledger.faults import FaultyEnv, read_record  # noqa: E402
from stepledger.recording.live import METRIC_CHECKED, METRIC_FAULTS  # noqa: E402
from stepledger.sb3 import LedgerVecEnv, LogLiveCheck, StopOnBoundaryFault  # noqa: E402

N_STEPS = 64  # per env and rollout


def _make(i, record, at):
    env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=50), None, index=i, live=True)
    return FaultyEnv(env, "reward:f16", index=i, at=at, target=1, record=record) if i == 1 else env


def _learn(tmp_path, callback, at, on_fault="record", timesteps=640):
    record = str(tmp_path / "fault.json")
    trainer = str(tmp_path / "trainer.npz")
    venv = LedgerVecEnv(DummyVecEnv([functools.partial(_make, i, record, at) for i in range(2)]), trainer, live=True,
                        on_fault=on_fault, check_wrappers=False)  # FaultyEnv outside LedgerEnv: on purpose
    model = PPO("MlpPolicy", venv, n_steps=N_STEPS, batch_size=64, n_epochs=1, seed=0)
    logs = str(tmp_path / "logs")
    model.set_logger(configure(logs, ["csv", "json"]))
    model.learn(timesteps, callback=callback)
    venv.close()
    with read(trainer) as led:
        events = sum(len(s) for s in led.streams.values())
    with open(os.path.join(logs, "progress.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(logs, "progress.json")) as f:
        json_rows = [json.loads(line) for line in f if line.strip()]
    return model, rows, json_rows, events, read_record(record)


def test_log_live_check_puts_faults_and_events_checked_in_every_row(tmp_path):
    model, rows, json_rows, events, injected = _learn(tmp_path, LogLiveCheck(), at=200)
    assert injected is not None and model.num_timesteps == 640  # trained on past the fault ("record")
    assert len(rows) == 640 // (2 * N_STEPS)  # one row per rollout (log_interval=1)
    faults = [int(float(r[METRIC_FAULTS])) for r in rows]
    checked = [int(float(r[METRIC_CHECKED])) for r in rows]
    # the fault (env 1's step counter 200: its 201st event) falls in the fourth rollout of 64 steps an env
    assert faults == [0, 0, 0, 1, 1]
    # every event of both envs is checked: their steps, and their resets (one per 50 steps, and the first)
    assert checked == [2 * (64 * k + 1 + (64 * k) // 50) for k in range(1, 6)]
    assert checked[-1] == events  # the last row: every event the trainer ledger holds
    assert [(j[METRIC_FAULTS], j[METRIC_CHECKED]) for j in json_rows] == list(zip(faults, checked))


def test_stop_on_boundary_fault_writes_a_last_row_with_the_fault(tmp_path):
    stop = StopOnBoundaryFault()
    model, rows, json_rows, events, injected = _learn(tmp_path, stop, at=150, timesteps=4096)
    assert stop.fault is not None and model.num_timesteps == 2 * 151  # stopped right after the faulty step
    assert [int(float(r[METRIC_FAULTS])) for r in rows] == [0, 0, 1]  # two rollouts, then the row at the stop
    assert int(float(rows[-1][METRIC_CHECKED])) == events == 2 * (151 + 1 + 151 // 50)
    assert json_rows[-1][METRIC_FAULTS] == 1 and json_rows[-1]["time/total_timesteps"] == 302


def test_log_live_check_needs_a_live_ledger(tmp_path):
    venv = LedgerVecEnv(DummyVecEnv([lambda: LedgerEnv(gym.make("Pendulum-v1"), None, index=0, live=True)]),
                        str(tmp_path / "t.npz"))
    model = PPO("MlpPolicy", venv, n_steps=32, batch_size=32, n_epochs=1)
    with pytest.raises(ValueError, match=r"^LogLiveCheck: the model's VecEnv has no LedgerVecEnv\(\.\.\., live=True\)"):
        model.learn(32, callback=LogLiveCheck())
    venv.close()


def test_the_metric_names_are_documented_as_defined():
    text = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "LIVE.md"), encoding="utf-8").read()
    for name in (METRIC_FAULTS, METRIC_CHECKED):
        assert re.search(r"`%s`" % re.escape(name), text), name
    assert np.all([n.startswith("stepledger/") for n in (METRIC_FAULTS, METRIC_CHECKED)])
