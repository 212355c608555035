"""The detection matrix on Tianshou: every fault x dose is caught and located, through a real Collector.

As tests/test_detection_matrix.py does for Gymnasium's and SB3's vector envs: env-side faults are injected by
FaultyEnv outside LedgerEnv in each env (``ledger_env_fns(wrap=...)``), the swaps between envs by
``FaultyVectorEnv`` between the vector env and the ``LedgerCollector``; random actions
(``collect(random=True)``) into a VectorReplayBuffer; each env's first change must be where compare says its
first difference is, and the envs the fault never touched compare clean. The vector env is a
DummyVectorEnv, to keep the matrix to a minute or two; the worker processes of SubprocVectorEnv and
ShmemVectorEnv are covered at dose "one" in test_tianshou.py.
"""

import os
import warnings

import gymnasium as gym
import pytest

pytest.importorskip("tianshou")

from tianshou.data import VectorReplayBuffer  # noqa: E402

from stepledger.faults.engine import FAULTS, read_record  # noqa: E402
from stepledger.gymnasium.faults import FaultyEnv  # noqa: E402
from stepledger.report.compare import compare  # noqa: E402
from stepledger.tianshou import FaultyVectorEnv, ledger_env_fns  # noqa: E402

import ts_envs  # noqa: E402
from fault_harness import DOSES, N_ENVS, assert_located, env_for, steps_for  # noqa: E402


class _Make:
    def __init__(self, env_id, limit):
        self.env_id, self.limit = env_id, limit

    def __call__(self, index):
        env = gym.make(self.env_id, max_episode_steps=self.limit)
        # seeded before its ledger wraps it: whether a rollout meets an episode end where a fault needs one is
        # then the same in every run (the Collector's resets pass no seed)
        env.reset(seed=10 + index)
        return env


class _Inject:
    def __init__(self, fault, dose, directory):
        self.fault, self.dose, self.directory = fault, dose, directory

    def __call__(self, env, index):
        return FaultyEnv(env, self.fault, index=index, dose=self.dose, at=7, target=N_ENVS - 1, seed=3,
                         record=os.path.join(self.directory, "fault-%d.json" % index))


@pytest.mark.parametrize("dose", DOSES, ids=str)
@pytest.mark.parametrize("fault", FAULTS)
def test_fault_is_caught_and_located_through_a_collector(tmp_path, fault, dose):
    d = str(tmp_path)
    swap = fault.endswith(":swap")
    wrap = None if swap else _Inject(fault, dose, d)
    venv = ts_envs.vector_env("dummy", ledger_env_fns(_Make(*env_for(fault)), N_ENVS, d, pass_index=True, wrap=wrap))
    injector = None
    if swap:
        venv = injector = FaultyVectorEnv(venv, fault, dose=dose, at=7, target=N_ENVS - 1, seed=3)
    steps = steps_for(fault, dose)
    collector = ts_envs.random_collector(venv, d, buffer=VectorReplayBuffer((steps + 1) * N_ENVS, N_ENVS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # stepping an env its fault kept from ending
        collector.reset()
        collector.collect(n_step=steps * N_ENVS, random=True)
        collector.close()
    if injector is not None:
        firsts = dict(injector.where.by_env)
    else:
        firsts = {i: r for i in range(N_ENVS) if (r := read_record(os.path.join(d, "fault-%d.json" % i)))}
    assert_located(compare(d, os.path.join(d, "trainer.npz")), firsts, N_ENVS)
