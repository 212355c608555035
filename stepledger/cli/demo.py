"""``stepledger demo``: a short AsyncVectorEnv run with faults injected in the workers.

It shows the report a user gets: three envs out of eight each change one
value on their way to the trainer, and compare names where. It records as
the ledgers do by default (digests of observations and actions, rewards and
flags exact); ``keep_values=True`` (``stepledger demo --keep-values``) also
keeps each observation and action, so that the report prints them.
"""

import functools
import os
import tempfile
import warnings

import gymnasium as gym
import numpy as np

from stepledger.report.compare import compare
from stepledger.gymnasium.env import LedgerEnv
from stepledger.gymnasium.faults import FaultyEnv
from stepledger.gymnasium.vector import LedgerVectorEnv

# env index -> (fault, step counter at which it may first hit)
DEMO_FAULTS = {1: ("reward:f16", 12), 3: ("obs:f16", 40), 4: ("truncated:as-term", 0)}


def make_env(index, directory, faults, keep_values):
    env = gym.make("Pendulum-v1", max_episode_steps=25)
    env = LedgerEnv(env, directory, index=index, keep_values=keep_values)  # env side: outermost in the worker
    if index in faults:  # ...except for the fault injector, which plays a faulty bridge
        fault, at = faults[index]
        env = FaultyEnv(env, fault, index=index, at=at, target=index)
    return env


def run(fault=True, n_envs=8, steps=100, directory=None, keep_values=False, seed=0):
    """Run the demo; returns (report, directory)."""
    directory = directory or tempfile.mkdtemp(prefix="stepledger-demo-")
    faults = DEMO_FAULTS if fault else {}
    fns = [functools.partial(make_env, i, directory, faults, keep_values) for i in range(n_envs)]
    trainer_file = os.path.join(directory, "trainer.npz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        envs = LedgerVectorEnv(gym.vector.AsyncVectorEnv(fns), trainer_file, keep_values=keep_values)
        envs.single_action_space.seed(seed)
        actions = np.stack([[envs.single_action_space.sample() for _ in range(n_envs)] for _ in range(steps)])
        envs.reset(seed=seed)
        for a in actions:
            envs.step(a)
        envs.close()
    return compare(directory, trainer_file), directory
