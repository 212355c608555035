"""Live mode: every fault of the detection matrix is caught as it happens, where compare finds it."""

import functools
import json
import os
import warnings

import gymnasium as gym
import numpy as np
import pytest

from fault_harness import HARNESSES, rollout
from stepledger import BoundaryFault, LedgerEnv, LedgerVectorEnv
from stepledger.format import schema as S
from stepledger.format.schema import TOKEN_KEY
from stepledger.faults import FAULTS, FaultyEnv, reported_fields
from stepledger.recording.live import unpack_token

DOSES = ("one", 0.01, "all")


def _steps(fault, dose):
    if dose != 0.01:
        return 60
    return 3000 if fault.split(":")[0] in ("final-obs", "terminated", "truncated") else 400


@pytest.mark.parametrize("harness", HARNESSES)
def test_clean_control_live(tmp_path, harness):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "live check not active" warning either
        report, firsts, faults = rollout(str(tmp_path), harness, live=True)
    assert report.ok and not faults, [str(f) for f in faults]


@pytest.mark.parametrize("dose", DOSES, ids=str)
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("harness", HARNESSES)
def test_fault_is_caught_live_where_compare_finds_it(tmp_path, harness, fault, dose):
    report, firsts, faults = rollout(str(tmp_path), harness, fault, dose, steps=_steps(fault, dose), live=True)
    assert firsts, "the fault was never injected"
    first_live = {}
    for f in faults:
        first_live.setdefault(f.env, f)
    for env, injected in firsts.items():
        f = first_live.get(env)
        assert f is not None, "env %d hit at %s, but the live check saw nothing" % (env, injected)
        assert (f.episode, f.step) == (injected["episode"], injected["step"]), (str(f), injected)
        # exactly the fields the fault changed: a fault filed under another field (or one more) fails;
        # a filled-in step arrives without a token of its own, an event the env never gave
        wanted = ("kind",) if fault == "step:fill" else tuple(sorted(reported_fields(fault)))
        assert tuple(sorted(f.fields)) == wanted, (str(f), injected)
        d = report.by_env()[env]
        if d.what in ("fields", "kind"):  # the offline compare names the same event
            assert (d.episode, d.step) == (f.episode, f.step)
    assert set(first_live) == set(firsts), "live faults in envs the injector never touched"


def _pendulum(i, directory, live=True, fault=None):
    env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=5), directory, index=i, live=live)
    if fault:
        env = FaultyEnv(env, fault, index=i, at=7, target=1)
    return env


def test_token_is_plain_bytes_and_leaves_everything_else_alone(tmp_path):
    plain = LedgerEnv(gym.make("Pendulum-v1"), str(tmp_path / "a"), index=3)
    live = LedgerEnv(gym.make("Pendulum-v1"), str(tmp_path / "b"), index=3, live=True)
    o1, i1 = plain.reset(seed=1)
    o2, i2 = live.reset(seed=1)
    # the first event also carries the env side's settings, once
    assert np.array_equal(o1, o2) and TOKEN_KEY not in i1 and set(i2) == set(i1) | {TOKEN_KEY, S.SETTINGS_KEY}
    assert type(i2[TOKEN_KEY]) is bytes and unpack_token(i2[TOKEN_KEY])[:5] == (3, 0, 0, 0, 0)
    assert type(i2[S.SETTINGS_KEY]) is bytes and json.loads(i2[S.SETTINGS_KEY])["reward_dtype"] == "float32"
    for _ in range(3):
        r1 = plain.step(np.array([0.3], np.float32))
        r2 = live.step(np.array([0.3], np.float32))
        assert np.array_equal(r1[0], r2[0]) and r1[1:4] == r2[1:4] and set(r2[4]) == set(r1[4]) | {TOKEN_KEY}
    plain.close()
    live.close()
    from ledger_bytes import same_ledger_bytes
    assert same_ledger_bytes(str(tmp_path / "a" / "env-3.npz"), str(tmp_path / "b" / "env-3.npz"))  # the token changes nothing


def test_tokens_removed_unless_kept(tmp_path):
    for keep in (False, True):
        envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([functools.partial(_pendulum, i, None) for i in range(2)]),
                               None, live=True, keep_tokens=keep)
        _, info = envs.reset(seed=0)
        assert (TOKEN_KEY in info) == keep
        _, _, _, _, info = envs.step(np.zeros((2, 1), np.float32))
        assert (TOKEN_KEY in info) == keep and (("_" + TOKEN_KEY) in info) == keep
        envs.close()


def test_without_files_memory_is_constant(tmp_path):
    from stepledger import core
    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([functools.partial(_pendulum, i, None) for i in range(2)]),
                           None, live=True)
    envs.reset(seed=0)
    before = core.memory_in_use()
    for _ in range(500):
        envs.step(np.zeros((2, 1), np.float32))
    assert core.memory_in_use() - before <= 2 * 27 * 2
    envs.close()
    assert not os.listdir(tmp_path)


def test_default_raises_at_the_faulty_step():
    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv(
        [functools.partial(_pendulum, i, None, True, "reward:zero") for i in range(2)]), None, live=True)
    envs.reset(seed=0)
    with pytest.raises(BoundaryFault) as err:
        for t in range(20):
            envs.step(np.zeros((2, 1), np.float32))
    f = err.value
    # 5-step episodes under NEXT_STEP: the env's 8th step call (cell 7) is episode 1, step 3, at vector step 9
    assert (f.env, f.episode, f.step, f.fields) == (1, 1, 3, ("reward",)) and t == 8
    assert str(f).startswith("env 1, episode 1, step 3: reward differs (env gave ")
    envs.close()


def test_warn_and_callable():
    seen = []
    for on_fault in ("warn", seen.append):
        envs = LedgerVectorEnv(gym.vector.SyncVectorEnv(
            [functools.partial(_pendulum, i, None, True, "obs:zero") for i in range(2)]), None, live=True,
            on_fault=on_fault)
        envs.reset(seed=0)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(20):
                envs.step(np.zeros((2, 1), np.float32))
        if on_fault == "warn":
            assert any("obs differs" in str(x.message) for x in w)
        envs.close()
    assert seen and seen[0].fields == ("obs",)


def test_token_that_never_arrives_warns_once_per_env(tmp_path):
    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv(
        [functools.partial(_pendulum, i, None if i == 0 else str(tmp_path), live=(i == 0)) for i in range(3)]),
        None, live=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        envs.reset(seed=0)
        for _ in range(10):
            envs.step(np.zeros((3, 1), np.float32))
    msgs = [str(x.message) for x in w if "live check is not active" in str(x.message)]
    assert len(msgs) == 2 and "env 1" in msgs[0] and "env 2" in msgs[1]
    envs.close()


def test_token_for_the_wrong_env_is_a_fault():
    class Swap(gym.vector.VectorWrapper):  # a bridge that mixes up the envs' infos
        def step(self, actions):
            obs, r, te, tr, info = self.env.step(actions)
            info[TOKEN_KEY] = info[TOKEN_KEY][::-1].copy()
            return obs, r, te, tr, info

    envs = LedgerVectorEnv(Swap(gym.vector.SyncVectorEnv([functools.partial(_pendulum, i, None) for i in range(2)])),
                           None, live=True, autoreset_mode="next_step")
    envs.reset(seed=0)
    with pytest.raises(BoundaryFault, match="received the live token of env 1"):
        envs.step(np.zeros((2, 1), np.float32))


def test_sb3_ppo_stops_at_the_injected_step(tmp_path):
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from stepledger.sb3 import LedgerVecEnv, StopOnBoundaryFault
    record = str(tmp_path / "fault.json")

    def make(i):
        env = LedgerEnv(gym.make("Pendulum-v1"), None, index=i, live=True)
        return FaultyEnv(env, "reward:f16", index=i, at=300, target=1, record=record) if i == 1 else env

    venv = LedgerVecEnv(DummyVecEnv([functools.partial(make, i) for i in range(2)]), None, live=True)
    model = PPO("MlpPolicy", venv, n_steps=128, batch_size=64, n_epochs=1, seed=0)
    stop = StopOnBoundaryFault()
    model.learn(4096, callback=stop)
    from stepledger.faults import read_record
    injected = read_record(record)
    assert stop.fault is not None and injected is not None
    f = stop.fault
    assert (f.env, f.episode, f.step, f.fields) == (1, injected["episode"], injected["step"], ("reward",))
    assert model.num_timesteps == 2 * 301  # stopped right after the faulty step
    model.save(str(tmp_path / "model"))  # what was learnt up to that step can be kept
    venv.close()
