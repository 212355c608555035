"""EnvPool 1.2.5 (in the test extra) with the env side at its own output, ``LedgerBatchEnv``: sync and async
(``batch_size < num_envs``: sub-batches by ``info["env_id"]``), Gymnasium's and SB3's trainer sides on top,
EnvPool's reset step followed or, trained on as a transition, reported."""

import os
import warnings

import gymnasium as gym
import numpy as np
import pytest

import stepledger
from stepledger import LedgerVectorEnv, TrainerLedger, compare, read
from stepledger.gymnasium import LedgerBatchEnv

envpool = pytest.importorskip("envpool", reason="envpool 1.2.5 (the test extra) is not installed")

warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")


def _pool(n, batch_size=None, task="CartPole-v1", **kwargs):
    kwargs.setdefault("seed", 0)
    return envpool.make(task, env_type="gymnasium", num_envs=n, batch_size=batch_size or n, **kwargs)


def _actions(space, k, rng):
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(0, space.n, k).astype(np.int32)
    return rng.uniform(space.low, space.high, (k,) + space.shape).astype(space.dtype)


@pytest.mark.parametrize("task", ["CartPole-v1", "Pendulum-v1"])
def test_sync_pool_under_the_gymnasium_trainer_side_compares_clean(tmp_path, task):
    d = str(tmp_path)
    pool = _pool(4, task=task, max_episode_steps=20)
    envs = LedgerVectorEnv(LedgerBatchEnv(pool, d), os.path.join(d, "trainer.npz"))
    envs.reset()
    rng = np.random.default_rng(0)
    for _ in range(90):
        envs.step(_actions(pool.single_action_space, 4, rng))
    envs.close()
    with read(os.path.join(d, "env-0-3.npz")) as led:
        kinds = led.streams[1].columns["kind"]
        assert (kinds == 0).sum() >= 4  # EnvPool's reset steps, recorded as resets
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok and report.envs == [0, 1, 2, 3], report.lines()


def _async_run(d, trainer_record, steps=300, n=8, batch=3, fault=None):
    """EnvPool's async loop (recv a sub-batch, send its actions), the trainer side recording what it got by
    env id; ``fault(ids, rewards)`` may change what the trainer receives."""
    pool = _pool(n, batch, max_episode_steps=25)
    env = LedgerBatchEnv(pool, d)
    tr = TrainerLedger(os.path.join(d, "trainer.npz"), n, pool.single_observation_space,
                       pool.single_action_space, autoreset_mode="next_step")
    env.ledger.link(tr.run)
    rng = np.random.default_rng(1)
    sent = {}  # env id -> the action last sent to it
    env.async_reset()
    tr.reset_next()
    for _ in range(steps):
        obs, rew, te, trn, info = env.recv()
        ids = np.array(info["env_id"])
        if fault is not None:
            rew = fault(ids, rew.copy())
        trainer_record(tr, ids, obs, rew, te, trn, sent)
        a = _actions(pool.single_action_space, len(ids), rng)
        tr.actions_at(ids, a)
        sent.update((int(i), a[j:j + 1]) for j, i in enumerate(ids))
        env.send(a, ids)
    env.close()
    tr.close()
    return compare(d, os.path.join(d, "trainer.npz"))


def _masks_reset_rows(tr, ids, obs, rew, te, trn, sent):
    tr.step_at(ids, obs, rew, te, trn)  # next-step: the row after an end is masked as the env's reset


def test_async_pool_sub_batches_compare_clean(tmp_path):
    report = _async_run(str(tmp_path), _masks_reset_rows)
    assert report.ok and report.envs == list(range(8)), report.lines()
    with read(str(tmp_path / "env-0-7.npz")) as led:
        assert all(len(s) > 50 for s in led.streams.values())


def test_async_pool_fault_on_one_env_is_located(tmp_path):
    hit = {}

    def off(ids, rew):
        where = np.flatnonzero(ids == 5)
        if where.size and "done" not in hit:
            hit["calls"] = hit.get("calls", 0) + 1
            if hit["calls"] == 20:
                rew[where[0]] += 0.5
                hit["done"] = True
        return rew
    report = _async_run(str(tmp_path), _masks_reset_rows, fault=off)
    assert not report.ok and [d.env for d in report.differences] == [5]
    assert report.differences[0].fields == ("reward",)


def test_async_reset_step_trained_on_as_a_transition_is_reported(tmp_path):
    started = set()

    def every_row_a_step(tr, ids, obs, rew, te, trn, sent):  # TorchRL's EnvPool wrapper lets the reset row through
        for j, i in enumerate(ids.tolist()):
            if i not in started:
                started.add(i)
                tr.env_reset(i, obs[j])
            else:
                tr.env_steps(i, sent[i], obs[j:j + 1], rew[j:j + 1], te[j:j + 1], trn[j:j + 1])

    report = _async_run(str(tmp_path), every_row_a_step, steps=200)
    assert not report.ok and len(report.differences) == 8
    for diff in report.differences:
        assert diff.reset_trained, diff.line()


def _sb3_adapter(venv):
    from stable_baselines3.common.vec_env import VecEnvWrapper

    class VecAdapter(VecEnvWrapper):
        def __init__(self, venv):
            super().__init__(venv, venv.single_observation_space, venv.single_action_space)

        def step_async(self, actions):
            self.actions = actions

        def reset(self):
            return self.venv.reset()[0]

        def seed(self, seed=None):
            return None

        def step_wait(self):
            obs, rewards, terminated, truncated, info = self.venv.step(self.actions)
            dones = terminated | truncated
            infos = []
            for i in range(self.num_envs):
                infos.append({"TimeLimit.truncated": bool(truncated[i] and not terminated[i])})
                if dones[i]:
                    infos[i]["terminal_observation"] = obs[i].copy()
                    obs[i] = self.venv.reset(np.array([i]))[0][0]
            return obs, rewards, dones, infos

    return VecAdapter(venv)


def test_sb3_on_envpool_compares_clean(tmp_path):
    pytest.importorskip("stable_baselines3")
    from stepledger.sb3 import LedgerVecEnv
    d = str(tmp_path)
    pool = _pool(4, max_episode_steps=15)
    venv = LedgerVecEnv(_sb3_adapter(LedgerBatchEnv(pool, d)), os.path.join(d, "trainer.npz"),
                        check_wrappers=False)
    venv.reset()
    rng = np.random.default_rng(2)
    for _ in range(80):
        venv.step(_actions(pool.single_action_space, 4, rng))
    venv.close()
    with read(os.path.join(d, "env-0-3.npz")) as env, read(os.path.join(d, "trainer.npz")) as tr:
        assert env.meta["run"] == tr.meta["run"]
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, report.lines()


def test_ppo_trains_on_envpool_with_both_sides(tmp_path):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3 import PPO
    from stepledger.sb3 import LedgerVecEnv
    d = str(tmp_path)
    pool = _pool(4)
    venv = LedgerVecEnv(_sb3_adapter(LedgerBatchEnv(pool, d)), os.path.join(d, "trainer.npz"),
                        check_wrappers=False)
    PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu").learn(512)
    venv.close()
    assert compare(d, os.path.join(d, "trainer.npz")).ok
