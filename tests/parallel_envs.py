"""Small PettingZoo parallel envs for the multi-agent tests, each a script of when its agents end.

Each agent sees ``[its number + obs_offset, t] / obs_divisor`` (a Box of two float32), acts in
Discrete(3) and gets ``reward(agent, actions)``. A subclass says when agents end (``ends``), which
agents start an episode (``agents_at_reset``) and which join at a step (``joining``).
"""

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

AGENTS = ("agent_0", "agent_1", "agent_2")


class ScriptedParallelEnv(ParallelEnv):
    metadata = {"name": "scripted_parallel_v0"}
    render_mode = None
    possible = AGENTS
    agents_at_reset = None  # None: every possible agent
    obs_offset, obs_divisor, bound = 1, 1, 10.0

    def __init__(self):
        self.possible_agents = list(self.possible)
        self._space = spaces.Box(-self.bound, self.bound, (2,), np.float32)

    def observation_space(self, agent):
        return self._space

    def action_space(self, agent):
        return spaces.Discrete(3)

    def _obs(self, agent):
        return np.array([self.possible_agents.index(agent) + self.obs_offset, self.t], np.float32) / self.obs_divisor

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = list(self.agents_at_reset or self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def joining(self):
        """Agents that join at this step: their first observation comes with it."""
        return []

    def ends(self, live):
        """(terminations, truncations) of the agents ``live`` at this step, t counted from 1."""
        raise NotImplementedError

    def reward(self, agent, actions):
        return 1.0

    def step(self, actions):
        self.t += 1
        live = list(self.agents) + self.joining()
        terms, truncs = self.ends(live)
        obs = {a: self._obs(a) for a in live}
        rewards = {a: self.reward(a, actions) for a in live}
        self.agents = [a for a in live if not terms[a] and not truncs[a]]
        return obs, rewards, terms, truncs, {a: {} for a in live}


class TwoLeaveApart(ScriptedParallelEnv):
    """agent_1 terminates after 2 steps, agent_0 is truncated after 4: agents that leave at different steps."""
    metadata = {"name": "two_leave_apart_v0"}
    possible = AGENTS[:2]
    obs_divisor, bound = 10, 1.0

    def ends(self, live):
        return ({a: a == "agent_1" and self.t == 2 for a in live}, {a: a == "agent_0" and self.t == 4 for a in live})


class LeavingEnv(TwoLeaveApart):
    """As TwoLeaveApart, and agent_2 joins at step 1."""
    metadata = {"name": "leaving_v0"}
    possible = AGENTS
    agents_at_reset = AGENTS[:2]
    obs_offset = 0

    def joining(self):
        return ["agent_2"] if self.t == 1 else []

    def reward(self, agent, actions):
        return float(actions.get(agent, 0))


class LeavesApart(ScriptedParallelEnv):
    """agent_1 terminates after 2 steps while agent_0 and agent_2 go on until they terminate after 5."""
    metadata = {"name": "leaves_apart_v0"}

    def ends(self, live):
        return {a: a == "agent_1" and self.t == 2 or self.t == 5 for a in live}, {a: False for a in live}

    def reward(self, agent, actions):
        return 1.0 + float(actions[agent])


class TogetherEnv(ScriptedParallelEnv):
    """Three agents that terminate together after 3, 4 or 5 steps: episodes end by termination only."""
    metadata = {"name": "together_v0"}

    def __init__(self):
        super().__init__()
        self.episode = -1

    def _obs(self, agent):
        return np.array([self.possible_agents.index(agent) + 1, self.t + 0.5 * self.episode], np.float32)

    def reset(self, seed=None, options=None):
        self.episode += 1
        return super().reset(seed=seed, options=options)

    def ends(self, live):
        done = self.t >= 3 + self.episode % 3
        return {a: done for a in live}, {a: False for a in live}

    def reward(self, agent, actions):
        return float(actions[agent]) / 4
