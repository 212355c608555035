"""Transparent under what the libraries allow: Gymnasium's observation_mode="different",
kept values of the wrong shape, and the vector env's whole API through the ledgers."""

import functools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces as gs

from stepledger import LedgerEnv, LedgerVectorEnv, compare, read
from stepledger.errors import LedgerError

from trainer_envs import ScriptedEnv, assert_clean, make_ledger_env

MODES = ("NextStep", "SameStep")


# ---------------------------------------------------------------- observation_mode="different"

def _bounded_space(i, kind):
    """Env i's observation space: the same dtype, shape and structure for every i, other bounds."""
    box = gs.Box(-(i + 1.0), i + 1.0, shape=(3,), dtype=np.float32)
    if kind == "box":
        return box
    if kind == "dict":
        return gs.Dict({"pos": box, "id": gs.Discrete(3 + i), "cells": gs.MultiDiscrete([2 + i, 4])})
    raise ValueError(kind)


def _make_bounded(directory, i, kind, **kwargs):
    return make_ledger_env(directory, i, obs_space=_bounded_space(i, kind), lengths=(2 + i,), **kwargs)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ("box", "dict"))
@pytest.mark.parametrize("vector", ("sync", "async"))
def test_observation_mode_different_compares_clean(tmp_path, vector, kind, mode):
    d = str(tmp_path)
    fns = [functools.partial(_make_bounded, d, i, kind) for i in range(3)]
    cls = gym.vector.SyncVectorEnv if vector == "sync" else gym.vector.AsyncVectorEnv
    venv = cls(fns, observation_mode="different", autoreset_mode=gym.vector.AutoresetMode(mode))
    envs = LedgerVectorEnv(venv, d + "/trainer.npz")
    envs.reset(seed=0)
    envs.action_space.seed(0)
    for _ in range(12):
        envs.step(envs.action_space.sample())
    envs.close()
    assert assert_clean(d, d + "/trainer.npz", n_envs=3) > 30
    ledger = read(d)
    try:  # each env's stream keeps its own space description, bounds included
        highs = [ledger.streams[i].meta["observation_space"] for i in range(3)]
        if kind == "box":
            assert [h["high"] for h in highs] == [1.0, 2.0, 3.0]
    finally:
        ledger.close()


def _one_env_ledger(directory, index, space):
    env = LedgerEnv(ScriptedEnv(obs_space=space, lengths=(2,)), directory, index=index)
    env.reset(seed=index)
    env.step(env.action_space.sample())
    env.close()


@pytest.mark.parametrize("other,what", [
    (gs.Box(-1, 1, shape=(3,), dtype=np.float64), "dtype"),
    (gs.Box(-1, 1, shape=(4,), dtype=np.float32), "shape"),
    (gs.Dict({"pos": gs.Box(-1, 1, shape=(3,), dtype=np.float32)}), "structure"),
    (gs.Discrete(3), "type"),
])
def test_env_ledgers_whose_spaces_differ_in_what_is_digested_are_refused(tmp_path, other, what):
    d = str(tmp_path)
    _one_env_ledger(d, 0, gs.Box(-1, 1, shape=(3,), dtype=np.float32))
    _one_env_ledger(d, 1, other)
    with pytest.raises(LedgerError) as err:
        read(d).close()
    assert "env-1.npz was recorded with other settings than the other env ledgers" in str(err.value)


def test_a_trainer_space_with_other_bounds_compares_and_another_dtype_is_refused(tmp_path):
    d = str(tmp_path)
    _one_env_ledger(d, 0, gs.Box(-1, 1, shape=(3,), dtype=np.float32))
    _one_env_ledger(d, 1, gs.Box(-5, 5, shape=(3,), dtype=np.float32))
    for high, dtype, ok in ((7.0, np.float32, True), (1.0, np.float64, False)):
        space = gs.Box(-high, high, shape=(3,), dtype=dtype)
        fns = [functools.partial(ScriptedEnv, obs_space=space, lengths=(2,)) for _ in range(2)]
        envs = LedgerVectorEnv(gym.vector.SyncVectorEnv(fns), d + "/trainer.npz")
        envs.reset(seed=0)
        envs.step(envs.action_space.sample())
        envs.close()
        if ok:
            compare(d, d + "/trainer.npz")  # settings accepted (values differ: other envs)
        else:
            with pytest.raises(LedgerError) as err:
                compare(d, d + "/trainer.npz")
            assert "different observation spaces" in str(err.value)
