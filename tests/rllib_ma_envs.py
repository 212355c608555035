"""Small multi-agent envs for the RLlib tests (tests/rllib_harness.py registers them with Ray): RLlib
``MultiAgentEnv``s of the tests' own (agents acting together, in turn, leaving and joining) and RLlib's
PettingZoo wrappers over a real PettingZoo env (``rps_v2``, its Discrete observation one-hot, so that RLlib's
default PPO module takes it)."""

import gymnasium as gym
import numpy as np
from ray.rllib.env.multi_agent_env import MultiAgentEnv

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Discrete(2)


class _Base(MultiAgentEnv):
    def __init__(self, config=None):
        super().__init__()
        config = dict(config or {})
        self.n = int(config.get("num_agents", 2))
        self.possible_agents = ["agent_%d" % k for k in range(self.n)]
        self.agents = list(self.possible_agents)
        self.observation_spaces = {a: OBS for a in self.possible_agents}
        self.action_spaces = {a: ACT for a in self.possible_agents}
        self.length = int(config.get("length", 10))
        self.rng = np.random.default_rng(0)

    def _obs(self):
        return self.rng.uniform(-1, 1, 3).astype(np.float32)


class Together(_Base):
    """Every agent acts at every step; an episode ends (terminated, or truncated at ``length``) for all."""

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t, self.end = 0, int(self.rng.integers(self.length // 2, self.length + 1))
        return {a: self._obs() for a in self.possible_agents}, {}

    def step(self, action_dict):
        self.t += 1
        obs = {a: self._obs() for a in action_dict}
        rewards = {a: float(action_dict[a]) + float(self.rng.normal()) for a in action_dict}
        over = self.t >= self.end
        return obs, rewards, {"__all__": over and self.end < self.length}, {"__all__": over and self.end >= self.length}, {}


class Turns(_Base):
    """The agents act in turn, one an env step; every step gives each agent a reward (a waiting agent's add up
    into its next step); the episode terminates for all after ``length`` steps."""

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        return {self.possible_agents[0]: self._obs()}, {}

    def step(self, action_dict):
        (agent,) = action_dict
        self.t += 1
        nxt = self.possible_agents[self.t % self.n]
        rewards = {a: float(self.rng.normal()) + (action_dict[a] if a == agent else 0.0) for a in self.possible_agents}
        over = self.t >= self.length
        obs = {a: self._obs() for a in self.possible_agents} if over else {nxt: self._obs()}
        return obs, rewards, {"__all__": over}, {"__all__": False}, {}


class ComingGoing(_Base):
    """Agents that leave and join (3 agents by default): the last agent joins at step 2; agent_1 leaves
    (terminated, with its last observation) at step 3; agent_0 leaves at step 5 with no observation; the
    episode ends at ``length``."""

    def __init__(self, config=None):
        super().__init__(dict({"num_agents": 3}, **dict(config or {})))

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.live = set(self.possible_agents[:-1])
        return {a: self._obs() for a in sorted(self.live)}, {}

    def step(self, action_dict):
        self.t += 1
        last = self.possible_agents[-1]
        obs, rewards, terms = {}, {}, {}
        for a in action_dict:
            rewards[a] = float(action_dict[a]) + float(self.rng.normal())
            if a == "agent_0" and self.t == 5:
                terms[a] = True  # leaves with no observation
                self.live.discard(a)
                continue
            obs[a] = self._obs()
            if a == "agent_1" and self.t == 3:
                terms[a] = True
                self.live.discard(a)
        if self.t == 2:
            self.live.add(last)
            obs[last] = self._obs()
        over = self.t >= self.length
        if over:
            obs.update({a: self._obs() for a in self.live if a not in obs})
        terms["__all__"] = over
        return obs, rewards, terms, {"__all__": False}, {}


def _one_hot_space(space):
    return gym.spaces.Box(0.0, 1.0, (int(space.n),), np.float32)


def _one_hot(value, n):
    out = np.zeros(n, np.float32)
    out[int(value)] = 1.0
    return out


def rps_parallel(config=None):
    """RLlib's ParallelPettingZooEnv over PettingZoo's rps_v2 parallel env (simultaneous moves)."""
    from pettingzoo.classic import rps_v2
    from pettingzoo.utils import BaseParallelWrapper
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv

    class OneHot(BaseParallelWrapper):
        def observation_space(self, agent):
            return _one_hot_space(self.env.observation_space(agent))

        def reset(self, seed=None, options=None):
            obs, infos = self.env.reset(seed=seed, options=options)
            return {a: _one_hot(o, 4) for a, o in obs.items()}, infos

        def step(self, actions):
            obs, rewards, terms, truncs, infos = self.env.step(actions)
            return {a: _one_hot(o, 4) for a, o in obs.items()}, rewards, terms, truncs, infos

    return ParallelPettingZooEnv(OneHot(rps_v2.parallel_env(max_cycles=int((config or {}).get("length", 10)))))


def rps_turns(config=None):
    """RLlib's PettingZooEnv over PettingZoo's rps_v2 AEC env: the players move in turn."""
    from pettingzoo.classic import rps_v2
    from pettingzoo.utils import BaseWrapper
    from ray.rllib.env.wrappers.pettingzoo_env import PettingZooEnv

    class OneHot(BaseWrapper):
        def observation_space(self, agent):
            return _one_hot_space(self.env.observation_space(agent))

        def observe(self, agent):
            return _one_hot(self.env.observe(agent), 4)

    return PettingZooEnv(OneHot(rps_v2.env(max_cycles=int((config or {}).get("length", 10)))))


def openspiel(config=None):
    """RLlib's OpenSpielEnv over an OpenSpiel game (tic_tac_toe unless ``game``): the players, 0 and 1, move
    in turn; the game's returns are each player's reward at every step, the winner's 1 at the move that ends
    it. (An illegal move is replaced by a random legal one, with a penalty: the env's own doing.)"""
    import pyspiel
    from ray.rllib.env.wrappers.open_spiel import OpenSpielEnv
    return OpenSpielEnv(pyspiel.load_game(str((config or {}).get("game", "tic_tac_toe"))))


ENVS = {"ma-together": Together, "ma-turns": Turns, "ma-coming-going": ComingGoing,
        "ma-rps-parallel": rps_parallel, "ma-rps-turns": rps_turns, "ma-openspiel": openspiel}


def shared_module(agent_id, episode, **kwargs):
    """policy_mapping_fn: every agent feeds one module, "shared"."""
    return "shared"


def own_module(agent_id, episode, **kwargs):
    """policy_mapping_fn: each agent its own module, named as the agent."""
    return str(agent_id)


def register():
    from ray.tune.registry import register_env
    for name, make in ENVS.items():
        register_env(name, make)
