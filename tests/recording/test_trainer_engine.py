"""The public trainer-side engine, TrainerLedger, driven with no vector env at all."""

import os
import time

import gymnasium as gym
import numpy as np
import pytest

import envs_for_tests as E
from stepledger import LedgerEnv, TrainerLedger, compare, read
from stepledger import core

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


class ChunkEnv(gym.Env):
    """Deterministic obs and rewards, episodes of ``length`` steps; ends by termination, or by truncation
    every third episode."""

    def __init__(self, length=4, act_space=None):
        self.observation_space = BOX
        self.action_space = act_space or gym.spaces.Discrete(3)
        self.length, self.t, self.episode = length, 0, -1

    def _obs(self):
        return np.array([self.episode, self.t, 0.5], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.episode = 0, self.episode + 1
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.length
        trunc = done and self.episode % 3 == 2
        return self._obs(), float(self.t) / 7.0, done and not trunc, trunc, {}


def run_in_chunks(directory, n_envs, episodes, chunk, trainer_path, act_space=None, edit=None):
    """Each env stepped by itself; the trainer side hears of it in chunks of ``chunk`` steps, as a
    learner hears of episodes cut across sample() calls."""
    led = TrainerLedger(trainer_path, n_envs, BOX, act_space or gym.spaces.Discrete(3))
    rng = np.random.default_rng(0)
    for i in range(n_envs):
        env = LedgerEnv(ChunkEnv(act_space=act_space), directory, index=i)
        space = env.action_space
        space.seed(i)
        for _ in range(episodes):
            obs, _ = env.reset()
            led.env_reset(i, obs)
            done = False
            while not done:
                rows = []
                for _ in range(chunk):
                    a = space.sample()
                    o, r, te, tr, _ = env.step(a)
                    rows.append((a, o, r, te, tr))
                    done = te or tr
                    if done:
                        break
                acts = np.stack([np.asarray(x[0]) for x in rows])
                obs_b = np.stack([x[1] for x in rows])
                rew = np.array([x[2] for x in rows])
                te_b = np.array([x[3] for x in rows])
                tr_b = np.array([x[4] for x in rows])
                if edit is not None:
                    edit(i, obs_b, rew, te_b, tr_b)
                led.env_steps(i, acts, obs_b, rew, te_b, tr_b)
                rew *= 0  # the trainer edits what it received: the ledger already has it
        env.close()
    led.close()
    return led


def test_per_env_chunks_compare_clean(tmp_path):
    d = str(tmp_path)
    run_in_chunks(d, 3, 4, 3, os.path.join(d, "trainer.npz"))
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, report.lines()
    with read(os.path.join(d, "trainer.npz")) as led:
        # 4 episodes of a reset and 4 steps per env
        assert [len(led.streams[i]) for i in range(3)] == [20, 20, 20]
        assert led.meta.get("autoreset_mode") is None


def test_per_env_fault_is_located(tmp_path):
    d = str(tmp_path)

    def edit(i, obs, rew, te, tr):
        if i == 1 and obs[0][0] == 2 and obs[0][1] == 1:  # env 1, episode 2, from step 1 of the chunk
            rew[0] = np.float32(rew[0]) + np.float32(1e-3)

    run_in_chunks(d, 2, 3, 2, os.path.join(d, "trainer.npz"), edit=edit)
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert not report.ok
    [diff] = report.differences
    assert (diff.env, diff.episode, diff.step, diff.fields) == (1, 2, 1, ("reward",)), report.lines()


def test_per_env_truncation_sent_as_termination_is_located(tmp_path):
    d = str(tmp_path)

    def edit(i, obs, rew, te, tr):
        te |= tr
        tr[:] = False

    run_in_chunks(d, 1, 3, 8, os.path.join(d, "trainer.npz"), edit=edit)
    [diff] = compare(d, os.path.join(d, "trainer.npz")).differences
    assert (diff.env, diff.episode, diff.step, diff.fields) == (0, 2, 4, ("terminated", "truncated"))


def test_per_env_dict_actions_and_empty_chunks(tmp_path):
    d = str(tmp_path)
    space = gym.spaces.Dict({"a": gym.spaces.Discrete(4), "b": gym.spaces.Box(-1, 1, (2,), np.float32)})
    led = TrainerLedger(os.path.join(d, "trainer.npz"), 1, BOX, space)
    env = LedgerEnv(ChunkEnv(act_space=space), d, index=0)
    obs, _ = env.reset()
    led.env_reset(0, obs)
    led.env_steps(0, {"a": np.zeros(0, np.int64), "b": np.zeros((0, 2), np.float32)}, np.zeros((0, 3), np.float32),
                  np.zeros(0), np.zeros(0, bool), np.zeros(0, bool))
    acts = {"a": np.array([1, 3]), "b": np.array([[0.5, -0.5], [0.25, 0.0]], np.float32)}
    outs = [env.step({"a": acts["a"][k], "b": acts["b"][k]}) for k in range(2)]
    led.env_steps(0, acts, np.stack([o[0] for o in outs]), [o[1] for o in outs], [o[2] for o in outs],
                  [o[3] for o in outs])
    env.close()
    led.close()
    assert compare(d, os.path.join(d, "trainer.npz")).ok


def test_streams_of_envs_never_seen_stay_empty(tmp_path):
    d = str(tmp_path)
    led = TrainerLedger(os.path.join(d, "trainer-1.npz"), 8, BOX, gym.spaces.Discrete(3))
    led.env_reset(5, np.zeros(3, np.float32))
    led.env_steps(5, np.array([1]), np.ones((1, 3), np.float32), [1.0], [True], [False])
    led.close()
    with read(os.path.join(d, "trainer-1.npz")) as r:
        assert [len(r.streams[i]) for i in range(8)] == [0, 0, 0, 0, 0, 2, 0, 0]


@pytest.mark.parametrize("call, args, message", [
    ("env_reset", (8, np.zeros(3, np.float32)), "env 8 is not one of the 8 envs"),
    ("env_reset", (-1, np.zeros(3, np.float32)), "env -1 is not one of the 8 envs"),
    ("env_steps", (0, np.array([1, 2]), np.zeros((2, 3), np.float32), [1.0, 2.0], [False], [False, False]),
     "expected 2 values of terminated, got 1"),
    ("env_steps", (0, np.array([1, 2]), np.zeros((2, 3), np.float32), [1.0, 2.0], [False, True], [False]),
     "expected 2 values of truncated, got 1"),
])
def test_per_env_refusals(tmp_path, call, args, message):
    led = TrainerLedger(str(tmp_path / "t.npz"), 8, BOX, gym.spaces.Discrete(3))
    with pytest.raises((IndexError, ValueError), match=message):
        getattr(led, call)(*args)
    led.close()
    assert not os.path.exists(str(tmp_path / "t.npz"))  # nothing was recorded


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_envs=0), "num_envs must be a positive integer, got 0"),
    (dict(num_envs=True), "num_envs must be a positive integer, got True"),
    (dict(num_envs=2, autoreset_mode="sometimes"), "autoreset_mode must be 'next_step' or 'same_step'"),
    (dict(num_envs=2, autoreset_mode="disabled"), "DISABLED is not supported"),
    (dict(num_envs=2, reward_dtype=np.int32), "reward_dtype"),
])
def test_construction_refusals(tmp_path, kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        TrainerLedger(str(tmp_path / "t.npz"), observation_space=BOX, action_space=gym.spaces.Discrete(2), **kwargs)


def test_step_without_a_mode_is_refused(tmp_path):
    led = TrainerLedger(str(tmp_path / "t.npz"), 2, BOX, gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="step\\(\\) needs autoreset_mode"):
        led.step(np.zeros((2, 3), np.float32), np.zeros(2), np.zeros(2, bool), np.zeros(2, bool))
    led.close()


def test_per_env_kept_values(tmp_path):
    d = str(tmp_path)
    led = TrainerLedger(os.path.join(d, "trainer.npz"), 1, BOX, gym.spaces.Discrete(3), keep_values=True)
    env = LedgerEnv(ChunkEnv(), d, index=0, keep_values=True)
    obs, _ = env.reset()
    led.env_reset(0, obs)
    outs = [env.step(a) for a in (2, 1)]
    led.env_steps(0, np.array([2, 1]), np.stack([o[0] for o in outs]), [o[1] for o in outs], [False, False],
                  [False, False])
    env.close()
    led.close()
    assert compare(d, os.path.join(d, "trainer.npz")).ok
    with read(os.path.join(d, "trainer.npz")) as r:
        vals = r.streams[0].values
        assert vals["values_act_0"][1:].tolist() == [2, 1]
        assert vals["values_obs_0"][2].tolist() == [0, 2, 0.5]


def test_flush_writes_only_what_is_new(tmp_path):
    """flush() writes a spill segment of the new events: the bytes it writes do not grow with history."""
    d = str(tmp_path)
    limit = core.memory_limit()
    core.set_memory_limit(1 << 40)  # no spill but flush()'s, whatever other recordings this process holds
    try:
        _flushes(d)
    finally:
        core.set_memory_limit(limit)


def _flushes(d):
    led = TrainerLedger(os.path.join(d, "trainer.npz"), 4, BOX, gym.spaces.Discrete(3), autoreset_mode="next_step",
                        flush_interval=3600)
    led.reset(np.zeros((4, 3), np.float32))
    obs, acts = np.ones((4, 3), np.float32), np.zeros(4, np.int64)
    no, rew = np.zeros(4, bool), np.ones(4)
    sizes = []
    for _ in range(6):
        for _ in range(2000):
            led.actions(acts)
            led.step(obs, rew, no, no)
        before = _spill_bytes(d)
        led.flush()
        sizes.append(_spill_bytes(d) - before)
        assert len(read(os.path.join(d, "trainer.npz")).streams[0]) == 1 + 2000 * (len(sizes))
    # each flush wrote about the same (a merge of 8 segments is the exception, not reached here)
    assert max(sizes) < 1.5 * min(sizes), sizes
    led.close()
    assert len(read(os.path.join(d, "trainer.npz")).streams[3]) == 12001
    assert not os.path.exists(os.path.join(d, "trainer.npz.spill")) or not os.listdir(
        os.path.join(d, "trainer.npz.spill"))


def _spill_bytes(d):
    spill = os.path.join(d, "trainer.npz.spill")
    if not os.path.isdir(spill):
        return 0
    return sum(os.path.getsize(os.path.join(spill, f)) for f in os.listdir(spill))


def test_live_only_keeps_memory_constant_with_per_env_events():
    led = TrainerLedger(None, 2, BOX, gym.spaces.Discrete(3), live=True)
    used = core.memory_in_use()
    for _ in range(200):
        led.env_steps(1, np.array([1, 2]), np.zeros((2, 3), np.float32), [1.0, 2.0], [False, False], [False, False])
    assert core.memory_in_use() - used < 1000
    led.close()
