"""The Gymnasium trainer side, LedgerVectorEnv: exact under every reset convention.

Every clean run here records both sides and requires them to agree event for
event (trainer_envs.assert_clean); every fault run requires the first
difference exactly where the fault is (trainer_envs.assert_differs).
"""

import functools
import gc
import os
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import stepledger
from stepledger import LedgerVectorEnv, read
from stepledger import core

from trainer_envs import (ACTION_NAMES, SPACE_NAMES, VECTOR_KINDS, DropFinalObs, ScriptedEnv, assert_clean,
                          assert_differs, event_at, factories, make_scalar_obs_env, make_vector, run_gym, streams)

MODES = ("NextStep", "SameStep")

# Episodes of length 1, ending by termination, by time limit and by both at once.
LENGTHS = (1, 3, 2, 4, 1)
ENDS = ("term", "trunc", "both", "term", "both")
# Explicit resets: everything mid-episode, with a seed, with a mask, and masks
# of the envs whose episode ended at that very step (a pending NEXT_STEP
# autoreset that the explicit reset must clear).
RESETS = {6: "all", 9: "ended", 11: ("seed", 7), 15: ("mask", [True, False, True]), 18: "ended",
          22: ("mask", [False, True, False]), 25: "ended"}


def steps_clean(envs, steps=8):
    """A reset, ``steps`` random steps and close(): the env ledgers beside the trainer's agree with it."""
    envs.reset(seed=0)
    for _ in range(steps):
        envs.step(envs.action_space.sample())
    envs.close()
    return assert_clean(os.path.dirname(envs.ledger_path), envs.ledger_path)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", VECTOR_KINDS)
def test_clean_episode_ends_and_resets(tmp_path, kind, mode):
    # AsyncVectorEnv without shared memory keeps a stale autoreset after an
    # explicit reset (see test_async_without_shared_memory_keeps_a_stale_autoreset):
    # there, explicit resets wait until no touched env has just ended.
    avoid = kind == "async" and mode == "NextStep"
    path = run_gym(str(tmp_path), kind, mode, n=3, steps=30, lengths=LENGTHS, ends=ENDS, resets=RESETS,
                   avoid_pending=avoid)
    assert assert_clean(str(tmp_path), path, n_envs=3) > 90
    _, tr = streams(path)
    kinds = np.concatenate([c["kind"] for c in tr.values()])
    terminated = np.concatenate([c["terminated"] for c in tr.values()])
    truncated = np.concatenate([c["truncated"] for c in tr.values()])
    assert terminated.any() and truncated.any() and (kinds == 0).sum() > 15


@pytest.mark.parametrize("kind", ("sync", "async_shm"))
def test_explicit_reset_right_after_an_end_clears_the_pending_autoreset(tmp_path, kind):
    # Every env ends its episode at step 2; a masked reset of env 0 right then
    # makes env 0's next event a step, while env 1 still autoresets.
    path = run_gym(str(tmp_path), kind, "NextStep", n=2, steps=5, lengths=(2,), resets={1: ("mask", [True, False])})
    assert_clean(str(tmp_path), path)
    _, tr = streams(path)
    # env 0: reset, step, step (end), reset (explicit), step, step (end), reset
    assert tr[0]["kind"].tolist() == [0, 1, 1, 0, 1, 1, 0]
    assert tr[1]["kind"].tolist() == [0, 1, 1, 0, 1, 1]


def test_async_without_shared_memory_keeps_a_stale_autoreset(tmp_path):
    """Gymnasium 1.4's AsyncVectorEnv(shared_memory=False) clears a worker's pending
    autoreset on an explicit reset only in its shared-memory branch: the env is reset
    twice and the trainer's next action is dropped. The ledger shows it as a kind
    difference at the event after the explicit reset."""
    path = run_gym(str(tmp_path), "async", "NextStep", n=2, steps=5, lengths=(2,), resets={1: ("mask", [True, False])})
    assert_differs(str(tmp_path), path, {0: (4, ["kind", "h_act"])})
    _, env = streams(str(tmp_path))
    assert env[0]["kind"].tolist()[:5] == [0, 1, 1, 0, 0]  # the env side: reset, reset


@pytest.mark.parametrize("act", ACTION_NAMES)
@pytest.mark.parametrize("obs", SPACE_NAMES)
def test_clean_spaces_sync(tmp_path, obs, act):
    for mode in MODES:
        directory = str(tmp_path / mode)
        path = run_gym(directory, "sync", mode, n=2, steps=12, obs=obs, act=act, lengths=(1, 3, 4),
                       ends=("term", "trunc", "both"), resets={5: ("mask", [False, True]), 8: "all"})
        assert_clean(directory, path, n_envs=2)


@pytest.mark.parametrize("obs", SPACE_NAMES)
@pytest.mark.parametrize("kind", ("async_shm", "async"))
def test_clean_spaces_async(tmp_path, kind, obs):
    i = SPACE_NAMES.index(obs)
    act = ACTION_NAMES[i % len(ACTION_NAMES)]
    mode = MODES[i % 2]
    path = run_gym(str(tmp_path), kind, mode, n=2, steps=10, obs=obs, act=act, lengths=(1, 3, 2),
                   ends=("term", "trunc", "both"), resets={4: ("mask", [False, True])}, avoid_pending=True)
    assert_clean(str(tmp_path), path, n_envs=2)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind, obs", [("sync", "box32"), ("sync", "dict"), ("sync", "tuple"),
                                       ("async_shm", "box32"), ("async", "box32")])
def test_clean_float64_values_for_a_float32_space(tmp_path, kind, mode, obs):
    path = run_gym(str(tmp_path), kind, mode, n=2, steps=10, obs=obs, lengths=(2, 3), ends=("term", "trunc"),
                   float64_obs=True)
    assert_clean(str(tmp_path), path, n_envs=2)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", VECTOR_KINDS)
def test_clean_float64_actions_for_a_float32_space(tmp_path, kind, mode):
    # The env receives the float64 action and LedgerEnv casts it; the trainer side casts the same way.
    path = run_gym(str(tmp_path), kind, mode, n=2, steps=8, act="box", lengths=(2, 3), float64_actions=True)
    assert_clean(str(tmp_path), path, n_envs=2)


@pytest.mark.parametrize("mode", MODES)
def test_clean_when_ledgers_spill(tmp_path, mode):
    # A memory limit of a few events: both sides spill segments again and again.
    limit = core.memory_limit()
    core.set_memory_limit(2000)
    try:
        path = run_gym(str(tmp_path), "sync", mode, n=3, steps=60, lengths=(1, 4, 2), ends=("term", "both"),
                       resets={20: "ended", 30: ("mask", [True, False, False])})
    finally:
        core.set_memory_limit(limit)
    assert assert_clean(str(tmp_path), path, n_envs=3) > 180


def test_written_at_exit_without_close(tmp_path, run_python):
    out = run_python("""
import sys, numpy as np, trainer_envs
from stepledger import LedgerVectorEnv
d = sys.argv[1] if len(sys.argv) > 1 else %r
envs = LedgerVectorEnv(trainer_envs.make_vector("sync", trainer_envs.factories(d, 2, lengths=(2, 3)), "SameStep"),
                       d + "/trainer.npz")
envs.reset(seed=0)
for _ in range(7):
    envs.step(envs.action_space.sample())
print("exiting without close")
""" % str(tmp_path))
    assert "exiting" in out
    assert assert_clean(str(tmp_path), str(tmp_path / "trainer.npz"), n_envs=2) >= 16


@pytest.mark.parametrize("kind", VECTOR_KINDS)
def test_reused_observation_array(tmp_path, kind):
    """Gymnasium issue 1132: an env that mutates one observation array in reset().

    NEXT_STEP copies the final obs into the batch before the reset: clean.
    SAME_STEP hands the trainer the reset obs as info['final_obs']: an obs
    difference at the last step of the episode, and nowhere earlier."""
    clean_dir = str(tmp_path / "next")
    path = run_gym(clean_dir, kind, "NextStep", n=2, steps=10, lengths=(3,), reuse_obs=True)
    assert_clean(clean_dir, path)

    fault_dir = str(tmp_path / "same")
    path = run_gym(fault_dir, kind, "SameStep", n=2, steps=10, lengths=(3,), reuse_obs=True)
    last = event_at(fault_dir, 0, 0, 3)
    assert last == 3
    assert_differs(fault_dir, path, {0: (last, ["h_obs"]), 1: (last, ["h_obs"])})


def test_a_scalar_observation_broadcast_into_shared_memory_differs(tmp_path):
    # AsyncVectorEnv with shared memory writes the env's scalar obs into a row of
    # three: the trainer receives [1.5, 1.5, 1.5] where the env gave 1.5.
    # (SyncVectorEnv and AsyncVectorEnv without shared memory raise instead.)
    fns = [functools.partial(make_scalar_obs_env, str(tmp_path), i) for i in range(2)]
    envs = LedgerVectorEnv(make_vector("async_shm", fns, "NextStep"), str(tmp_path / "trainer.npz"))
    envs.reset(seed=0)
    for _ in range(6):
        obs, *_ = envs.step(np.array([0, 1]))
    envs.close()
    assert_differs(str(tmp_path), str(tmp_path / "trainer.npz"), {0: (2, ["h_obs"]), 1: (2, ["h_obs"])})


@pytest.mark.parametrize("kind", ("sync", "async_shm"))
def test_same_step_end_without_final_obs(tmp_path, kind):
    """A SAME_STEP vector env that drops info['final_obs']: no exception, one warning,
    the final obs recorded as missing, an obs difference at each episode's end."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = run_gym(str(tmp_path), kind, "SameStep", n=3, steps=8, lengths=(3,), inner=DropFinalObs)
    ours = [w for w in caught if "final_obs" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "missing" in str(ours[0].message)
    assert_differs(str(tmp_path), path, {i: (3, ["h_obs"]) for i in range(3)})
    _, tr = streams(path)
    for c in tr.values():
        assert c["h_obs"][3] == core.MISSING_DIGEST and c["h_obs"][7] == core.MISSING_DIGEST
        assert c["kind"].tolist() == [0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1]


def test_keep_values_clean(tmp_path):
    for mode in MODES:
        directory = str(tmp_path / mode)
        path = run_gym(directory, "sync", mode, n=2, steps=12, obs="dict_tuple", act="dict", lengths=(1, 3, 2),
                       resets={4: ("mask", [True, False]), 7: "ended"}, keep_values=True)
        assert_clean(directory, path)
        env, tr = read(directory), read(path)
        try:
            for i in (0, 1):
                a, b = env.streams[i].values, tr.streams[i].values
                assert sorted(a) == sorted(b) and len(a) == 5  # 3 obs leaves, 2 action leaves
                for name in a:
                    assert np.array_equal(a[name], b[name]), (mode, i, name)
        finally:
            env.close()
            tr.close()


def test_reward_dtype_float64_clean(tmp_path):
    for mode in MODES:
        directory = str(tmp_path / mode)
        path = run_gym(directory, "sync", mode, n=2, steps=10, lengths=(2, 3), reward_dtype=np.float64)
        assert_clean(directory, path)
        assert read(path).meta["reward_dtype"] == "float64"


def test_async_spawn_workers(tmp_path):
    # The README's way for AsyncVectorEnv: workers that import the env factories afresh.
    path = run_gym(str(tmp_path), "async_shm", "NextStep", n=2, steps=8, lengths=(1, 3), context="spawn")
    assert_clean(str(tmp_path), path)


def test_pendulum_time_limits(tmp_path):
    from trainer_envs import make_ledger_gym
    for mode in MODES:
        d = tmp_path / mode
        fns = [functools.partial(make_ledger_gym, "Pendulum-v1", str(d), i, max_episode_steps=7) for i in range(2)]
        envs = LedgerVectorEnv(make_vector("sync", fns, mode), str(d / "trainer.npz"))
        envs.action_space.seed(0)
        envs.reset(seed=1)
        for _ in range(20):
            envs.step(envs.action_space.sample())
        envs.close()
        assert assert_clean(str(d), str(d / "trainer.npz")) >= 40


# ---------------------------------------------------------------- the autoreset mode


class _NoMode(gym.vector.VectorWrapper):
    """A vector env that does not declare its autoreset mode (like a bridge client)."""

    @property
    def metadata(self):
        return {k: v for k, v in self.env.metadata.items() if k != "autoreset_mode"}


def test_disabled_is_refused(tmp_path):
    venv = make_vector("sync", factories(str(tmp_path), 2), AutoresetMode.DISABLED)
    with pytest.raises(ValueError, match="DISABLED"):
        LedgerVectorEnv(venv, str(tmp_path / "t.npz"))
    with pytest.raises(ValueError, match="DISABLED"):
        LedgerVectorEnv(_NoMode(venv), str(tmp_path / "t.npz"), autoreset_mode="disabled")
    venv.close()


def test_unknown_mode_is_refused_unless_given(tmp_path):
    for mode in MODES:
        d = tmp_path / mode
        venv = _NoMode(make_vector("sync", factories(str(d), 2, lengths=(2, 3)), mode))
        with pytest.raises(ValueError, match="autoreset_mode="):
            LedgerVectorEnv(venv, str(d / "t.npz"))
        given = "next_step" if mode == "NextStep" else AutoresetMode.SAME_STEP
        envs = LedgerVectorEnv(venv, str(d / "trainer.npz"), autoreset_mode=given)
        steps_clean(envs)
        assert read(str(d / "trainer.npz")).meta["autoreset_mode"] == ("next_step" if mode == "NextStep"
                                                                       else "same_step")


def test_mode_given_overrides_the_declared_one(tmp_path):
    venv = make_vector("sync", factories(str(tmp_path), 2), "NextStep")
    envs = LedgerVectorEnv(venv, str(tmp_path / "t.npz"), autoreset_mode="same_step")
    assert envs.autoreset_mode == "same_step"
    envs.close()
    with pytest.raises(ValueError, match="autoreset_mode must be"):
        LedgerVectorEnv(make_vector("sync", factories(str(tmp_path), 2), "NextStep"), str(tmp_path / "t.npz"),
                        autoreset_mode="sometimes")


def test_gymnasium_1_0_vector_envs_are_next_step(tmp_path):
    # Gymnasium 1.0's own Sync and Async vector envs have no metadata['autoreset_mode']
    # and always reset on the next step; a subclass of them is not Gymnasium's own.
    venv = make_vector("sync", factories(str(tmp_path), 2, lengths=(2, 3)), "NextStep")
    venv.metadata = {k: v for k, v in venv.metadata.items() if k != "autoreset_mode"}
    venv.autoreset_mode = None  # 1.0 has no such attribute either (restored below, step() needs it)
    envs = LedgerVectorEnv(venv, str(tmp_path / "trainer.npz"))
    venv.autoreset_mode = AutoresetMode.NEXT_STEP
    assert envs.autoreset_mode == "next_step"
    steps_clean(envs)

    class MySync(SyncVectorEnv):
        pass

    sub = MySync(factories(str(tmp_path / "sub"), 2))
    sub.metadata = {}
    with pytest.raises(ValueError, match="cannot tell"):
        LedgerVectorEnv(sub, str(tmp_path / "sub.npz"))


@pytest.mark.parametrize("kind", ("sync", "async_shm"))
def test_a_mode_written_into_shared_metadata_does_not_mislead(tmp_path, kind):
    """Gymnasium 1.1 to 1.3 write autoreset_mode into the sub-env's metadata dict, often
    the env class's own, so a vector env built later with another mode overwrites it
    for all of them. The vector env's own autoreset_mode attribute is what it does."""
    venv = make_vector(kind, factories(str(tmp_path), 2, lengths=(2, 3)), "SameStep")
    venv.metadata["autoreset_mode"] = AutoresetMode.NEXT_STEP  # as a later NEXT_STEP vector env would
    envs = LedgerVectorEnv(venv, str(tmp_path / "trainer.npz"))
    assert envs.autoreset_mode == "same_step"
    steps_clean(envs)


def test_reset_mask_of_the_wrong_shape_is_refused_before_the_reset(tmp_path):
    envs = LedgerVectorEnv(make_vector("sync", factories(str(tmp_path), 3), "NextStep"), str(tmp_path / "t.npz"))
    envs.reset(seed=0)
    with pytest.raises(ValueError, match="reset_mask"):
        envs.reset(options={"reset_mask": np.array([True, False])})
    envs.step(envs.action_space.sample())
    envs.close()
    assert_clean(str(tmp_path), str(tmp_path / "t.npz"))


# ---------------------------------------------------------------- cost


def _stepledger_calls(fn):
    """Python-level calls made by stepledger code while fn() runs: Python
    functions of the package, and C functions (numpy, builtins) they call."""
    root = os.path.dirname(os.path.abspath(stepledger.__file__))
    count = [0]

    def prof(frame, event, arg):
        if event in ("call", "c_call") and frame.f_code.co_filename.startswith(root):
            count[0] += 1

    # Recordings other tests left open count toward this process's memory limit; a spill (or a
    # garbage collection running finalizers) in the measured step is not what this counts.
    from stepledger import core
    limit = core.memory_limit()
    core.set_memory_limit(1 << 60)
    gc.disable()
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
        gc.enable()
        core.set_memory_limit(limit)
    return count[0]


@pytest.mark.parametrize("obs", ("box32", "dict", "discrete"))
@pytest.mark.parametrize("mode", MODES)
def test_constant_python_calls_per_vector_step(tmp_path, mode, obs):
    # Plain envs, no LedgerEnv: only the trainer side's calls are counted.
    counts = []
    for n in (2, 12):
        d = tmp_path / str(n)
        fns = [functools.partial(ScriptedEnv, obs=obs, lengths=(50,), seed=i) for i in range(n)]
        envs = LedgerVectorEnv(make_vector("sync", fns, mode), str(d / "t.npz"))
        envs.reset(seed=0)
        actions = envs.action_space.sample()
        envs.step(actions)
        counts.append(_stepledger_calls(lambda: envs.step(actions)))
        envs.close()
    assert counts[0] == counts[1], counts
    # One-leaf spaces skip the Python cast entirely: LedgerVectorEnv.step, the core's actions() and its
    # step_*_results() (episodes of 50 steps: no env ends here). A Dict goes through spaces.LeafLayout once.
    assert counts[0] <= (3 if obs != "dict" else 31), counts
