"""Tianshou issue 399 on tianshou 0.4.2 (the issue's version; tests/tianshou/test_tianshou_multiagent.py runs it in
a side venv with gym 0.23.1, NumPy 1.26 and pettingzoo 1.22.3): MultiAgentPolicyManager hands each agent's policy
only the rewards of its own transitions.

    python tests/tianshou/table_one_399_ts042.py DIR

tianshou 0.4.2 ships no PettingZoo adapter: its tic-tac-toe tutorial writes a ``MultiAgentEnv``, as this does,
around PettingZoo's turn-based tic-tac-toe with ``LedgerAECEnv`` inside (the env side). The trainer side is what
``MultiAgentPolicyManager.process_fn`` (the real one) hands each agent's ``RandomPolicy.process_fn`` on the whole
buffer, in order: each agent's transitions (its ``rew`` column, ``done``), a step closed by the agent's next
transition's ``obs`` and at its last one of an episode by ``obs_next``. Prints the versions and the report.
"""

import os
import sys
import warnings

import gym
import numpy as np
import tianshou
from pettingzoo.classic import tictactoe_v3
from tianshou.data import Collector, VectorReplayBuffer
from tianshou.env import DummyVectorEnv, MultiAgentEnv
from tianshou.policy import MultiAgentPolicyManager, RandomPolicy

from stepledger import TrainerLedger, compare
from stepledger.pettingzoo import LedgerAECEnv

warnings.simplefilter("ignore")
d = sys.argv[1]


class TicTacToe(MultiAgentEnv):
    """The tutorial's shape: obs {"agent_id" (1-based), "obs", "mask"}, a reward per agent, done."""

    def __init__(self):
        super().__init__()
        self.env = LedgerAECEnv(tictactoe_v3.env(), d, index=0)
        self.agents = list(self.env.possible_agents)
        self.observation_space = gym.spaces.Box(0, 1, (3, 3, 2), np.int8)
        self.action_space = gym.spaces.Discrete(9)

    def _obs(self):
        obs, _, term, trunc, _ = self.env.last()
        agent = self.env.agent_selection
        return {"agent_id": self.agents.index(agent) + 1, "obs": obs["observation"],
                "mask": obs["action_mask"] == 1}, bool(term or trunc)

    def reset(self):
        self.env.reset()
        return self._obs()[0]

    def step(self, action):
        self.env.step(int(action))
        obs, done = self._obs()
        return obs, np.array([self.env.rewards[a] for a in self.agents], np.float32), done, {}

    def seed(self, seed=None):
        return [seed]

    def close(self):
        self.env.close()


np.random.seed(1)  # RandomPolicy draws from NumPy's global generator: with 1, player_2 wins the first game
envs = DummyVectorEnv([TicTacToe])
handed = {}


def tap(policy):
    plain = policy.process_fn

    def process_fn(batch, buffer, indice):
        handed[policy.agent_id] = (batch, indice)
        return plain(batch, buffer, indice)
    policy.process_fn = process_fn
    return policy


manager = MultiAgentPolicyManager([tap(RandomPolicy()), tap(RandomPolicy())])
buffer = VectorReplayBuffer(2000, 1)
collector = Collector(manager, envs, buffer)
collector.collect(n_episode=6)
envs.close()  # writes the env ledger
batch, indice = buffer.sample(0)
order = np.argsort(indice)
batch, indice = batch[order], indice[order]
manager.process_fn(batch, buffer, indice)  # the real split: each agent's policy gets its transitions

space = tictactoe_v3.env().observation_space("player_1")
ledger = TrainerLedger(os.path.join(d, "trainer.npz"), 2, space, tictactoe_v3.env().action_space("player_1"))
episode_of = np.concatenate([[0], np.cumsum(batch.done[:-1])])  # the env's episode of each transition
where = {int(i): k for k, i in enumerate(indice)}


def as_env(obs, mask):
    return {"action_mask": np.asarray(mask).astype(np.int8), "observation": np.asarray(obs)}


for agent_id, (b, ind) in sorted(handed.items()):
    s = agent_id - 1
    eps = np.array([episode_of[where[int(i)]] for i in ind])
    for j in range(len(ind)):
        if j == 0 or eps[j] != eps[j - 1]:
            ledger.env_reset(s, as_env(b.obs.obs[j], b.obs.mask[j]))
        last = j + 1 == len(ind) or eps[j + 1] != eps[j]
        nxt = (as_env(b.obs_next.obs[j], b.obs_next.mask[j]) if last else
               as_env(b.obs.obs[j + 1], b.obs.mask[j + 1]))
        ledger.env_steps(s, np.array([b.act[j]]), {k: v[None] for k, v in nxt.items()}, np.array([b.rew[j]]),
                         np.array([bool(b.done[j])]), np.array([False]))
ledger.close()
print("tianshou", tianshou.__version__, "gym", gym.__version__, "numpy", np.__version__)
print(compare(d, os.path.join(d, "trainer.npz")))
