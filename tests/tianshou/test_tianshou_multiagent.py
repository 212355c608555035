"""Tianshou's multi-agent path on a turn-based env: PettingZooEnv around LedgerAECEnv in each env
(ledger_pettingzoo_env_fns), a MultiAgentOffPolicyAlgorithm's policy and LedgerMultiAgentCollector, on
PettingZoo's tic-tac-toe (issue 26). Tianshou 2.0.1 still drops the reward an agent earns while its opponent
moves (Tianshou issue 399): the loser's -1 comes with the winner's move, in the winner's transition. So did
tianshou 0.4.2, the issue's version (in a side venv, through a MultiAgentEnv of its tutorial's shape)."""

import glob
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

pytest.importorskip("tianshou")
pytest.importorskip("pettingzoo")

from pettingzoo.classic import tictactoe_v3  # noqa: E402
from tianshou.algorithm.multiagent.marl import MultiAgentOffPolicyAlgorithm  # noqa: E402
from tianshou.algorithm.random import MARLRandomDiscreteMaskedOffPolicyAlgorithm  # noqa: E402
from tianshou.data import VectorReplayBuffer  # noqa: E402
from tianshou.env import DummyVectorEnv, PettingZooEnv, SubprocVectorEnv  # noqa: E402

import stepledger  # noqa: E402
from side_venv import cached_venv, imported_version  # noqa: E402
from stepledger import compare, read  # noqa: E402
from stepledger.tianshou import LedgerMultiAgentCollector, ledger_pettingzoo_env_fns  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.abspath(stepledger.__file__)))


def tianshou_games(d, vector=DummyVectorEnv, n_envs=2, episodes=6, seed=0):
    envs = vector(ledger_pettingzoo_env_fns(tictactoe_v3.env, n_envs, d))
    probe = PettingZooEnv(tictactoe_v3.env())
    algorithm = MultiAgentOffPolicyAlgorithm(
        algorithms=[MARLRandomDiscreteMaskedOffPolicyAlgorithm(probe.action_space) for _ in probe.agents], env=probe)
    np.random.seed(seed)  # the random agents draw from NumPy's global generator
    collector = LedgerMultiAgentCollector(algorithm.policy, envs, VectorReplayBuffer(2000, n_envs),
                                          path=os.path.join(d, "trainer.npz"))
    collector.reset()
    collector.collect(n_episode=episodes)
    collector.close()
    return compare(d, os.path.join(d, "trainer.npz")), probe.agents


@pytest.mark.parametrize("vector", [DummyVectorEnv, SubprocVectorEnv])
def test_tianshou_drops_the_reward_earned_during_the_opponents_move(tmp_path, vector):
    d = str(tmp_path)
    report, agents = tianshou_games(d, vector)
    text = str(report)
    lost = [x for x in report.differences if "reward" in x.fields]
    assert lost, text
    for x in report.differences:
        with read(os.path.join(d, "env-%d.npz" % (x.env // 2))) as led:
            cols = led.streams[x.env].columns
        row = int(np.flatnonzero((cols["episode"] == x.episode) & (cols["step"] == x.step))[0])
        assert cols["terminated"][row] or cols["truncated"][row], text  # every difference is an agent's last step
        if "reward" in x.fields:  # the agent that did not make the last move: its -1 and its end never reach it
            assert x.fields == ("obs", "reward", "terminated"), text
        else:  # the last mover: trained on its opponent's observation as its final one (obs_next)
            assert x.fields == ("obs",), text
    line = next(ln for ln in text.splitlines() if "reward" in ln)
    assert "reward: env gave -1.0, trainer received 0.0; terminated: env gave True, trainer received False" in line
    assert " left here (terminated) but the trainer was not told" in line


def test_the_same_games_through_a_hand_written_loop_compare_clean(tmp_path):
    """The clean control: the env side as in Tianshou's envs, the trainer side TurnLedger, same game."""
    from aec_games import run
    d = str(tmp_path)
    report, _, _ = run(d, tictactoe_v3.env, games=6)
    assert report.ok, str(report)
    with read(os.path.join(d, "env-0.npz")) as led:
        rewards = np.concatenate([led.streams[k].columns["h_rew"].astype(np.uint32).view(np.float32)
                                  for k in (0, 1)])
    assert (rewards == -1).any()  # a game was lost, with the -1 where the control carries it


# ---------------------------------------------------------------- tianshou 0.4.2, the version

TS042_VENV = os.environ.get("STEPLEDGER_TS042_VENV") or os.path.join(
    tempfile.gettempdir(), "stepledger-ts042-venv-py%d%d" % sys.version_info[:2])
# the CPU build of torch: the machine's wheel where it has one (PyPI's default build pulls CUDA, gigabytes)
TORCH_WHEELS = sorted(glob.glob("/opt/wheels/torch-*+cpu-cp%d%d-*.whl" % sys.version_info[:2]))


@pytest.fixture(scope="session")
def ts042_python():
    """A Python with tianshou==0.4.2 (it predates Gymnasium: gym 0.23.1, NumPy 1.x, pettingzoo 1.22.3 for the
    turn-based tic-tac-toe), in a venv cached at TS042_VENV."""
    if not TORCH_WHEELS:
        pytest.skip("no CPU wheel of torch on this machine for tianshou 0.4.2's venv")
    return cached_venv(TS042_VENV, "stepledger-ts042-ready", "tianshou==0.4.2",
                       [[TORCH_WHEELS[-1], "numpy<2"],
                        ["tianshou==0.4.2", "numpy<2", "gym==0.23.1", "pettingzoo==1.22.3"]],
                       lambda python: imported_version(python, "tianshou", "tianshou"), "0.4.2")


def test_tianshou_399_reproduced_on_0_4_2(tmp_path, ts042_python):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_") and k != "PYTHONPATH"}
    env.update(PYTHONPATH=REPO, STEPLEDGER_PUREPYTHON="1", PYTHONWARNINGS="ignore")
    out = subprocess.run([ts042_python, os.path.join(HERE, "table_one_399_ts042.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("tianshou 0.4.2 gym 0.23.1 numpy 1."), lines
    assert lines[1] == ("env 0, agent player_1, episode 0, step 4: obs, reward, terminated differ (reward: env gave "
                        "-1.0, trainer received 0.0; terminated: env gave True, trainer received False); agent "
                        "player_1 left here (terminated) but the trainer was not told"), out.stdout
