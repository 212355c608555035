"""The env side at a vector env's own output (``LedgerBatchEnv`` on ``EnvLedger``), with the trainer side
outermost: Gymnasium's vector entry points, clean and with faults between the two sides."""

import os
import warnings

import gymnasium as gym
import numpy as np
import pytest

import stepledger
from stepledger import LedgerVectorEnv, compare, read
from stepledger.check import is_located
from stepledger.faults import TRAINER_SIDE_FAULTS
from stepledger.gymnasium import LedgerBatchEnv
from stepledger.gymnasium.faults import FaultyVectorEnv

ENTRY_POINTS = sorted(k for k, s in gym.registry.items() if s.vector_entry_point is not None)


def _make(name, n, **kwargs):
    try:
        envs = gym.make_vec(name, num_envs=n, vectorization_mode="vector_entry_point", **kwargs)
    except ImportError as exc:  # the phys2d envs are JAX functional envs (jax and flax: the test extra)
        pytest.skip("%s needs %s" % (name, exc.name))
    if "autoreset_mode" not in envs.metadata:
        # Gymnasium 1.4's PendulumJaxVectorEnv declares no mode, though its FunctionalJaxVectorEnv resets at
        # the next step (as its CartPoleJaxVectorEnv declares): both sides would refuse to guess
        envs.metadata = dict(envs.metadata, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    return envs


def _run(envs, steps, seed=0):
    envs.reset(seed=seed)
    envs.action_space.seed(seed)
    for _ in range(steps):
        envs.step(envs.action_space.sample())
    envs.close()


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_every_vector_entry_point_compares_clean(tmp_path, name):
    d = str(tmp_path)
    inner = _make(name, 4)
    _run(LedgerVectorEnv(LedgerBatchEnv(inner, d), os.path.join(d, "trainer.npz")), 120)
    assert sorted(os.listdir(d)) == ["env-0-3.npz", "trainer.npz"]
    with read(os.path.join(d, "env-0-3.npz")) as led:
        assert led.side == "env" and sorted(led.streams) == [0, 1, 2, 3]
    with read(os.path.join(d, "trainer.npz")) as tr, read(os.path.join(d, "env-0-3.npz")) as env:
        assert env.meta["run"] == tr.meta["run"]  # LedgerVectorEnv told the batch its run
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok and report.envs == [0, 1, 2, 3], report.lines()


def test_cartpole_episodes_end_and_reset_on_both_sides(tmp_path):
    d = str(tmp_path)
    _run(LedgerVectorEnv(LedgerBatchEnv(_make("CartPole-v1", 8, max_episode_steps=15), d),
                         os.path.join(d, "trainer.npz")), 200)
    with read(os.path.join(d, "env-0-7.npz")) as led:
        cols = led.streams[5].columns
        kinds = cols["kind"]
        assert (kinds == 0).sum() > 5  # many episodes: resets recorded where the autoreset step was
        resets = np.flatnonzero(kinds == 0)[1:]
        assert (cols["h_act"][resets] == 0).all()  # the action of a next-step reset is not the env's
        ended = cols["terminated"][resets - 1] | cols["truncated"][resets - 1]
        assert ended.all() and cols["truncated"].any()
    assert compare(d, os.path.join(d, "trainer.npz")).ok


def test_one_file_per_batch_with_its_first_index(tmp_path):
    d = str(tmp_path)
    envs = LedgerBatchEnv(_make("CartPole-v1", 3), d, first=5)
    _run(envs, 10)
    with read(os.path.join(d, "env-5-7.npz")) as led:
        assert sorted(led.streams) == [5, 6, 7]
    one = LedgerBatchEnv(_make("CartPole-v1", 1), str(tmp_path / "one"), first=2)
    _run(one, 5)
    assert os.listdir(str(tmp_path / "one")) == ["env-2.npz"]


def test_two_batches_of_one_run_compare_against_one_trainer_file(tmp_path):
    """Two processes' batches (here two vector envs) of one run: env-0-3.npz and env-4-7.npz."""
    d = str(tmp_path)
    tr = stepledger.TrainerLedger(os.path.join(d, "trainer.npz"), 8, gym.spaces.Box(-5, 5, (4,)),
                                  gym.spaces.Discrete(2), autoreset_mode="next_step")
    halves = [LedgerBatchEnv(_make("CartPole-v1", 4), d, first=k) for k in (0, 4)]
    for h in halves:
        h.ledger.link(tr.run)
    obs = np.concatenate([h.reset(seed=k)[0] for k, h in enumerate(halves)])
    tr.reset(obs)
    rng = np.random.default_rng(0)
    for _ in range(100):
        a = rng.integers(0, 2, 8)
        tr.actions(a)
        out = [h.step(a[4 * k:4 * k + 4]) for k, h in enumerate(halves)]
        tr.step(*(np.concatenate([o[j] for o in out]) for j in range(4)))
    for h in halves:
        h.close()
    tr.close()
    assert sorted(os.listdir(d)) == ["env-0-3.npz", "env-4-7.npz", "trainer.npz"]
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok and report.envs == list(range(8)), report.lines()


def test_the_batch_is_not_named_as_a_wrapper_between_the_ledgers(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        envs = LedgerVectorEnv(LedgerBatchEnv(_make("CartPole-v1", 2), str(tmp_path)), str(tmp_path / "t.npz"))
    envs.close()


# ---------------------------------------------------------------- faults between the two sides

class _ToNumpy(gym.vector.VectorWrapper):
    """A framework's conversion of a JAX vector env's batches to NumPy (a device copy, on the CPU)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return np.asarray(obs), info

    def step(self, actions):
        obs, rew, te, tr, info = self.env.step(actions)
        return np.array(obs), np.array(rew), np.array(te), np.array(tr), info


@pytest.mark.parametrize("fault", TRAINER_SIDE_FAULTS)
def test_fault_kit_between_the_sides_is_located(tmp_path, fault):
    d = str(tmp_path)
    record = os.path.join(d, "fault.json")
    # CartPole's action is Discrete and its reward 1.0: float16 and a clip of half the range change nothing there
    box_action = fault in ("action:f16", "action:clip", "reward:f16")
    inner = _make("phys2d/Pendulum-v0" if box_action else "CartPole-v1", 4, max_episode_steps=12)
    batch = LedgerBatchEnv(inner, d)
    if box_action:  # the JAX env's arrays go to NumPy on the way (the fault kit edits rows in place)
        batch = _ToNumpy(batch)
    envs = LedgerVectorEnv(FaultyVectorEnv(batch, fault, at=10, target=2, record=record),
                           os.path.join(d, "trainer.npz"), check_wrappers=False)
    _run(envs, 150)
    from stepledger.faults.engine import read_record
    first = read_record(record)
    assert first is not None, "no opportunity for %s" % fault
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert not report.ok
    d2 = report.by_env().get(2)
    assert d2 is not None and is_located(d2, first), (first, report.lines())
    assert set(report.by_env()) == {2}, report.lines()


# ---------------------------------------------------------------- the known conversion faults

class _TakesResetStepsForTransitions:
    """A trainer that lets the reset step through as an ordinary transition (TorchRL's EnvPool wrapper does):
    every row after the first reset is recorded as a step of its env."""

    def __init__(self, path, envs):
        self.n = envs.num_envs
        self.led = stepledger.TrainerLedger(path, self.n, envs.single_observation_space, envs.single_action_space)

    def reset(self, obs):
        for i in range(self.n):
            self.led.env_reset(i, obs[i])

    def step(self, actions, obs, rewards, terminated, truncated):
        for i in range(self.n):
            self.led.env_steps(i, actions[i:i + 1], obs[i:i + 1], rewards[i:i + 1], terminated[i:i + 1],
                               truncated[i:i + 1])


def test_reset_step_trained_on_as_a_transition_is_reported_as_such(tmp_path):
    d = str(tmp_path)
    envs = LedgerBatchEnv(_make("CartPole-v1", 3, max_episode_steps=9), d)
    trainer = _TakesResetStepsForTransitions(os.path.join(d, "trainer.npz"), envs)
    trainer.reset(envs.reset(seed=0)[0])
    for _ in range(20):
        a = envs.action_space.sample()
        obs, rew, te, tr, _ = envs.step(a)
        trainer.step(a, obs, rew, te, tr)
    envs.close()
    trainer.led.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert not report.ok and len(report.differences) == 3
    for diff in report.differences:
        assert diff.what == "kind" and diff.reset_trained
        assert "the reset step was trained on as a real transition" in diff.line()
        assert diff.to_dict()["reset_step_trained"] is True


def test_a_masked_reset_row_is_followed_not_reported(tmp_path):
    """The env side records EnvPool-style next-step resets; a trainer that masks those rows (NEXT_STEP,
    LedgerVectorEnv) agrees with it: the difference in convention is followed."""
    d = str(tmp_path)
    _run(LedgerVectorEnv(LedgerBatchEnv(_make("CartPole-v1", 3, max_episode_steps=9), d),
                         os.path.join(d, "trainer.npz")), 40)
    assert compare(d, os.path.join(d, "trainer.npz")).ok


class _LosesFinalObs(gym.vector.VectorWrapper):
    """A conversion that drops a same-step vector env's final observations."""

    def step(self, actions):
        obs, rew, te, tr, info = self.env.step(actions)
        info = {k: v for k, v in info.items() if k not in ("final_obs", "_final_obs")}
        return obs, rew, te, tr, info


class _MergesEnds(gym.vector.VectorWrapper):
    """A conversion that has one done flag: a truncation arrives as a termination."""

    def step(self, actions):
        obs, rew, te, tr, info = self.env.step(actions)
        return obs, rew, te | tr, np.zeros_like(tr), info


def _same_step(n, steps):
    return gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync", max_episode_steps=steps,
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})


def test_final_observation_lost_is_located(tmp_path):
    d = str(tmp_path)
    envs = LedgerVectorEnv(_LosesFinalObs(LedgerBatchEnv(_same_step(2, 7), d)), os.path.join(d, "trainer.npz"),
                           check_wrappers=False)
    with pytest.warns(UserWarning, match="recorded as missing"):
        _run(envs, 12)
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert not report.ok
    for diff in report.differences:
        assert diff.fields == ("obs",) and diff.step == 7, diff.line()


def test_termination_and_truncation_merged_is_located(tmp_path):
    d = str(tmp_path)
    envs = LedgerVectorEnv(_MergesEnds(LedgerBatchEnv(_make("CartPole-v1", 3, max_episode_steps=6), d)),
                           os.path.join(d, "trainer.npz"), check_wrappers=False)
    envs.reset(seed=1)
    for _ in range(12):
        envs.step(np.zeros(3, dtype=np.int64))  # always left: some envs fall before 6 steps, some are cut
    envs.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert not report.ok
    for diff in report.differences:
        assert set(diff.fields) == {"terminated", "truncated"}
        assert "terminated: env gave False, trainer received True" in diff.line()
