"""The detection matrix on TorchRL: every fault x dose is caught and located, through a real Collector.

As tests/faults/test_detection_matrix.py does for Gymnasium's and SB3's vector envs. Each env-side fault is
injected by FaultyEnv outside LedgerEnv in each env (``ledger_env_fns(wrap=...)``), inside TorchRL's
GymWrapper; the swaps between envs, which no worker can make, by ``FaultyTransform`` on the batched env
(``TransformedEnv(SerialEnv(...), FaultyTransform(...))``), between it and the collector, where every other
trainer-side fault is run too. Random actions from the action spec (no policy); each env's first change must be
where compare says its first difference is, and the envs the fault never touched compare clean. The batched
env is a SerialEnv, to keep the matrix to a minute or so; one case runs through ParallelEnv's worker processes
(and test_torchrl.py has more of them).
"""

import argparse
import os
import warnings

import pytest

pytest.importorskip("torchrl")

from stepledger.faults.check import is_located  # noqa: E402
from stepledger.faults.engine import ENV_SIDE_FAULTS, FAULTS, TRAINER_SIDE_FAULTS, read_record  # noqa: E402
from stepledger.gymnasium.faults import FaultyEnv  # noqa: E402
from stepledger.report.compare import compare  # noqa: E402
from stepledger.torchrl import FaultyTransform, LedgerCollector, check_collector, ledger_env_fns  # noqa: E402
from stepledger.torchrl.check import check_from_cli  # noqa: E402

import trl_envs  # noqa: E402

N_ENVS = 2
DOSES = ("one", 0.01, "all")
AT, SEED = 7, 3
# the faults only the batched env's transform can make: the swaps between envs
SWAPS = tuple(f for f in TRAINER_SIDE_FAULTS if f not in ENV_SIDE_FAULTS)


def _env_for(fault):
    """Pendulum (Box actions, time limits) unless the fault needs terminations."""
    if fault.split(":")[0] == "terminated" and fault != "terminated:spurious":
        return trl_envs.Make("CartPole-v1", 200)
    return trl_envs.Make("Pendulum-v1", 9)


class _Inject:
    def __init__(self, fault, dose, directory):
        self.fault, self.dose, self.directory = fault, dose, directory

    def __call__(self, env, index):
        return FaultyEnv(env, self.fault, index=index, dose=self.dose, at=AT, target=N_ENVS - 1, seed=SEED,
                         record=os.path.join(self.directory, "fault-%d.json" % index))


def _steps(fault, dose):
    if dose != 0.01:
        return 60
    if fault.split(":")[0] == "terminated":
        return 6000  # CartPole's terminations, 1 in 100 of them struck: enough of them in both envs
    return 1500 if fault.split(":")[0] in ("final-obs", "truncated") else 400


def _collect(d, fault, dose, place, vector="serial", at=AT):
    """One run with ``fault`` injected at ``place`` ("worker" or "batched"); returns (compare's report, each
    struck env's first change)."""
    import torch
    from torchrl.envs import TransformedEnv
    torch.manual_seed(0)  # the collector's random actions come from the spec's rand(): the same run every time
    steps = _steps(fault, dose)
    wrap = _Inject(fault, dose, d) if place == "worker" else None
    fns = ledger_env_fns(_env_for(fault), N_ENVS, d, pass_index=True, wrap=wrap, seed=SEED)
    env = trl_envs.batched(vector, fns)
    injector = None
    if place == "batched":
        injector = FaultyTransform(fault, dose, at=at, target=N_ENVS - 1, seed=SEED)
        env = TransformedEnv(env, injector)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # stepping an env its fault kept from ending
        c = LedgerCollector(trl_envs.collector("single", env, N_ENVS * min(steps, 100), N_ENVS * steps),
                            os.path.join(d, "trainer.npz"), fns)
        for _ in c:
            pass
        c.shutdown()
    if injector is not None:
        firsts = dict(injector.where.by_env)
    else:
        firsts = {i: r for i in range(N_ENVS) if (r := read_record(os.path.join(d, "fault-%d.json" % i)))}
    return compare(d, c.ledger_path), firsts


def _assert_located(report, firsts):
    assert firsts, "the fault was never injected: no opportunity in this rollout"
    by_env = report.by_env()
    for env, first in firsts.items():
        diff = by_env.get(env)
        assert diff is not None, "env %d was hit (%s) but compare found no difference:\n%s" % (env, first, report)
        assert is_located(diff, first), "env %d hit at %s, compare said: %s" % (env, first, diff.line())
    for env in set(range(N_ENVS)) - set(firsts):
        assert env not in by_env, by_env[env].line()


@pytest.mark.parametrize("dose", DOSES, ids=str)
@pytest.mark.parametrize("fault", FAULTS)
def test_fault_is_caught_and_located_through_a_collector(tmp_path, fault, dose):
    """Each fault where a stack would make it: in the worker if it can be made there, else (the swaps) between
    the batched env and the collector."""
    place = "worker" if fault in ENV_SIDE_FAULTS else "batched"
    _assert_located(*_collect(str(tmp_path), fault, dose, place))


@pytest.mark.parametrize("dose", ("one", "all"), ids=str)
@pytest.mark.parametrize("fault", [f for f in TRAINER_SIDE_FAULTS if f not in SWAPS])
def test_trainer_side_fault_between_the_batched_env_and_the_collector_is_located(tmp_path, fault, dose):
    """The other trainer-side faults through FaultyTransform: the action changed on its way into the batched
    env (the batch keeps the policy's), the feedback and flags on their way out (the collector resets as the
    faulty flags say)."""
    _assert_located(*_collect(str(tmp_path), fault, dose, "batched"))


def test_a_swap_through_a_parallel_env_is_located(tmp_path):
    """The swapped action crosses ParallelEnv's shared memory into the worker, whose LedgerEnv records it."""
    report, firsts = _collect(str(tmp_path), "action:swap", "one", "batched", vector="parallel")
    assert list(firsts) == [N_ENVS - 1] and firsts[N_ENVS - 1]["step"] == AT + 1, firsts
    _assert_located(report, firsts)


def test_the_transform_with_no_fault_due_compares_clean(tmp_path):
    report, firsts = _collect(str(tmp_path), "obs:swap", "one", "batched", at=10 ** 6)
    assert not firsts
    assert report.ok, str(report)


def test_stepledger_check_runs_the_swaps_through_the_transform(tmp_path):
    """``stepledger check --trainer torchrl`` (its ``check_from_cli``, without the subprocess): an env-side fault
    in the worker and the swaps through the transform; ``place="batched"`` takes every trainer-side fault there."""
    args = argparse.Namespace(env_id="Pendulum-v1", max_episode_steps=9, torchrl_vector="serial",
                              torchrl_place="worker", num_envs=N_ENVS, steps=30, faults="obs:f16,obs:swap,action:swap",
                              dir=str(tmp_path / "worker"), keep=False)
    report = check_from_cli(args, None)
    assert report.ok and [r.located for r in report.results] == [True] * 3, str(report)
    batched = check_collector(trl_envs.Make("Pendulum-v1", 9), vector="serial", steps=30, place="batched",
                              faults=["terminated:spurious"], directory=str(tmp_path / "batched"))
    assert batched.ok and batched.results[0].located, str(batched)


def test_bad_arguments_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match=r"^stepledger.torchrl.FaultyTransform: unknown or unsupported fault "
                                         r"'step:fill'; choose one of [^\n]*$"):
        FaultyTransform("step:fill")
    with pytest.raises(ValueError, match=r"^dose must be"):
        FaultyTransform("obs:swap", dose=2)
    with pytest.raises(ValueError, match=r"^check_collector: place must be one of worker, batched, got 'vector'$"):
        check_collector(trl_envs.Make(), place="vector")
    with pytest.raises(ValueError, match=r"^check_collector: unknown or unsupported fault 'step:fill'"):
        check_collector(trl_envs.Make(), place="batched", faults=["step:fill"])
