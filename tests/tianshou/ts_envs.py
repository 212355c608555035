"""Small envs and a rollout for the Tianshou tests (module level: Tianshou's workers get them by pickling)."""

import numpy as np
import gymnasium as gym
from gymnasium import spaces


class DictCounter(gym.Env):
    """A Dict observation that counts the steps: {"a": [t, -t], "b": [10 t]}; episodes of 5 steps."""

    def __init__(self, length=5):
        self.observation_space = spaces.Dict({"a": spaces.Box(-100, 100, (2,), np.float32),
                                              "b": spaces.Box(-100, 100, (1,), np.float32)})
        self.action_space = spaces.Box(-1, 1, (1,), np.float32)
        self.t, self.length = 0, length

    def _obs(self):
        return {"a": np.array([self.t, -self.t], np.float32), "b": np.array([10 * self.t], np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= self.length, False, {}


class BoxCounter(DictCounter):
    """The same count in a Box observation: [t, -t]."""

    def __init__(self, length=5):
        super().__init__(length)
        self.observation_space = spaces.Box(-100, 100, (2,), np.float32)

    def _obs(self):
        return np.array([self.t, -self.t], np.float32)


class TwoAgentCounter(BoxCounter):
    """BoxCounter with one reward per agent, as Tianshou's multi-agent tests give them: [1.0, 1.0]."""

    def step(self, action):
        obs, _, terminated, truncated, info = super().step(action)
        return obs, np.ones(2), terminated, truncated, info


class StackedCounter:
    """gymnasium's FrameStackObservation(BoxCounter(), 4), for issue 1272."""

    def __call__(self):
        return gym.wrappers.FrameStackObservation(BoxCounter(length=6), 4)


def pendulum(max_episode_steps=25):
    return gym.make("Pendulum-v1", max_episode_steps=max_episode_steps)


def vector_env(kind, fns):
    from tianshou.env import DummyVectorEnv, ShmemVectorEnv, SubprocVectorEnv
    return {"dummy": DummyVectorEnv, "subproc": SubprocVectorEnv, "shmem": ShmemVectorEnv}[kind](fns)


def random_collector(venv, directory, buffer=None, **kwargs):
    """A LedgerCollector with Tianshou's RandomActionPolicy (its map_action clips a Box's samples to [-1, 1])."""
    from tianshou.algorithm.algorithm_base import RandomActionPolicy
    from tianshou.data import VectorReplayBuffer

    from stepledger.tianshou import LedgerCollector
    n = len(venv)
    buffer = VectorReplayBuffer(2000 * n, n) if buffer is None else buffer
    # the Collector's random actions are each env's action_space.sample(): seeded, so that a run (and whether
    # a 1% dose meets an opportunity in it) is the same every time (in-process envs' spaces are the envs' own)
    for i, space in enumerate(venv.action_space):
        space.seed(i)
    return LedgerCollector(RandomActionPolicy(venv.action_space[0]), venv, buffer,
                           path="%s/trainer.npz" % directory, **kwargs)
