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


# ---------------------------------------------------------------- kept values of another shape

class ScalarObsThenClean(gym.Env):
    """Box(3,) observations; at step 2 a scalar 1.5 instead (a shape fault of the env)."""

    metadata = {"render_modes": []}

    def __init__(self, at=2, length=40):
        self.observation_space = gs.Box(-10, 10, shape=(3,), dtype=np.float32)
        self.action_space = gs.Box(-1, 1, shape=(2,), dtype=np.float32)
        self.at, self.length, self.t = at, length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.float32(1.5) if self.t == self.at else np.full(3, self.t, np.float32)
        return obs, 0.25, self.t >= self.length, False, {}


def _kept(directory, i, **kwargs):
    return LedgerEnv(ScalarObsThenClean(**kwargs), directory, index=i, keep_values=True)


def test_kept_value_of_another_shape_is_printed_with_its_shape(tmp_path):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv
    from stepledger.sb3 import LedgerVecEnv
    d = str(tmp_path)
    # DummyVecEnv broadcasts the scalar into its (n, 3) buffer: the trainer receives [1.5, 1.5, 1.5]
    envs = LedgerVecEnv(DummyVecEnv([functools.partial(_kept, d, i) for i in range(2)]), d + "/t.npz",
                        keep_values=True)
    envs.reset()
    for _ in range(5):
        envs.step(np.zeros((2, 2), np.float32))
    envs.close()
    report = compare(d, d + "/t.npz")
    assert str(report).splitlines()[0] == (
        "env 0, episode 0, step 2: obs differs (env gave 1.5 (shape (), the space's is (3,)), "
        "trainer received [1.5, 1.5, 1.5])")
    assert "0.0" not in str(report)


class ReshapeAction(gym.vector.VectorWrapper):
    """Sends env 1 its action as shape (1, 2) at vector step ``at``, in a SyncVectorEnv-like way."""

    def __init__(self, env, at=3):
        super().__init__(env)
        self.t, self.at = 0, at

    def step(self, actions):
        self.t += 1
        if self.t == self.at:
            inner = self.env.unwrapped
            actions = np.asarray(actions)
            obs, rewards, terms, truncs, infos = [], [], [], [], []
            # step the sub-envs directly: env 1 receives its row as a (1, 2) array
            for i, env in enumerate(inner.envs):
                o, r, te, tr, _ = env.step(actions[i][None] if i == 1 else actions[i])
                obs.append(o), rewards.append(r), terms.append(te), truncs.append(tr)
            return (np.stack(obs), np.array(rewards), np.array(terms), np.array(truncs), {})
        return self.env.step(actions)


def test_kept_action_of_another_shape_on_the_env_side(tmp_path):
    d = str(tmp_path)
    fns = [functools.partial(_kept, d, i, at=99) for i in range(2)]
    envs = LedgerVectorEnv(ReshapeAction(gym.vector.SyncVectorEnv(fns)), d + "/t.npz", keep_values=True)
    envs.reset(seed=0)
    actions = np.array([[0.5, -0.25], [0.75, 0.125]], np.float32)
    for _ in range(4):
        envs.step(actions)
    envs.close()
    report = compare(d, d + "/t.npz")
    assert report.by_env()[1].fields == ("action",) and sorted(report.by_env()) == [1], str(report)
    assert str(report).splitlines()[0] == (
        "env 1, episode 0, step 3: action differs (env gave [[0.75, 0.125]] (shape (1, 2), the space's is "
        "(2,)), trainer received [0.75, 0.125])")


def test_kept_values_of_another_shape_survive_spills(tmp_path):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv
    from stepledger import core
    from stepledger.sb3 import LedgerVecEnv
    d = str(tmp_path)
    limit = core.memory_limit()
    core.set_memory_limit(3000)  # a few events: both sides spill again and again
    try:
        envs = LedgerVecEnv(DummyVecEnv([functools.partial(_kept, d, i, at=20 + 7 * i) for i in range(3)]),
                            d + "/t.npz", keep_values=True)
        envs.reset()
        for _ in range(45):
            envs.step(np.zeros((3, 2), np.float32))
        assert len(envs.ledger.recording.segments) >= 2  # it did spill
        envs.close()
    finally:
        core.set_memory_limit(limit)
    report = compare(d, d + "/t.npz")
    lines = str(report).splitlines()
    for i in range(3):
        assert lines[i] == ("env %d, episode 0, step %d: obs differs (env gave 1.5 (shape (), the space's is (3,)), "
                            "trainer received [1.5, 1.5, 1.5])" % (i, 20 + 7 * i)), str(report)
    ledger = read(d)
    try:  # the well-shaped kept values around it are intact
        for t in (20 + 7 * 2 - 1, 20 + 7 * 2 + 1):  # event t is step t of episode 0
            assert [r.tolist() for r in ledger.streams[2].value_rows("obs", t)] == [[float(t)] * 3]
    finally:
        ledger.close()


# ---------------------------------------------------------------- the vector env's API

class Probe(gym.Wrapper):
    """Sub-env attributes and methods for call/get_attr/set_attr to reach."""

    def __init__(self, env, index):
        super().__init__(env)
        self.label = "env-%d" % index
        self.calls = 0

    def bump(self, by=1):
        self.calls += by
        return self.label, self.calls


def _probe_env(directory, i):
    # LedgerEnv outermost, as it must be; Probe's attributes are reached through it
    return LedgerEnv(Probe(ScriptedEnv(lengths=(2, 3), seed=i), i), directory, index=i)


def _vector(kind, directory, n=3, mode="NextStep", **kwargs):
    fns = [functools.partial(_probe_env, directory, i) for i in range(n)]
    mode = gym.vector.AutoresetMode(mode)
    if kind == "sync":
        return gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
    return gym.vector.AsyncVectorEnv(fns, autoreset_mode=mode, **kwargs)


@pytest.mark.parametrize("kind", ("sync", "async"))
def test_call_get_attr_set_attr_reach_the_sub_envs(tmp_path, kind):
    d = str(tmp_path)
    bare = _vector(kind, str(tmp_path / "bare"))
    envs = LedgerVectorEnv(_vector(kind, d), d + "/trainer.npz")
    try:
        for venv in (bare, envs):
            assert venv.get_attr("label") == ("env-0", "env-1", "env-2")
            assert venv.call("bump", by=2) == (("env-0", 2), ("env-1", 2), ("env-2", 2))
            venv.set_attr("label", ["a", "b", "c"])
            assert venv.get_attr("label") == ("a", "b", "c")
            venv.set_attr("calls", 10)
            assert venv.call("bump") == (("a", 11), ("b", 11), ("c", 11))
        if kind == "async":
            envs.call_async("bump")
            assert envs.call_wait(timeout=60) == (("a", 12), ("b", 12), ("c", 12))
        envs.reset(seed=0)
        envs.step(envs.action_space.sample())
    finally:
        bare.close()
        envs.close()
    assert_clean(d, d + "/trainer.npz", n_envs=3)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("keep", (False, True), ids=("digests", "keep_values"))
def test_step_async_and_reset_async_are_recorded(tmp_path, mode, keep):
    """The split calls: actions taken in step_async, results in step_wait, as with step()."""
    d, e = str(tmp_path / "split"), str(tmp_path / "whole")
    paths = []
    for directory, split in ((d, True), (e, False)):
        fns = [functools.partial(make_ledger_env, directory, i, lengths=(1, 3, 2), ends=("term", "trunc"),
                                 keep_values=keep) for i in range(3)]
        venv = gym.vector.AsyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode(mode))
        envs = LedgerVectorEnv(venv, directory + "/trainer.npz", keep_values=keep)
        envs.action_space.seed(1)
        actions = [envs.action_space.sample() for _ in range(14)]
        try:
            for t, a in enumerate(actions):
                if t in (0, 7):
                    opts = {"reset_mask": np.array([True, False, True])} if t == 7 else None
                    if split:
                        envs.reset_async(seed=t if t == 0 else None, options=opts)
                        obs, _ = envs.reset_wait(timeout=60)
                    else:
                        obs, _ = envs.reset(seed=t if t == 0 else None, options=opts)
                if split:
                    envs.step_async(a)
                    out = envs.step_wait(timeout=60)
                else:
                    out = envs.step(a)
                assert len(out) == 5
        finally:
            envs.close()
        paths.append(directory + "/trainer.npz")
        assert assert_clean(directory, paths[-1], n_envs=3) > 30
    split_ledger, whole_ledger = read(paths[0]), read(paths[1])
    try:  # the split calls record exactly what step() and reset() record
        for i in range(3):
            a, b = split_ledger.streams[i].columns, whole_ledger.streams[i].columns
            assert all(np.array_equal(a[k], b[k]) for k in a)
    finally:
        split_ledger.close()
        whole_ledger.close()


class SendOther(gym.vector.VectorWrapper):
    """Between the ledger and the vector env: halves env 2's action in step_async at call ``at``."""

    def __init__(self, env, at=3):
        super().__init__(env)
        self.t, self.at = 0, at

    def step_async(self, actions):
        self.t += 1
        if self.t == self.at:
            actions = np.array(actions, copy=True)
            actions[2] *= 0.5
        self.env.step_async(actions)

    def step_wait(self, **kwargs):
        return self.env.step_wait(**kwargs)


def test_an_action_changed_after_step_async_is_located(tmp_path):
    from trainer_envs import assert_differs
    d = str(tmp_path)
    fns = [functools.partial(make_ledger_env, d, i, lengths=(20,)) for i in range(3)]
    envs = LedgerVectorEnv(SendOther(gym.vector.AsyncVectorEnv(fns)), d + "/trainer.npz",
                           autoreset_mode="next_step")
    envs.reset(seed=0)
    for _ in range(5):
        envs.step_async(envs.action_space.sample())
        envs.step_wait()
    envs.close()
    assert_differs(d, d + "/trainer.npz", {2: (3, ["h_act"])})


def test_split_calls_on_a_vector_env_without_them_say_so(tmp_path):
    envs = LedgerVectorEnv(_vector("sync", str(tmp_path)), str(tmp_path / "t.npz"))
    try:
        with pytest.raises(AttributeError, match=r"LedgerVectorEnv: the vector env it wraps \(SyncVectorEnv\) "
                                                 r"has no step_async\(\)"):
            envs.step_async(envs.action_space.sample())
        envs.reset(seed=0)  # nothing was taken by the refused call
        envs.step(envs.action_space.sample())
    finally:
        envs.close()
    assert_clean(str(tmp_path), str(tmp_path / "t.npz"))


def test_results_dropped_by_a_step_wait_timeout_show_as_a_difference(tmp_path):
    """AsyncVectorEnv gives up on a step_wait that times out, but its envs did step: the next
    step_wait returns those results for the next actions. The ledger records what the trainer
    got, so the action differs at that step."""
    import multiprocessing
    from trainer_envs import assert_differs
    d = str(tmp_path)
    fns = [functools.partial(_slow_env, d, i) for i in range(2)]
    envs = LedgerVectorEnv(gym.vector.AsyncVectorEnv(fns), d + "/trainer.npz")
    envs.reset(seed=0)
    envs.action_space.seed(0)
    envs.step_async(envs.action_space.sample())
    with pytest.raises(multiprocessing.TimeoutError):
        envs.step_wait(timeout=0.01)
    envs.step_async(envs.action_space.sample())  # the envs' step-1 results are still in the pipes
    envs.step_wait(timeout=60)
    envs.close()
    assert_differs(d, d + "/trainer.npz", {0: (1, ["h_act"]), 1: (1, ["h_act"])})


class _Slow(gym.Wrapper):
    def step(self, action):
        import time
        time.sleep(0.3)
        return self.env.step(action)


def _slow_env(directory, i):
    return LedgerEnv(_Slow(ScriptedEnv(lengths=(10,), seed=i)), directory, index=i)


# ---------------------------------------------------------------- SB3's VecEnv methods


@pytest.mark.parametrize("kind", ("dummy", "subproc"))
def test_sb3_env_method_get_attr_set_attr_env_is_wrapped_pass_through(tmp_path, kind):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv
    from stepledger.sb3 import LedgerVecEnv
    d = str(tmp_path)

    def make(cls_dir):
        fns = [functools.partial(_probe_env, cls_dir, i) for i in range(3)]
        return DummyVecEnv(fns) if kind == "dummy" else SubprocVecEnv(fns, start_method="fork")

    bare = make(str(tmp_path / "bare"))
    envs = LedgerVecEnv(make(d), d + "/trainer.npz")
    try:
        for venv in (bare, envs):
            assert venv.get_attr("label") == ["env-0", "env-1", "env-2"]
            assert venv.get_attr("label", indices=[2]) == ["env-2"]
            assert venv.env_method("bump", by=3) == [("env-0", 3), ("env-1", 3), ("env-2", 3)]
            assert venv.env_method("bump", indices=1) == [("env-1", 4)]
            venv.set_attr("label", "x", indices=[0, 2])
            assert venv.get_attr("label") == ["x", "env-1", "x"]
            assert venv.env_is_wrapped(LedgerEnv) == [True, True, True]
            assert venv.env_is_wrapped(Probe) == [True, True, True]
            assert venv.env_is_wrapped(Monitor, indices=[1]) == [False]
        envs.reset()
        envs.step(np.stack([envs.action_space.sample() for _ in range(3)]))
    finally:
        bare.close()
        envs.close()
    assert_clean(d, d + "/trainer.npz", n_envs=3)
