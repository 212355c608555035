"""What every adapter gets from recording/adapters.py (EnvAdapter, TrainerAdapter) and the engine: the
interrupted mark when the wrapped env's call raises, ledger_path, live_faults, flush, close, the final-obs
name given at construction, the autoreset check's one home. Each adapter around real vector envs
(Gymnasium's SyncVectorEnv and AsyncVectorEnv, SB3's DummyVecEnv, SuperSuit's) and a small env that
breaks when told to."""

import os

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces as gs

from stepledger import LedgerEnv, LedgerVectorEnv, TrainerLedger, read
from stepledger.errors import one_line
from stepledger.format import schema as S
from stepledger.recording.adapters import EnvAdapter, TrainerAdapter
from stepledger.recording.trainer import check_autoreset_mode

from envs_for_tests import CountEnv


class _Breaks(CountEnv):
    """CountEnv that raises at its ``fail_at``-th step, or at its second reset with ``fail_at=0``."""

    def __init__(self, fail_at):
        super().__init__(length=50)
        self.fail_at, self.resets, self.steps = fail_at, 0, 0

    def reset(self, *, seed=None, options=None):
        self.resets += 1
        if self.fail_at == 0 and self.resets == 2:
            raise RuntimeError("the env broke in reset")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("the env broke in step")
        return super().step(action)


def _state(path):
    return read(path).meta[S.META_STATE]


def _breaking(tmp_path, fail_at, n=2):
    return [lambda i=i: LedgerEnv(_Breaks(fail_at if i == n - 1 else -1), str(tmp_path), index=i) for i in range(n)]


@pytest.mark.parametrize("where", ["step", "reset", "none"])
@pytest.mark.parametrize("calls", ["step", "split"])
def test_gymnasium_both_sides_are_marked_interrupted_when_the_env_raises(tmp_path, where, calls):
    fail_at = {"step": 3, "reset": 0, "none": -1}[where]
    # Gymnasium's SyncVectorEnv has no split calls: AsyncVectorEnv's, in worker processes
    kind = gym.vector.AsyncVectorEnv if calls == "split" else gym.vector.SyncVectorEnv
    envs = kind(_breaking(tmp_path, fail_at))
    trainer = str(tmp_path / "trainer.npz")
    venv = LedgerVectorEnv(envs, trainer)
    assert isinstance(venv, TrainerAdapter) and venv.ledger_path == trainer and venv.live_faults == []

    def step():
        if calls == "split":
            venv.step_async(np.zeros(2, np.int64))
            return venv.step_wait()
        return venv.step(np.zeros(2, np.int64))

    def reset():
        if calls == "split":
            venv.reset_async(seed=1)
            return venv.reset_wait()
        return venv.reset(seed=1)

    reset()
    with pytest.raises(RuntimeError, match="the env broke") if where != "none" else _nothing():
        for _ in range(4):
            step()
        reset()
    venv.close()
    expected = S.STATE_CLOSED if where == "none" else S.STATE_INTERRUPTED
    assert _state(trainer) == expected
    assert _state(str(tmp_path / "env-1.npz")) == expected  # LedgerEnv (EnvAdapter) around the env that broke
    assert _state(str(tmp_path / "env-0.npz")) == S.STATE_CLOSED


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_close_passes_its_arguments_to_the_vector_env(tmp_path):
    envs = gym.vector.SyncVectorEnv([lambda: CountEnv()])
    seen = {}
    close = envs.close
    envs.close = lambda **kwargs: (seen.update(kwargs), close(**kwargs))
    venv = LedgerVectorEnv(envs, str(tmp_path / "t.npz"))
    venv.reset(seed=0)
    venv.close(terminate=True)
    assert seen == {"terminate": True} and os.path.exists(str(tmp_path / "t.npz"))


@pytest.mark.parametrize("where", ["step", "reset"])
def test_sb3_is_marked_interrupted_when_the_vec_env_raises(tmp_path, where):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv

    from stepledger.sb3 import LedgerVecEnv
    venv = LedgerVecEnv(DummyVecEnv(_breaking(tmp_path, 3 if where == "step" else 0)), str(tmp_path / "t.npz"))
    assert isinstance(venv, TrainerAdapter) and venv.ledger_path == str(tmp_path / "t.npz")
    venv.reset()
    with pytest.raises(RuntimeError, match="the env broke"):
        for _ in range(4):
            venv.step(np.zeros(2, np.int64))
        venv.reset()
    venv.set_on_fault("record")
    venv.close()
    assert _state(str(tmp_path / "t.npz")) == S.STATE_INTERRUPTED


class _BreakingParallel:
    """Built lazily: PettingZoo is an extra."""

    @staticmethod
    def make(fail_at):
        from parallel_envs import ScriptedParallelEnv

        class Breaks(ScriptedParallelEnv):
            def __init__(self):
                super().__init__()
                self.steps, self.resets = 0, 0

            def reset(self, seed=None, options=None):
                self.resets += 1
                if fail_at == 0 and self.resets == 2:
                    raise RuntimeError("the env broke in reset")
                return super().reset(seed=seed, options=options)

            def ends(self, live):
                return {a: False for a in live}, {a: False for a in live}

            def step(self, actions):
                self.steps += 1
                if self.steps == fail_at:
                    raise RuntimeError("the env broke in step")
                return super().step(actions)

        return Breaks()


@pytest.mark.parametrize("where", ["step", "reset"])
def test_pettingzoo_both_sides_are_marked_interrupted_when_the_env_raises(tmp_path, where):
    pytest.importorskip("pettingzoo")
    ss = pytest.importorskip("supersuit")
    from stepledger.pettingzoo import LedgerParallelEnv, LedgerSuperSuitVecEnv
    env = LedgerParallelEnv(_BreakingParallel.make(3 if where == "step" else 0), str(tmp_path))
    assert isinstance(env, EnvAdapter) and env.ledger_path is None  # no index yet
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 1, num_cpus=0, base_class="gymnasium")
    venv = LedgerSuperSuitVecEnv(venv, str(tmp_path / "t.npz"))
    assert isinstance(venv, TrainerAdapter) and venv.ledger_path == str(tmp_path / "t.npz")
    assert venv.live_faults == []
    venv.reset(seed=0)
    with pytest.raises(RuntimeError, match="the env broke"):
        for _ in range(4):
            venv.step(np.zeros(3, np.int64))
        venv.reset(seed=1)
    venv.close()
    assert _state(str(tmp_path / "t.npz")) == S.STATE_INTERRUPTED
    assert _state(str(tmp_path / "env-0.npz")) == S.STATE_INTERRUPTED


def test_the_final_obs_name_is_given_at_construction(tmp_path):
    led = TrainerLedger(str(tmp_path / "t.npz"), 2, gs.Box(-1, 1, (3,)), gs.Discrete(2), autoreset_mode="same_step",
                        final_obs_name="infos[{i}]['where_it_is']")
    assert led.final_obs_name == "infos[{i}]['where_it_is']"
    led.reset(np.zeros((2, 3), np.float32))
    led.actions(np.zeros(2, np.int64))
    with pytest.warns(UserWarning, match=r"env 1 ended an episode without infos\[1\]\['where_it_is'\]"):
        led.step(np.zeros((2, 3), np.float32), np.zeros(2), np.array([False, True]), np.zeros(2, bool), None)
    led.close()
    assert TrainerLedger(None, 1, gs.Box(-1, 1, (3,)), gs.Discrete(2), live=True).final_obs_name == \
        "its final observation"


@pytest.mark.parametrize("mode, declared, message", [
    ("sometimes", False, "X: autoreset_mode must be 'next_step' or 'same_step' (or an AutoresetMode), got 'sometimes'"),
    ("sometimes", True, "X: the vector env declares an unknown autoreset_mode 'sometimes'; pass autoreset_mode= "
                        "explicitly"),
    ("disabled", False, "X: autoreset mode DISABLED is not supported"),
    (gym.vector.AutoresetMode.DISABLED, True, "X: autoreset mode DISABLED is not supported"),
])
def test_the_autoreset_check_has_one_home(mode, declared, message):
    with pytest.raises(ValueError) as info:
        check_autoreset_mode(mode, "X", declared=declared)
    assert str(info.value).startswith(message)
    assert check_autoreset_mode(gym.vector.AutoresetMode.SAME_STEP, "X") == "same_step"
    assert check_autoreset_mode("NextStep", "X", declared=True) == "next_step"


def test_the_autoreset_messages_are_the_same_from_every_adapter():
    envs = gym.vector.VectorWrapper(gym.vector.SyncVectorEnv([lambda: CountEnv()]))
    envs.metadata = {"autoreset_mode": "sometimes"}  # a bridge's own, not its Gymnasium vector env's
    with pytest.raises(ValueError, match="LedgerVectorEnv: the vector env declares an unknown autoreset_mode"):
        LedgerVectorEnv(envs, None, live=True)
    for owner, build in (("LedgerVectorEnv", lambda: LedgerVectorEnv(envs, None, live=True,
                                                                      autoreset_mode="disabled")),
                         ("TrainerLedger", lambda: TrainerLedger(None, 1, gs.Box(-1, 1, (3,)), gs.Discrete(2),
                                                                 live=True, autoreset_mode="disabled"))):
        with pytest.raises(ValueError, match="%s: autoreset mode DISABLED is not supported" % owner):
            build()
    envs.close()


def test_one_line():
    assert one_line(RuntimeError("first\nsecond")) == "first"
    assert one_line(KeyError()) == "KeyError"
    assert one_line(ValueError("x" * 300)) == "x" * 200
