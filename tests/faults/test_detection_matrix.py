"""The detection matrix: every fault x dose x harness is caught and located.

This is the paper's central claim (a step ledger catches and locates every
boundary fault) as a test the project passes every day, with random actions
in place of PPO (benchmarks/detection.py runs the PPO version).
"""

import pytest

from fault_harness import DOSES, HARNESSES, N_ENVS, assert_located, rollout, steps_for
from stepledger.check import is_located
from stepledger.report.compare import EnvDifference
from stepledger.faults import FAULTS, reported_fields



@pytest.mark.parametrize("harness", HARNESSES)
def test_clean_control(tmp_path, harness):
    report, firsts = rollout(str(tmp_path), harness)
    assert report.ok, str(report)
    assert len(report.envs) == N_ENVS and not firsts


@pytest.mark.parametrize("dose", DOSES, ids=str)
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("harness", HARNESSES)
def test_fault_is_caught_and_located(tmp_path, harness, fault, dose):
    report, firsts = rollout(str(tmp_path), harness, fault, dose, steps=steps_for(fault, dose))
    assert_located(report, firsts)


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
