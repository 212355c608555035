"""The trainer side's less common paths, each a place where a changed line once went unnoticed:

- actions taken before the env stepped, with an env that edits its action array in place;
- a SAME_STEP vector env that reports ``final_obs`` as a dict of arrays (with ``_key`` masks);
- refusals made by stepledger itself: a ``reset_mask`` of the wrong shape given to a vector env that
  accepts it, an unknown ``on_fault``, a live token of another version;
- SB3: the live tokens are removed from ``infos`` and ``reset_infos``; ``StopOnBoundaryFault`` refuses a
  LedgerVecEnv without ``live=True``.
"""

import functools
import os
import re
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces as gs
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import stepledger
from stepledger import BoundaryFault, LedgerEnv, LedgerVectorEnv, TrainerLedger, compare, read
from stepledger.format import schema as S

from trainer_envs import assert_clean, factories, make_space


# ---------------------------------------------------------------- actions edited in place by the env

class ClipsInPlace(gym.Env):
    """Clips the action array it is given in place (as some envs do), then shifts it further."""

    observation_space = gs.Box(-10, 10, (2,), np.float32)
    action_space = gs.Box(-2, 2, (2,), np.float32)

    def __init__(self, length=3):
        self.length, self.t = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        np.clip(action, -0.5, 0.5, out=action)
        action += 0.25
        return np.asarray(action, np.float32).copy(), float(action.sum()), self.t >= self.length, False, {}


def _clipping_env(directory, i, keep_values):
    return LedgerEnv(ClipsInPlace(length=2 + i), directory, index=i, keep_values=keep_values)


def _sent_actions(steps, n):
    """Actions well outside the clip range, a fresh array every step."""
    return [np.full((n, 2), 1.5 + t, np.float32) * np.array([[1.0], [-1.0]][:n], np.float32) for t in range(steps)]


def _assert_kept_actions_agree(directory, trainer_file, n):
    """With keep_values, each side's kept actions are the ones sent (the env edits only its copy's source)."""
    env, tr = read(directory), read(trainer_file)
    try:
        for i in range(n):
            a, b = env.streams[i].values["values_act_0"], tr.streams[i].values["values_act_0"]
            assert np.array_equal(a, b)
            steps = env.streams[i].columns["kind"] == S.KIND_STEP
            assert np.abs(a[steps]).min() >= 1.5  # never the clipped value
    finally:
        env.close()
        tr.close()


def _steps_the_envs_edit(envs, directory, keep_values):
    """Seven steps of actions each env clips in place, and close(): both sides recorded the actions sent."""
    edited = 0
    for actions in _sent_actions(7, 2):
        before = actions.copy()
        envs.step(actions)
        edited += not np.array_equal(actions, before)
    envs.close()
    assert edited == 7  # the env did edit the very array the trainer sent
    trainer = os.path.join(directory, "trainer.npz")
    assert_clean(directory, trainer, n_envs=2)
    if keep_values:
        _assert_kept_actions_agree(directory, trainer, 2)


@pytest.mark.parametrize("keep_values", [False, True])
@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_gym_actions_are_taken_before_the_env_edits_them(tmp_path, core_impl, keep_values, mode):
    """SyncVectorEnv hands each env a view of the trainer's action batch: an env that clips it in place
    changes the trainer's array. The trainer side must have digested (and copied) it before."""
    d = str(tmp_path)
    venv = SyncVectorEnv([functools.partial(_clipping_env, d, i, keep_values) for i in range(2)],
                         autoreset_mode=AutoresetMode(mode))
    envs = LedgerVectorEnv(venv, os.path.join(d, "trainer.npz"), keep_values=keep_values)
    envs.reset(seed=0)
    _steps_the_envs_edit(envs, d, keep_values)


@pytest.mark.parametrize("keep_values", [False, True])
def test_sb3_actions_are_taken_before_the_env_edits_them(tmp_path, core_impl, keep_values):
    """DummyVecEnv steps env i with ``actions[i]``, a view of the batch given to step_async."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from stepledger.sb3 import LedgerVecEnv
    d = str(tmp_path)
    venv = LedgerVecEnv(DummyVecEnv([functools.partial(_clipping_env, d, i, keep_values) for i in range(2)]),
                        os.path.join(d, "trainer.npz"), keep_values=keep_values)
    venv.reset()
    _steps_the_envs_edit(venv, d, keep_values)


# ---------------------------------------------------------------- final_obs as a dict of arrays

class FinalObsAsDictOfArrays(gym.vector.VectorWrapper):
    """A SAME_STEP vector env whose info merging has no special case for final_obs: a dict observation
    arrives split into a dict of arrays, each key with its ``_key`` mask, as Gymnasium merges other infos."""

    def step(self, actions):
        obs, rew, term, trunc, info = self.env.step(actions)
        if "final_obs" in info:
            finals, mask = info.pop("final_obs"), info["_final_obs"]
            info["final_obs"] = {}
            for i in np.flatnonzero(mask):
                _merge(info["final_obs"], finals[i], int(i), self.num_envs)
        return obs, rew, term, trunc, info


def _merge(out, value, i, n):
    for key, v in value.items():
        if isinstance(v, dict):
            _merge(out.setdefault(key, {}), v, i, n)
        else:
            v = np.asarray(v)
            if key not in out:
                out[key] = np.zeros((n,) + v.shape, v.dtype)
            out[key][i] = v
        out.setdefault("_" + key, np.zeros(n, np.bool_))[i] = True


NESTED_DICT = gs.Dict({"a": gs.Box(-1, 1, (2,), np.float32),
                       "inner": gs.Dict({"b": gs.Discrete(5), "c": gs.Box(0, 9, (1, 2), np.float64)})})
# A key that starts with "_" is a key, not a mask: its mask is "__a".
UNDERSCORE_DICT = gs.Dict({"_a": gs.Box(-1, 1, (2,), np.float32), "b": gs.Discrete(3)})
SPACES = {"dict": make_space("dict"), "nested": NESTED_DICT, "underscore": UNDERSCORE_DICT}


@pytest.mark.parametrize("keep_values", [False, True])
@pytest.mark.parametrize("space", sorted(SPACES))
def test_final_obs_as_a_dict_of_arrays(tmp_path, core_impl, space, keep_values):
    d = str(tmp_path)
    fns = factories(d, 3, obs_space=SPACES[space], lengths=(2, 3, 1), ends=("term", "trunc", "both"),
                    keep_values=keep_values)
    venv = FinalObsAsDictOfArrays(SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP))
    trainer = os.path.join(d, "trainer.npz")
    envs = LedgerVectorEnv(venv, trainer, keep_values=keep_values, autoreset_mode="same_step")
    envs.action_space.seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "without info['final_obs']" warning: every final obs is found
        envs.reset(seed=0)
        ended = 0
        for _ in range(9):
            _, _, term, trunc, info = envs.step(envs.action_space.sample())
            if np.any(term | trunc):
                assert isinstance(info["final_obs"], dict)  # the layout under test did arrive
                ended += int(np.sum(term | trunc))
    envs.close()
    assert ended >= 6
    assert_clean(d, trainer, n_envs=3)
    if keep_values:
        env, tr = read(d), read(trainer)
        try:
            for i in range(3):
                ev, tv = env.streams[i].values, tr.streams[i].values
                assert sorted(ev) == sorted(tv)
                for name in ev:
                    assert np.array_equal(ev[name], tv[name]), (i, name)
        finally:
            env.close()
            tr.close()


# ---------------------------------------------------------------- refusals stepledger makes itself

class AcceptsAnyResetMask(gym.vector.VectorEnv):
    """A minimal vector env (a bridge, say) that never looks at options['reset_mask']."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, n=2):
        self.num_envs = n
        self.single_observation_space = gs.Box(-1, 1, (3,), np.float32)
        self.single_action_space = gs.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, n)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, n)
        self.resets = 0

    def reset(self, *, seed=None, options=None):
        self.resets += 1
        return np.zeros((self.num_envs, 3), np.float32), {}

    def reset_async(self, seed=None, options=None):
        self.resets += 1

    def reset_wait(self, **kwargs):
        return np.zeros((self.num_envs, 3), np.float32), {}

    def step(self, actions):
        n = self.num_envs
        return np.zeros((n, 3), np.float32), np.zeros(n), np.zeros(n, bool), np.zeros(n, bool), {}


@pytest.mark.parametrize("mask", [[True], [True, False, True], [[True, False]]], ids=["short", "long", "2-d"])
@pytest.mark.parametrize("split", [False, True], ids=["reset", "reset_async"])
def test_a_reset_mask_of_the_wrong_shape_is_refused_before_the_reset(tmp_path, mask, split):
    inner = AcceptsAnyResetMask(2)
    envs = LedgerVectorEnv(inner, str(tmp_path / "trainer.npz"))
    envs.reset(seed=0)
    inner.resets = 0
    with pytest.raises(ValueError, match=r"LedgerVectorEnv.reset: options\['reset_mask'\] must have shape \(2,\)"):
        if split:
            envs.reset_async(options={"reset_mask": np.array(mask)})
        else:
            envs.reset(options={"reset_mask": np.array(mask)})
    assert inner.resets == 0  # refused before the vector env was asked
    envs.reset(options={"reset_mask": np.array([False, True])})  # the right shape goes through
    envs.close()


def _pendulum(i, live=True):
    return LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=5), None, index=i, live=live)


@pytest.mark.parametrize("on_fault", ["Raise", "ignore", None, 3])
def test_an_unknown_on_fault_is_refused_at_construction(on_fault):
    with pytest.raises(ValueError, match=re.escape("LedgerVectorEnv: on_fault must be 'raise', 'warn', 'record' "
                                                   "or a callable, got %r" % (on_fault,))):
        LedgerVectorEnv(SyncVectorEnv([functools.partial(_pendulum, 0)]), None, live=True, on_fault=on_fault)


def test_sb3_unknown_on_fault_is_refused():
    from stable_baselines3.common.vec_env import DummyVecEnv

    from stepledger.sb3 import LedgerVecEnv
    with pytest.raises(ValueError, match="LedgerVecEnv: on_fault must be"):
        LedgerVecEnv(DummyVecEnv([functools.partial(_pendulum, 0)]), None, live=True, on_fault="stop")
    venv = LedgerVecEnv(DummyVecEnv([functools.partial(_pendulum, 0)]), None, live=True)
    with pytest.raises(ValueError, match="LedgerVecEnv: on_fault must be .* got 'stop'"):
        venv.set_on_fault("stop")
    venv.close()


class TokenOfVersion(gym.vector.VectorWrapper):
    """Rewrites the version byte of env 1's live token from the ``at``-th step on (a newer env side)."""

    def __init__(self, env, version, at):
        super().__init__(env)
        self.version, self.at, self.t = version, at, 0

    def step(self, actions):
        obs, rew, term, trunc, info = self.env.step(actions)
        self.t += 1
        if self.t >= self.at:
            tokens = info[S.TOKEN_KEY].copy()
            tokens[1] = bytes([self.version]) + tokens[1][1:]
            info[S.TOKEN_KEY] = tokens
        return obs, rew, term, trunc, info


@pytest.mark.parametrize("version", [S.TOKEN_VERSION + 1, 0, 255])
def test_a_token_of_another_version_is_not_read_as_one(core_impl, version):
    from stepledger.recording.live import unpack_token
    envs = LedgerVectorEnv(TokenOfVersion(SyncVectorEnv([functools.partial(_pendulum, i) for i in range(2)]),
                                          version, at=3), None, live=True, on_fault="record")
    envs.reset(seed=0)
    for _ in range(4):
        envs.step(np.zeros((2, 1), np.float32))
    faults, later = envs.live_faults, envs.ledger.live_later
    envs.close()
    # steps 1 and 2 are clean; from step 3 on, env 1's tokens are of another version: never compared as if
    # ours. Step 3's is the env's fault; step 4's follows from it (one fault an env), counted
    assert [(f.env, f.fields) for f in faults] == [(1, ("token",))], [str(f) for f in faults]
    assert later == {1: 1}, later
    assert str(faults[0]).startswith("env 1: the live token is damaged")
    good = LedgerEnv(gym.make("Pendulum-v1"), None, index=0, live=True).reset(seed=0)[1][S.TOKEN_KEY]
    assert unpack_token(good) is not None
    assert unpack_token(bytes([version]) + good[1:]) is None


# ---------------------------------------------------------------- SB3: tokens removed; StopOnBoundaryFault

def test_sb3_tokens_are_removed_unless_kept():
    from stable_baselines3.common.vec_env import DummyVecEnv

    from stepledger.sb3 import LedgerVecEnv
    keys = (S.TOKEN_KEY, S.SETTINGS_KEY)
    for keep in (False, True):
        inner = DummyVecEnv([functools.partial(_pendulum, i) for i in range(2)])
        venv = LedgerVecEnv(inner, None, live=True, keep_tokens=keep)
        venv.reset()
        assert all((k in info) == keep for info in inner.reset_infos for k in keys), inner.reset_infos
        dones = 0
        for _ in range(7):  # 5-step episodes: the autoreset's token is in reset_infos
            _, _, done, infos = venv.step(np.zeros((2, 1), np.float32))
            assert all((S.TOKEN_KEY in info) == keep for info in infos), infos
            assert all(S.SETTINGS_KEY not in info for info in infos)
            if done.any():
                dones += int(done.sum())
                assert all((S.TOKEN_KEY in inner.reset_infos[i]) == keep for i in np.flatnonzero(done))
        assert dones == 2 and not venv.live_faults
        venv.close()


@pytest.mark.parametrize("how", ["no LedgerVecEnv", "LedgerVecEnv without live"])
def test_stop_on_boundary_fault_refuses_a_run_it_cannot_watch(tmp_path, how):
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from stepledger.sb3 import LedgerVecEnv, StopOnBoundaryFault
    venv = DummyVecEnv([lambda: LedgerEnv(gym.make("Pendulum-v1"), str(tmp_path), index=0)])
    if how != "no LedgerVecEnv":
        venv = LedgerVecEnv(venv, str(tmp_path / "trainer.npz"))
    model = PPO("MlpPolicy", VecNormalize(venv), n_steps=16, batch_size=16, n_epochs=1, seed=0)
    with pytest.raises(ValueError, match=r"StopOnBoundaryFault: the model's VecEnv has no "
                                         r"LedgerVecEnv\(\.\.\., live=True\) in it"):
        model.learn(32, callback=StopOnBoundaryFault())
    assert model.num_timesteps == 0  # refused before the first step
    venv.close()


def test_stop_on_boundary_fault_finds_a_live_ledger_behind_wrappers():
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from stepledger.sb3 import LedgerVecEnv, StopOnBoundaryFault
    ledger = LedgerVecEnv(DummyVecEnv([functools.partial(_pendulum, 0)]), None, live=True)
    model = PPO("MlpPolicy", VecNormalize(ledger), n_steps=16, batch_size=16, n_epochs=1, seed=0)
    stop = StopOnBoundaryFault()
    model.learn(32, callback=stop)
    assert stop.ledger is ledger and stop.fault is None and model.num_timesteps == 32
    ledger.close()


class ShortFinalObs(gym.vector.VectorWrapper):
    """A SAME_STEP bridge whose final_obs holds only env 0's entry (a batch shorter than num_envs)."""

    def step(self, actions):
        obs, rew, term, trunc, info = self.env.step(actions)
        if "final_obs" in info:
            info = dict(info, final_obs=info["final_obs"][:1])
        return obs, rew, term, trunc, info


def test_a_final_obs_shorter_than_the_batch_is_recorded_as_missing(tmp_path, core_impl):
    """Not a crash in the trainer's step: the envs without an entry have their final obs recorded as
    missing (an obs difference at the last step of the episode), with a warning."""
    from trainer_envs import assert_differs
    d = str(tmp_path)
    venv = ShortFinalObs(SyncVectorEnv(factories(d, 3, lengths=(3,)), autoreset_mode=AutoresetMode.SAME_STEP))
    trainer = os.path.join(d, "trainer.npz")
    envs = LedgerVectorEnv(venv, trainer, autoreset_mode="same_step")
    envs.reset(seed=0)
    with pytest.warns(UserWarning, match="final"):
        for _ in range(5):
            envs.step(envs.action_space.sample())
    envs.close()
    assert_differs(d, trainer, {1: (3, ["h_obs"]), 2: (3, ["h_obs"])})


@pytest.mark.parametrize("set_up_first", [True, False])
def test_a_trainer_side_set_up_before_its_first_event_is_of_the_run_of_an_env_that_ended_before_it(
        tmp_path, monkeypatch, set_up_first):
    # stepledger.rllib's trainer side opens its ledger at the first episode a learner is handed (it needs its
    # spaces), and an env runner killed before that had its ledger's last write earlier: with no run id to link
    # them, compare goes by the two recordings overlapping in time, so the trainer side began when it was set
    # up (Recording.began_at). Without it the env ledger reads as another run's (the clock slack made short).
    import stepledger.report.compare as C
    monkeypatch.setattr(C, "CLOCK_SLACK", 0.2)
    set_up = time.time()
    d = str(tmp_path / "ledgers")
    env = LedgerEnv(gym.make("CartPole-v1"), d, index=0)
    obs0, _ = env.reset(seed=1)
    actions, obs, rewards = [], [], []
    for t in range(5):
        o, r, term, trunc, _ = env.step(t % 2)
        actions.append(t % 2), obs.append(o), rewards.append(r)
    env.close()
    time.sleep(0.5)
    trainer = TrainerLedger(os.path.join(d, "trainer.npz"), 1, env.observation_space, env.action_space)
    if set_up_first:
        trainer.recording.began_at(set_up)
    trainer.env_reset(0, obs0)
    trainer.env_steps(0, np.array(actions), np.array(obs), np.array(rewards, np.float32), np.zeros(5, bool),
                      np.zeros(5, bool))
    trainer.recording.began_at(0.0)  # after its first event: nothing changes
    trainer.close()
    with read(os.path.join(d, "trainer.npz")) as t:
        started = t.meta[S.META_STARTED]
    assert (abs(started - set_up) < 0.01) == set_up_first, (started, set_up)
    if set_up_first:
        report = compare(d, os.path.join(d, "trainer.npz"))
        assert report.ok and report.envs == [0], str(report)
    else:
        from stepledger.errors import LedgerError
        with pytest.raises(LedgerError, match=r"env-0\.npz is from another run"):
            compare(d, os.path.join(d, "trainer.npz"))
