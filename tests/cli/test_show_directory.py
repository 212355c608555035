"""``stepledger show DIR`` shows a directory as a directory: one line per ledger, times as dates, streams with no
events counted and not listed, plurals right; ``--json`` gives {"ledgers": [...]}. Real gymnasium runs."""

import copy
import functools
import json
import os
import re
import subprocess
import sys

import gymnasium as gym
import numpy as np

from stepledger import LedgerEnv, LedgerVectorEnv, TrainerLedger
from stepledger.format import schema as S

DATE = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def show(*args):
    proc = subprocess.run([sys.executable, "-m", "stepledger", "show", *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def cartpole(index, directory):
    return LedgerEnv(gym.make("CartPole-v1"), directory, index=index)


def run(d):
    """Two CartPoles on both sides (one vector step), a copy of env 0 that took a reset, a trainer ledger sized for
    64 envs of which 2 recorded (as stepledger.rllib's is)."""
    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([functools.partial(cartpole, i, d) for i in range(2)]),
                           os.path.join(d, "trainer.npz"))
    envs.reset(seed=0)
    envs.step(np.array([0, 1]))
    twin = copy.deepcopy(envs.unwrapped.envs[0])
    twin.reset(seed=1)
    twin.close()
    envs.close()
    space = gym.make("CartPole-v1")
    wide = TrainerLedger(os.path.join(d, "learner.npz"), 64, space.observation_space, space.action_space)
    mask = np.zeros(64, bool)
    mask[:2] = True
    wide.reset(np.zeros((64, 4), np.float32), mask)
    wide.close()
    return os.path.basename(twin.ledger_path)


def test_show_a_directory_as_a_directory(tmp_path):
    d = str(tmp_path)
    copy_name = run(d)
    lines = show(d).splitlines()
    assert lines[0] == "%s: a directory of 3 env ledgers and 2 trainer ledgers, 11 events" % d, lines
    body = lines[1:]
    assert len(body) == 5, lines  # one line per ledger
    by_name = {line.split(":")[0].strip(): line for line in body}
    assert set(by_name) == {"env-0.npz", "env-1.npz", copy_name, "learner.npz", "trainer.npz"}, by_name
    assert re.fullmatch(r"  env-0\.npz: env 0, 2 events \(1 episode started, 1 step\), closed, %s to \d\d:\d\d:\d\d, "
                        r"process %d" % (DATE, os.getpid()), by_name["env-0.npz"]), by_name["env-0.npz"]
    assert by_name[copy_name].startswith("  %s: a copy of env 0's LedgerEnv (unpickled or deep-copied), 1 event, "
                                         "closed, " % copy_name), by_name[copy_name]
    assert by_name["learner.npz"].startswith("  learner.npz: trainer side, 64 streams (62 with no events), 2 events, "
                                             "closed, "), by_name["learner.npz"]
    assert by_name["trainer.npz"].startswith("  trainer.npz: trainer side, 2 streams, 4 events, closed, ")
    for line in body:
        assert re.search(DATE, line) and not re.search(r"\b1\d{9}(\.\d+)?\b", line), line  # dates, no raw epochs
        assert not re.search(r"\b1 (events|streams|steps|episodes)\b", line), line


def test_show_a_directory_as_json(tmp_path):
    d = str(tmp_path)
    copy_name = run(d)
    data = json.loads(show(d, "--json"))
    assert data["path"] == d and "meta" not in data and "streams" not in data
    ledgers = {led["name"]: led for led in data["ledgers"]}
    assert sorted(ledgers) == sorted(["env-0.npz", "env-1.npz", copy_name, "learner.npz", "trainer.npz"])
    assert ledgers["env-0.npz"]["events"] == 2 and ledgers["env-0.npz"]["meta"][S.META_SIDE] == "env"
    assert ledgers[copy_name]["meta"][S.META_COPY] == S.COPY_PICKLED and ledgers[copy_name]["events"] == 1
    assert [s["env"] for s in ledgers["learner.npz"]["streams"]] == [0, 1]  # those with events
    assert ledgers["learner.npz"]["events"] == 2


def test_show_a_file_counts_its_empty_streams_and_gets_plurals_right(tmp_path):
    d = str(tmp_path)
    run(d)
    out = show(os.path.join(d, "learner.npz"))
    assert "  64 streams (62 with no events, not listed), 2 events" in out, out
    assert "  env 0: 1 event, 1 episode started, 0 steps" in out and "  env 1: 1 event" in out
    assert "env 2:" not in out and len(out.splitlines()) < 25, out
    assert re.search(r"  started: %s\n" % DATE, out) and re.search(r"  updated: %s\n" % DATE, out), out
    one = str(tmp_path / "one")
    env = cartpole(0, one)
    env.reset(seed=0)
    env.close()
    out = show(os.path.join(one, "env-0.npz"))
    assert "  1 stream, 1 event\n" in out and "  env 0: 1 event, 1 episode started, 0 steps" in out, out
    assert show(one).splitlines()[0] == "%s: a directory of 1 env ledger, 1 event" % one
