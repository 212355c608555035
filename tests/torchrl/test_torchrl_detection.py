"""The detection matrix on TorchRL: every env-side fault x dose is caught and located, through a real Collector.

As tests/faults/test_detection_matrix.py does for Gymnasium's and SB3's vector envs: each env-side fault is
injected by FaultyEnv outside LedgerEnv in each env (``ledger_env_fns(wrap=...)``), inside TorchRL's
GymWrapper; random actions from the action spec (no policy); each env's first change must be where compare says
its first difference is, and the envs the fault never touched compare clean. The batched env is a SerialEnv, to
keep the matrix to a few minutes; ParallelEnv's worker processes are covered in test_torchrl.py. The swaps
between envs need an injector between the batched env and the collector, which is not built yet.
"""

import os
import warnings

import pytest

pytest.importorskip("torchrl")

from stepledger.faults.check import is_located  # noqa: E402
from stepledger.faults.engine import ENV_SIDE_FAULTS, FAULTS, read_record  # noqa: E402
from stepledger.gymnasium.faults import FaultyEnv  # noqa: E402
from stepledger.report.compare import compare  # noqa: E402
from stepledger.torchrl import LedgerCollector, ledger_env_fns  # noqa: E402

import trl_envs  # noqa: E402

N_ENVS = 2
DOSES = ("one", 0.01, "all")


def _env_for(fault):
    """Pendulum (Box actions, time limits) unless the fault needs terminations."""
    if fault.split(":")[0] == "terminated" and fault != "terminated:spurious":
        return trl_envs.Make("CartPole-v1", 200)
    return trl_envs.Make("Pendulum-v1", 9)


class _Inject:
    def __init__(self, fault, dose, directory):
        self.fault, self.dose, self.directory = fault, dose, directory

    def __call__(self, env, index):
        return FaultyEnv(env, self.fault, index=index, dose=self.dose, at=7, target=N_ENVS - 1, seed=3,
                         record=os.path.join(self.directory, "fault-%d.json" % index))


def _steps(fault, dose):
    if dose != 0.01:
        return 60
    if fault.split(":")[0] == "terminated":
        return 6000  # CartPole's terminations, 1 in 100 of them struck: enough of them in both envs
    return 1500 if fault.split(":")[0] in ("final-obs", "truncated") else 400


@pytest.mark.parametrize("dose", DOSES, ids=str)
@pytest.mark.parametrize("fault", FAULTS)
def test_fault_is_caught_and_located_through_a_collector(tmp_path, fault, dose):
    if fault not in ENV_SIDE_FAULTS:
        pytest.skip("%s is a trainer-side fault: no injector between TorchRL's batched env and its collector yet"
                    % fault)
    import torch
    torch.manual_seed(0)  # the collector's random actions come from the spec's rand(): the same run every time
    d = str(tmp_path)
    steps = _steps(fault, dose)
    fns = ledger_env_fns(_env_for(fault), N_ENVS, d, pass_index=True, wrap=_Inject(fault, dose, d), seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # stepping an env its fault kept from ending
        c = LedgerCollector(trl_envs.collector("single", trl_envs.batched("serial", fns), N_ENVS * min(steps, 100),
                                               N_ENVS * steps), os.path.join(d, "trainer.npz"), fns)
        for _ in c:
            pass
        c.shutdown()
    firsts = {i: r for i in range(N_ENVS) if (r := read_record(os.path.join(d, "fault-%d.json" % i)))}
    assert firsts, "the fault was never injected: no opportunity in this rollout"
    report = compare(d, c.ledger_path)
    by_env = report.by_env()
    for env, first in firsts.items():
        diff = by_env.get(env)
        assert diff is not None, "env %d was hit (%s) but compare found no difference:\n%s" % (env, first, report)
        assert is_located(diff, first), "env %d hit at %s, compare said: %s" % (env, first, diff.line())
    for env in set(range(N_ENVS)) - set(firsts):
        assert env not in by_env, by_env[env].line()
