"""The RLlib tests' one Ray session: test_rllib.py's runs and test_rllib_multiagent.py's CI set go to one
harness subprocess (tests/rllib_harness.py), so that Ray's start and the harness's imports are paid once for
both files. The run ended by ray.shutdown() alone comes last. Each file's ``runs`` fixture takes its part.
"""

import pytest


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
    """{"single": test_rllib.py's runs, "multi": test_rllib_multiagent.py's}, each {name: (spec, what it did)}."""
    from rllib import test_rllib, test_rllib_multiagent
    base = tmp_path_factory.mktemp("runs")
    parts = {"single": test_rllib.specs(base / "single"), "multi": test_rllib_multiagent.ci_specs(base / "multi")}
    order = [(part, name) for part, specs in parts.items() for name in specs if (part, name) != ("single", "shutdown")]
    order.append(("single", "shutdown"))
    outs = test_rllib.run([parts[part][name] for part, name in order], timeout=1800)
    runs = {part: {} for part in parts}
    for (part, name), out in zip(order, outs):
        runs[part][name] = (parts[part][name], out)
    return runs
