"""Tianshou's multi-agent path on a turn-based env: PettingZooEnv around LedgerAECEnv in each env
(ledger_pettingzoo_env_fns), a MultiAgentOffPolicyAlgorithm's policy and LedgerMultiAgentCollector, on
PettingZoo's tic-tac-toe (issue 26). Tianshou 2.0.1 still drops the reward an agent earns while its opponent
moves (Tianshou issue 399): the loser's -1 comes with the winner's move, in the winner's transition."""

import os

import numpy as np
import pytest

pytest.importorskip("tianshou")
pytest.importorskip("pettingzoo")

from pettingzoo.classic import tictactoe_v3  # noqa: E402
from tianshou.algorithm.multiagent.marl import MultiAgentOffPolicyAlgorithm  # noqa: E402
from tianshou.algorithm.random import MARLRandomDiscreteMaskedOffPolicyAlgorithm  # noqa: E402
from tianshou.data import VectorReplayBuffer  # noqa: E402
from tianshou.env import DummyVectorEnv, PettingZooEnv, SubprocVectorEnv  # noqa: E402

from stepledger import compare, read  # noqa: E402
from stepledger.format import schema as S  # noqa: E402
from stepledger.tianshou import LedgerMultiAgentCollector, ledger_pettingzoo_env_fns  # noqa: E402


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
