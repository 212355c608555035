"""The detection matrix: every fault x dose x harness is caught and located.

This is the paper's central claim (a step ledger catches and locates every
boundary fault) as a test the project passes every day, with random actions
in place of PPO (benchmarks/detection.py runs the PPO version).
"""

import pytest

from fault_harness import HARNESSES, N_ENVS, rollout
from stepledger.check import is_located
from stepledger.report.compare import EnvDifference
from stepledger.faults import FAULTS, reported_fields

DOSES = ("one", 0.01, "all")


def _steps(fault, dose):
    """Enough steps that a 1% dose meets an opportunity: episode-end faults have few."""
    if dose != 0.01:
        return 60
    ends = fault.split(":")[0] in ("final-obs", "terminated", "truncated")
    return 3000 if ends else 400


@pytest.mark.parametrize("harness", HARNESSES)
def test_clean_control(tmp_path, harness):
    report, firsts = rollout(str(tmp_path), harness)
    assert report.ok, str(report)
    assert len(report.envs) == N_ENVS and not firsts


@pytest.mark.parametrize("dose", DOSES, ids=str)
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("harness", HARNESSES)
def test_fault_is_caught_and_located(tmp_path, harness, fault, dose):
    report, firsts = rollout(str(tmp_path), harness, fault, dose, steps=_steps(fault, dose))
    assert firsts, "the fault was never injected: no opportunity in this rollout"
    assert not report.ok
    by_env = report.by_env()
    for env, first in firsts.items():
        d = by_env.get(env)
        assert d is not None, "env %d was hit (%s) but compare found no difference:\n%s" % (env, first, report)
        assert is_located(d, first), "env %d hit at %s, compare said: %s" % (env, first, d.line())
    # envs the fault never touched compare clean
    for env in set(range(N_ENVS)) - set(firsts):
        assert env not in by_env, by_env[env].line()


def _at(fields, what="fields", episode=2, step=5):
    return EnvDifference(0, what, 30, episode, step, fields)


@pytest.mark.parametrize("fault", FAULTS)
def test_located_means_at_the_event_and_under_exactly_its_fields(fault):
    injected = {"fault": fault, "episode": 2, "step": 5}
    expected = tuple(sorted(reported_fields(fault)))
    if fault == "step:fill":
        assert is_located(_at(("kind",), "kind"), injected) and is_located(_at(("action", "obs")), injected)
        assert is_located(_at((), "length", 2, 4), injected)
        assert not is_located(_at((), "length", None, None), injected)  # no event in common: no position
        assert not is_located(_at(("terminated",)), injected) and not is_located(_at(("obs", "truncated")), injected)
        return
    assert is_located(_at(expected), injected)
    assert not is_located(_at(expected, episode=3), injected) and not is_located(_at(expected, step=4), injected)
    others = [f for f in ("kind", "action", "obs", "reward", "terminated", "truncated") if f not in expected]
    for other in others:
        assert not is_located(_at(expected + (other,)), injected), other  # one field more
        assert not is_located(_at((other,)), injected), other  # filed under another field
    if len(expected) > 1:
        assert not is_located(_at(expected[:1]), injected)  # one field fewer
    assert not is_located(_at((), "length", 2, 4), injected)
