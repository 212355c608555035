"""Copies of a recorded env (docs/INDICES.md, "Copies of a recorded env"): each way a copy of a LedgerEnv is made
records into a file of its own beside the original's, never into the original's ledger, never makes the program
fail where it ran without stepledger, and compare names it on one line (not a difference)."""

import copy
import dataclasses
import functools
import os
import pickle
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.utils.env_match import check_environments_match

from stepledger import LedgerEnv, LedgerVectorEnv, compare, read
from stepledger.format import schema as S

N = 2


def cartpole(index, directory):
    return LedgerEnv(gym.make("CartPole-v1"), directory, index=index)


def copies_in(directory):
    return sorted(n for n in os.listdir(directory) if S.COPY_INFIX in n and n.endswith(".npz"))


def train(directory, steps=20, make_copy=None, copy_steps=7):
    """A SyncVectorEnv of N CartPoles, recorded on both sides; after ``steps`` vector steps, ``make_copy(env 0)``
    makes a copy of env 0's LedgerEnv, which takes a reset and ``copy_steps`` steps of its own (an evaluation);
    then training goes on for ``steps`` more and everything is closed. The copy's ledger path."""
    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([functools.partial(cartpole, i, directory) for i in range(N)]),
                           os.path.join(directory, "trainer.npz"))
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        envs.step(rng.integers(0, 2, N))
    path = None
    if make_copy is not None:
        original = envs.unwrapped.envs[0]
        assert isinstance(original, LedgerEnv)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a copy warns about nothing: it is not a mistake
            twin = make_copy(original)
        assert isinstance(twin, gym.Env)
        twin.reset(seed=1)
        for t in range(copy_steps):
            _, _, term, trunc, _ = twin.step(t % 2)
            if term or trunc:
                twin.reset()
        path = twin.get_wrapper_attr("ledger_path")
        twin.close()
    for _ in range(steps):
        envs.step(rng.integers(0, 2, N))
    envs.close()
    return path


def assert_named_not_compared(directory, copy_path, how):
    """compare: 0 of N envs differ, the copy named on one line with its events, exit 0."""
    name = os.path.basename(copy_path)
    assert name.startswith("env-0" + S.COPY_INFIX), name
    with read(copy_path) as led:
        assert led.meta[S.META_COPY] == how
        events = len(led.streams[0])
    assert events >= 8  # its reset and its 7 steps (and resets): all of them, in its own file
    with read(os.path.join(directory, "env-0.npz")) as led:
        assert S.META_COPY not in led.meta
    report = compare(directory, os.path.join(directory, "trainer.npz"))
    text = str(report)
    assert report.ok and "0 of %d envs differ" % N in text, text
    line = [n for n in report.notes if n.startswith(name)]
    assert len(line) == 1, text
    assert "a copy of env 0's LedgerEnv" in line[0] and "recorded %d events of its own: not compared" % events \
        in line[0], line[0]
    proc = subprocess.run([sys.executable, "-m", "stepledger", "compare", directory,
                           os.path.join(directory, "trainer.npz")], capture_output=True, text=True)
    assert proc.returncode == 0 and line[0] in proc.stdout, proc.stdout + proc.stderr
    return line[0]


# ---------------------------------------------------------------- each way a copy is made

def test_env_spec_make_after_the_first_event_records_a_copy(tmp_path):
    d = str(tmp_path)
    path = train(d, make_copy=lambda env: env.spec.make())
    line = assert_named_not_compared(d, path, S.COPY_REBUILT)
    assert "built while env-0.npz was being recorded in its process" in line


def test_gym_make_of_the_env_spec_records_a_copy(tmp_path):
    d = str(tmp_path)
    path = train(d, make_copy=lambda env: gym.make(env.spec))
    assert_named_not_compared(d, path, S.COPY_REBUILT)


def test_deepcopy_records_a_copy(tmp_path):
    d = str(tmp_path)
    path = train(d, make_copy=copy.deepcopy)
    line = assert_named_not_compared(d, path, S.COPY_PICKLED)
    assert "unpickled or deep-copied" in line


def test_pickle_after_the_first_event_records_a_copy(tmp_path):
    d = str(tmp_path)
    path = train(d, make_copy=lambda env: pickle.loads(pickle.dumps(env)))
    assert_named_not_compared(d, path, S.COPY_PICKLED)


def test_pickle_before_the_first_event_records_a_copy(tmp_path):
    d = str(tmp_path)
    env = cartpole(0, d)
    data = pickle.dumps(env)  # nothing recorded yet: no recording, no file, nothing carried but the arguments
    twin = pickle.loads(data)
    env.reset(seed=0)
    twin.reset(seed=0)
    for t in range(5):
        env.step(t % 2)
        twin.step(t % 2)
    env.close()
    twin.close()
    assert os.path.basename(env.ledger_path) == "env-0.npz"
    assert os.path.basename(twin.ledger_path).startswith("env-0" + S.COPY_INFIX)
    with read(env.ledger_path) as a, read(twin.ledger_path) as b:
        assert len(a.streams[0]) == len(b.streams[0]) == 6  # each its own: nothing written twice, nothing lost
        assert b.meta[S.META_COPY] == S.COPY_PICKLED


def test_a_copy_keeps_the_arguments_and_an_index_given_later(tmp_path):
    d = str(tmp_path)
    env = LedgerEnv(gym.make("CartPole-v1"), d, keep_values=True, reward_dtype=np.float64, flush_interval=2.0)
    env.set_index(3)
    env.reset(seed=0)
    for make in (copy.deepcopy, lambda e: e.spec.make(), lambda e: pickle.loads(pickle.dumps(e))):
        twin = make(env)
        while not isinstance(twin, LedgerEnv):  # env.spec.make() adds gym.make's own wrappers
            twin = twin.env
        assert twin.index == 3 and twin._keep_values and twin._dtype == np.float64 and twin._interval == 2.0
        twin.reset(seed=0)
        twin.close()
        assert os.path.basename(twin.ledger_path).startswith("env-3" + S.COPY_INFIX)
    env.close()
    assert len(copies_in(d)) == 3 and os.path.exists(os.path.join(d, "env-3.npz"))


def test_a_copy_that_records_nothing_leaves_nothing(tmp_path):
    d = str(tmp_path)
    env = cartpole(0, d)
    env.reset(seed=0)
    for make in (copy.deepcopy, lambda e: e.spec.make(), lambda e: gym.make(e.spec)):
        make(env).close()
    env.close()
    assert sorted(os.listdir(d)) == ["env-0.npz"]


def test_old_entry_point_of_a_saved_spec_still_builds(tmp_path):
    """A spec saved before the package had folders names LedgerEnv as stepledger.env:LedgerEnv."""
    spec = gym.make("CartPole-v1").spec
    old = gym.envs.registration.WrapperSpec("LedgerEnv", "stepledger.env:LedgerEnv",
                                            {"directory": str(tmp_path), "index": 0})
    spec = dataclasses.replace(spec, additional_wrappers=(old,))
    env = gym.make(spec)
    env.reset(seed=0)
    env.close()
    assert os.listdir(str(tmp_path)) == ["env-0.npz"]


# ---------------------------------------------------------------- Gymnasium's own checkers

def test_gymnasiums_check_env_passes_on_a_ledger_env(tmp_path):
    d = str(tmp_path)
    env = cartpole(0, d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # gymnasium's own advice (infinite bounds, a wrapped env)
        check_env(env)  # its close check and render check build copies with env.spec.make()
    env.step(0)
    env.close()
    with read(os.path.join(d, "env-0.npz")) as led:
        assert len(led.streams[0]) > 10  # check_env's own resets and steps, recorded
    for name in copies_in(d):  # the render check resets each copy once; nothing else
        with read(os.path.join(d, name)) as led:
            assert led.meta[S.META_COPY] == S.COPY_REBUILT and len(led.streams[0]) == 1


def test_gymnasiums_check_environments_match_passes_on_a_ledger_env(tmp_path):
    check_environments_match(cartpole(0, str(tmp_path)), gym.make("CartPole-v1"), num_steps=100, seed=3)
    check_environments_match(cartpole(1, str(tmp_path)), copy.deepcopy(cartpole(2, str(tmp_path))),
                             num_steps=100, seed=3)


# ---------------------------------------------------------------- an SB3 evaluation env from the training env's factory

def _sb3_run(directory, vec_cls):
    """PPO on a VecEnv of N CartPoles from ``make_env``, recorded; an EvalCallback evaluates on a VecEnv of one
    built from the same factory (so its LedgerEnv is index 0 in the same directory), as SB3's docs do."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import EvalCallback
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from stepledger.sb3 import LedgerVecEnv

    fns = [functools.partial(cartpole, i, directory) for i in range(N)]
    kwargs = {"start_method": "fork"} if vec_cls is SubprocVecEnv else {}
    venv = LedgerVecEnv(vec_cls(fns, **kwargs), os.path.join(directory, "trainer.npz"))
    eval_env = vec_cls(fns[:1], **kwargs)  # the training env's factory: LedgerEnv(index=0), same directory
    model = PPO("MlpPolicy", venv, n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # an evaluation env is no mistake: stepledger warns of nothing
        warnings.simplefilter("ignore", UserWarning)  # SB3's: the eval env is not wrapped in a Monitor
        model.learn(total_timesteps=3 * 32 * N, callback=EvalCallback(eval_env, eval_freq=16, n_eval_episodes=2,
                                                                      verbose=0))
        venv.close()
        eval_env.close()


@pytest.mark.parametrize("vec", ["DummyVecEnv", "SubprocVecEnv"])
def test_sb3_evaluation_env_from_the_training_factory(tmp_path, vec):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common import vec_env
    d = str(tmp_path)
    _sb3_run(d, getattr(vec_env, vec))
    report = compare(d, os.path.join(d, "trainer.npz"))
    text = str(report)
    assert report.ok and "0 of %d envs differ" % N in text, text
    named = [n for n in report.notes if "env 0" in n and "not compared" in n]
    assert len(named) == 1, text  # the evaluation env's ledger, on one line, whichever wrote first
    assert "not one of the trainer side's envs" in named[0] or "a copy of env 0's LedgerEnv" in named[0], named[0]
    with read(os.path.join(d, "trainer.npz")) as trainer:
        assert trainer.meta[S.META_RUN]


def test_a_ledger_env_pickled_into_subproc_workers_is_the_env_compared(tmp_path):
    """LedgerEnvs built in the parent and handed to SubprocVecEnv's workers by a closure (pickled there before their
    first event): the workers' copies are the envs the trainer side linked, and compare takes them."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import SubprocVecEnv

    from stepledger.sb3 import LedgerVecEnv
    d = str(tmp_path)
    built = [cartpole(i, d) for i in range(N)]
    venv = LedgerVecEnv(SubprocVecEnv([functools.partial(lambda e: e, e) for e in built], start_method="spawn"),
                        os.path.join(d, "trainer.npz"))
    venv.seed(0)
    venv.reset()
    for t in range(30):
        venv.step(np.array([t % 2] * N))
    venv.close()
    for e in built:
        e.close()  # recorded nothing here: no file
    assert len(copies_in(d)) == N and not os.path.exists(os.path.join(d, "env-0.npz")), os.listdir(d)
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok and "0 of %d envs differ" % N in str(report), str(report)


def test_an_evaluation_env_that_writes_first_is_named_and_the_linked_env_compared(tmp_path):
    """Built from the training env's factory before training: neither is a copy yet. The evaluation env writes
    env-0.npz first; the training env, which the trainer side linked, then records beside it, and compare takes it."""
    d = str(tmp_path)
    evaluation = cartpole(0, d)  # built first, never linked
    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([functools.partial(cartpole, i, d) for i in range(N)]),
                           os.path.join(d, "trainer.npz"))
    evaluation.reset(seed=5)
    for _ in range(3):
        evaluation.step(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither write is a mistake: no warning
        evaluation.flush()  # env-0.npz is the evaluation env's now
        envs.reset(seed=0)
        for t in range(10):
            envs.step(np.array([t % 2] * N))
        envs.close()
        evaluation.close()
    assert os.path.basename(evaluation.ledger_path) == "env-0.npz"
    training = envs.unwrapped.envs[0].ledger_path
    assert os.path.basename(training).startswith("env-0" + S.DUPLICATE_INFIX)
    report = compare(d, os.path.join(d, "trainer.npz"))
    text = str(report)
    assert report.ok and "0 of %d envs differ" % N in text, text
    assert ("env-0.npz: another LedgerEnv of env 0, not one of the trainer side's envs (an evaluation env built from "
            "the training env's factory, say), recorded 4 events of its own: not compared") in text, text
