"""Runs one faulty or clean rollout through a real harness, for the detection matrix.

Harnesses: AsyncVectorEnv under NEXT_STEP and SAME_STEP, SB3 SubprocVecEnv.
Env-side faults are injected by FaultyEnv in the workers, swaps by the
trainer-side injectors. Each env writes where its fault first changed a value.
"""

import functools
import os
import warnings

import gymnasium as gym
import numpy as np

from stepledger import LedgerEnv, LedgerVectorEnv, compare
from stepledger.faults import FaultyEnv, FaultyVectorEnv, read_record

HARNESSES = ("async-next", "async-same", "sb3-subproc")
N_ENVS = 2
DOSES = ("one", 0.01, "all")  # one event, 1% of opportunities, every opportunity


def steps_for(fault, dose):
    """Vector steps enough that a 1% dose meets an opportunity: episode-end faults have few."""
    if dose != 0.01:
        return 60
    ends = fault.split(":")[0] in ("final-obs", "terminated", "truncated")
    return 3000 if ends else 400


def env_for(fault):
    """Pendulum (Box actions, time limits) unless the fault needs terminations or integer actions."""
    if fault and fault.split(":")[0] == "terminated" and fault != "terminated:spurious":
        return "CartPole-v1", 200
    return "Pendulum-v1", 9


def make_env(i, directory, env_id, limit, fault, dose, seed, live=False):
    env = gym.make(env_id, max_episode_steps=limit)
    env = LedgerEnv(env, directory, index=i, live=live)
    if fault is not None:
        env = FaultyEnv(env, fault, index=i, dose=dose, at=7, target=N_ENVS - 1, seed=seed,
                        record=os.path.join(directory, "fault-%d.json" % i))
    return env


def rollout(directory, harness, fault=None, dose="one", steps=60, seed=3, env_id=None, live=False):
    """Run the rollout; returns (report, {env: first change}), and the live faults if ``live``."""
    default_id, limit = env_for(fault)
    env_id = env_id or default_id
    trainer_side = fault is not None and fault.endswith(":swap")
    env_fault = None if trainer_side else fault
    fns = [functools.partial(make_env, i, directory, env_id, limit, env_fault, dose, seed, live) for i in range(N_ENVS)]
    live_kw = {"live": True, "on_fault": "record"} if live else {}
    trainer_file = os.path.join(directory, "trainer.npz")
    injector = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if harness.startswith("async"):
            mode = gym.vector.AutoresetMode.NEXT_STEP if harness == "async-next" else gym.vector.AutoresetMode.SAME_STEP
            venv = gym.vector.AsyncVectorEnv(fns, autoreset_mode=mode, context="fork")
            if trainer_side:
                venv = injector = FaultyVectorEnv(venv, fault, dose=dose, at=7, target=N_ENVS - 1, seed=seed)
            venv = LedgerVectorEnv(venv, trainer_file, **live_kw)
            space = venv.single_action_space
        else:
            from stable_baselines3.common.vec_env import SubprocVecEnv

            from stepledger.faults import FaultyVecEnv
            from stepledger.sb3 import LedgerVecEnv
            venv = SubprocVecEnv(fns, start_method="fork")
            if trainer_side:
                venv = injector = FaultyVecEnv(venv, fault, dose=dose, at=7, target=N_ENVS - 1, seed=seed)
            venv = LedgerVecEnv(venv, trainer_file, **live_kw)
            space = venv.action_space
        space.seed(seed)
        actions = [np.stack([space.sample() for _ in range(N_ENVS)]) for _ in range(steps)]
        try:
            if harness.startswith("async"):
                venv.reset(seed=seed)
            else:
                venv.seed(seed)
                venv.reset()
            for a in actions:
                venv.step(a)
        finally:
            live_faults = list(venv.live_faults)
            venv.close()
    if injector is not None:
        firsts = dict(injector.where.by_env)
    else:
        firsts = {}
        for i in range(N_ENVS):
            rec = read_record(os.path.join(directory, "fault-%d.json" % i))
            if rec is not None:
                firsts[i] = rec
    report = compare(directory, trainer_file)
    return (report, firsts, live_faults) if live else (report, firsts)


def assert_located(report, firsts, n_envs=N_ENVS):
    """Every env a fault hit (``firsts``: env -> where it first changed a value) has compare's difference
    located there (``is_located``), and every other env compares clean."""
    from stepledger.faults.check import is_located
    assert firsts, "the fault was never injected: no opportunity in this rollout"
    assert not report.ok
    by_env = report.by_env()
    for env, first in firsts.items():
        d = by_env.get(env)
        assert d is not None, "env %d was hit (%s) but compare found no difference:\n%s" % (env, first, report)
        assert is_located(d, first), "env %d hit at %s, compare said: %s" % (env, first, d.line())
    for env in set(range(n_envs)) - set(firsts):  # envs the fault never touched compare clean
        assert env not in by_env, by_env[env].line()
