"""The ledgers leave the envs they wrap, and the vector envs they look into, as fast as they were.

Building a trainer-side ledger walks the wrapper stack of the vector env and of each env in it (to warn
about wrappers that change values). It once read each object's ``__dict__`` to do so. On CPython 3.11
that gives the object a real dict for the rest of its life, and each attribute access in its methods
then leaves the specialized fast path: every Pendulum step of a SyncVectorEnv of 16 cost some 6% more
(about 120,000 more instructions a vector step under callgrind, against about 30,000 for the ledger's
own work). Here the interpreter itself is asked: after stepping through the ledgers, the attribute
loads in the env's ``step`` are still specialized for objects without a dict.

Each test builds an env class of its own, with code objects of its own, so that no other test's envs
(which share gymnasium's wrapper code) can change how that code is specialized.
"""

import dis
import itertools
import os
import sys
import types

import gymnasium as gym
import numpy as np
import pytest

from stepledger import LedgerEnv, LedgerVectorEnv
from stepledger.recording.placement import own_attr

pytestmark = pytest.mark.skipif(
    sys.implementation.name != "cpython" or sys.version_info < (3, 11),
    reason="asks CPython 3.11+'s specializing interpreter how it runs the env's step")

# 3.13 keeps an object's inline values valid after its __dict__ is read: there the control cannot show it
READING_DICT_DEOPTS = sys.version_info < (3, 13)

_SOURCE = '''
class CountingEnv(gym.Env):
    def __init__(self):
        self.observation_space = gym.spaces.Box(-1e9, 1e9, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t, self.limit, self.gain = 0, 7, 0.5

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t = self.t + 1
        obs = np.array([self.t, self.gain * self.t], np.float32)
        return obs, self.gain, self.t >= self.limit, False, {}
'''
_classes = itertools.count()


def _env_class():
    namespace = {"gym": gym, "np": np}
    exec(compile(_SOURCE, "<counting-env-%d>" % next(_classes), "exec"), namespace)
    return namespace["CountingEnv"]


def _fresh_ledger_env_class():
    """LedgerEnv with a step of its own code object (the same code), so that its specialization is this test's."""
    step = LedgerEnv.step
    fresh = types.FunctionType(step.__code__.replace(), step.__globals__, step.__name__, step.__defaults__)
    return type("FreshLedgerEnv%d" % next(_classes), (LedgerEnv,), {"step": fresh})


def _attribute_loads(cls, names=("t", "gain", "limit")):
    """The specialized forms of the loads of the object's own attributes ``names`` in ``cls.step``, as run so far."""
    return [i.opname for i in dis.get_instructions(cls.step, adaptive=True)
            if i.opname.startswith("LOAD_ATTR") and i.argval in names]


def _step(envs, steps=80, n=3):
    envs.reset(seed=0)
    actions = np.zeros((n, 1), np.float32)
    for _ in range(steps):
        envs.step(actions)


def _assert_fast(cls, names=("t", "gain", "limit")):
    loads = _attribute_loads(cls, names)
    assert loads and all(op == "LOAD_ATTR_INSTANCE_VALUE" for op in loads), loads


def test_trainer_side_leaves_the_envs_fast(tmp_path):
    cls = _env_class()
    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([cls for _ in range(3)]), str(tmp_path / "trainer.npz"))
    _step(envs)
    _assert_fast(cls)
    envs.close()


def test_both_sides_leave_the_envs_fast(tmp_path):
    cls, ledger_env = _env_class(), _fresh_ledger_env_class()
    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([lambda i=i: ledger_env(cls(), str(tmp_path), index=i)
                                                     for i in range(3)]), str(tmp_path / "trainer.npz"))
    _step(envs)
    _assert_fast(cls)
    _assert_fast(ledger_env, ("env", "live"))  # LedgerEnv's own step (these loads are on its every step)
    envs.close()
    assert sorted(os.listdir(tmp_path)) == ["env-0.npz", "env-1.npz", "env-2.npz", "trainer.npz"]


def test_sb3_adapter_leaves_the_envs_fast(tmp_path):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv
    from stepledger.sb3 import LedgerVecEnv
    cls = _env_class()
    venv = LedgerVecEnv(DummyVecEnv([cls for _ in range(3)]), str(tmp_path / "trainer.npz"))
    venv.reset()
    for _ in range(80):
        venv.step(np.zeros((3, 1), np.float32))
    _assert_fast(cls)
    venv.close()


@pytest.mark.skipif(not READING_DICT_DEOPTS, reason="this CPython keeps the fast path after __dict__ is read")
def test_reading_an_envs_dict_is_what_slows_it(tmp_path):
    # The control: the same stack, with each env's __dict__ read once, as the wrapper walk once did.
    cls = _env_class()
    vec = gym.vector.SyncVectorEnv([cls for _ in range(3)])
    envs = LedgerVectorEnv(vec, str(tmp_path / "trainer.npz"))
    for env in vec.envs:
        env.__dict__
    _step(envs)
    assert any(op != "LOAD_ATTR_INSTANCE_VALUE" for op in _attribute_loads(cls)), _attribute_loads(cls)
    envs.close()


def test_own_attr_is_not_forwarded_and_does_not_raise():
    cls = _env_class()
    env = gym.wrappers.TimeLimit(cls(), 5)
    assert own_attr(env, "env") is env.env
    assert own_attr(env, "t") is None           # the inner env's attribute: not the wrapper's own
    assert own_attr(env.env, "t") == 0
    assert own_attr(env, "no_such_name") is None
    assert own_attr(object(), "env") is None    # no dict at all
