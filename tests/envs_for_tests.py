"""Small deterministic envs for the env-side tests, importable by spawn and
forkserver workers: a worker builds its env from a module-level function of
this module called with picklable arguments (use functools.partial)."""

import functools

import gymnasium as gym
import numpy as np
from gymnasium import spaces as gs

from stepledger import LedgerEnv, LedgerVectorEnv


def obs_value(episode, t):
    """The observation CountEnv gives at step t of an episode (t = 0 is the reset)."""
    return np.array([episode, t, episode * 100 + t], dtype=np.float32)


class CountEnv(gym.Env):
    """Box(3,) float32 observations that count; episodes of ``length`` steps.

    The last step of an episode is terminated if ``terminate`` else
    truncated. ``reuse=True`` returns one array, mutated in place each call,
    the way some envs do. ``reward`` of step t is t + 0.5.
    """

    metadata = {"render_modes": []}

    def __init__(self, length=5, terminate=True, reuse=False, action_space=None):
        self.observation_space = gs.Box(-1e6, 1e6, shape=(3,), dtype=np.float32)
        self.action_space = action_space if action_space is not None else gs.Discrete(3)
        self.length, self.terminate, self.reuse = length, terminate, reuse
        self.episode, self.t = -1, 0
        self._buf = np.zeros(3, dtype=np.float32)

    def _obs(self):
        value = obs_value(self.episode, self.t)
        if self.reuse:
            self._buf[:] = value
            return self._buf
        return value

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {"episode": self.episode}

    def step(self, action):
        self.t += 1
        end = self.t >= self.length
        return (self._obs(), float(self.t) + 0.5, end and self.terminate, end and not self.terminate,
                {"t": self.t})


def step_count_env(env, steps=1, action=0):
    """``steps`` steps of a ledger wrapped around a CountEnv, with a reset after each episode's end; returns
    how many events that recorded (each step and each reset)."""
    events = 0
    for _ in range(steps):
        env.step(action)
        events += 1
        if env.env.unwrapped.t >= env.env.unwrapped.length:
            env.reset()
            events += 1
    return events


class ScriptedEnv(gym.Env):
    """Returns the given (obs, reward, terminated, truncated) tuples in turn; reset gives ``reset_obs``."""

    metadata = {"render_modes": []}

    def __init__(self, observation_space, action_space, reset_obs, steps):
        self.observation_space, self.action_space = observation_space, action_space
        self.reset_obs, self.steps, self.i = reset_obs, list(steps), 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.reset_obs, {}

    def step(self, action):
        obs, reward, terminated, truncated = self.steps[self.i % len(self.steps)]
        self.i += 1
        return obs, reward, terminated, truncated, {}


class RandomEnv(gym.Env):
    """Seeded random observations and rewards of any space; episodes of random length."""

    metadata = {"render_modes": []}

    def __init__(self, observation_space, action_space, seed=0, max_len=7):
        self.observation_space, self.action_space = observation_space, action_space
        self.rng = np.random.default_rng(seed)
        self.observation_space.seed(seed)
        self.max_len, self.left = max_len, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.left = int(self.rng.integers(1, self.max_len + 1))
        return self.observation_space.sample(), {}

    def step(self, action):
        self.left -= 1
        end = self.left <= 0
        term = bool(end and self.rng.random() < 0.5)
        trunc = bool(end and not term) or bool(self.rng.random() < 0.05)
        return self.observation_space.sample(), float(self.rng.normal()), term, trunc, {}


def make_count_env(index, directory, length=5, keep_values=False):
    return LedgerEnv(CountEnv(length=length), directory, index=index, keep_values=keep_values)


def make_count_env_spilling(index, directory, memory_limit, length=5):
    """A LedgerEnv whose process spills past ``memory_limit`` bytes (set in the worker)."""
    from stepledger import core
    core.set_memory_limit(memory_limit)
    return LedgerEnv(CountEnv(length=length), directory, index=index)


def mixed_space():
    """A nested Dict/Tuple observation space with every supported leaf type."""
    return gs.Dict({
        "pos": gs.Box(-1, 1, shape=(3,), dtype=np.float32),
        "img": gs.Box(0, 255, shape=(4, 4, 3), dtype=np.uint8),
        "mode": gs.Discrete(4, start=-1),
        "bits": gs.MultiBinary(5),
        "nested": gs.Tuple((gs.MultiDiscrete([3, 5]), gs.Box(-2, 2, shape=(), dtype=np.float64))),
    })


def make_random_env(index, directory, seed=0, keep_values=False, reward_dtype=np.float32):
    env = RandomEnv(mixed_space(), gs.Box(-1, 1, shape=(2,), dtype=np.float32), seed=seed)
    return LedgerEnv(env, directory, index=index, keep_values=keep_values, reward_dtype=reward_dtype)


def run_random_episodes(directory, seed=0, keep_values=False, reward_dtype=np.float32, steps=300, index=0):
    """Record ``steps`` random steps (with resets) through a LedgerEnv; return the ledger path."""
    env = make_random_env(index, directory, seed=seed, keep_values=keep_values, reward_dtype=reward_dtype)
    env.action_space.seed(seed)
    env.reset(seed=seed)
    for _ in range(steps):
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()
    env.close()
    return env.ledger_path


def record_cartpole_run(directory, steps, n=2):
    """Both ledgers around a SyncVectorEnv of n CartPole-v1 envs (a path or a URL), stepped ``steps`` times
    with random actions and closed: env-N.npz and trainer.npz in ``directory``."""
    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv(
        [functools.partial(lambda i: LedgerEnv(gym.make("CartPole-v1"), directory, index=i), i) for i in range(n)]),
        directory + "/trainer.npz")
    envs.reset(seed=0)
    for _ in range(steps):
        envs.step(envs.action_space.sample())
    envs.close()
