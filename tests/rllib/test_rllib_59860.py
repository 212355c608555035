"""Ray issue 59860 reproduced on Ray 2.53.0, in a venv of its own: when several agents feed one module,
RLlib 2.53's multi-agent env runner logs as the module's episode return one agent's return, not their sum
(``MultiAgentEnvRunner.get_metrics`` builds it as ``{sa_eps.module_id: sa_eps.get_return() ...}`` over the
episode's last chunk, so the last agent's return stands; Ray 2.60 adds them up).
The episode check of an instrumented run (``stepledger episodes PATH PATH``) names the shared module, the agents
that feed it and what the env recorded for each, in every episode. tests/rllib/test_rllib_multiagent.py checks
the same kind of run on Ray 2.60, where it is clean.

The venv (``ray[rllib]==2.53.0`` and the CPU torch) is built once and kept under the temporary directory (or at
``$STEPLEDGER_RAY253_VENV``), under a file lock; it skips with the reason only where it cannot be built.
A second Ray and torch to install, and a Ray session to start: in the longer set only (``STEPLEDGER_RLLIB_LONG=1``,
as tests/rllib/test_rllib_multiagent.py's), to keep CI short.
"""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import json
import os
import subprocess
import sys
import tempfile

import pytest
from side_venv import cached_venv, imported_version

from stepledger.rllib.episodes import check_rllib_episodes

ROOT, TESTS = testpaths.ROOT, testpaths.TESTS_DIR
RAY = "ray[rllib]==2.53.0"
TORCH = "torch==2.13.0"
VENV = os.environ.get("STEPLEDGER_RAY253_VENV") or os.path.join(
    tempfile.gettempdir(), "stepledger-ray253-venv-py%d%d" % sys.version_info[:2])
MARKER = "stepledger-ray-ready"
LONG = os.environ.get("STEPLEDGER_RLLIB_LONG") == "1"


@pytest.fixture(scope="session")
def ray253_python():
    return cached_venv(VENV, MARKER, RAY, [["--upgrade", "pip"], [TORCH], [RAY, "pettingzoo==1.27.0", "pytest>=7",
                                                                             "psutil>=5"]],
                       lambda python: imported_version(python, "ray.rllib, torch, pettingzoo", "ray", timeout=180),
                       "2.53.0", install_timeout=1200)


# the longer set: defined only with STEPLEDGER_RLLIB_LONG=1 (the default run passes with nothing skipped)
if LONG:
    def test_ray_2_53_logs_one_agents_return_as_a_shared_modules_and_the_episode_check_names_it(ray253_python,
                                                                                                 tmp_path):
        d = str(tmp_path / "shared")
        spec = {"path": d, "env": "ma-together", "modules": "shared", "runners": 1, "envs": 2, "iterations": 1,
                "batch": 200}
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STEPLEDGER_REQUIRE_CORE")}
        env["PYTHONPATH"] = os.pathsep.join((ROOT, TESTS))
        proc = subprocess.run([ray253_python, os.path.join(TESTS, "rllib_harness.py"), json.dumps([spec])], cwd=TESTS,
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        report = check_rllib_episodes(d)
        assert report.n_compared > 0 and not report.ok, str(report)
        # only the shared module's figure is wrong: each agent's return and the episode's return agree
        assert {x.what for x in report.differences} == {"module"}, str(report)
        one_agents = 0
        for x in report.differences:
            assert x.name == "shared" and x.agents == ["agent_0", "agent_1"], x.line()
            assert "module shared (fed by agent_0, agent_1): RLlib logged return" in x.line(), x.line()
            logged, each = x.logged[0], x.recorded[2:]
            # an episode sampled in one chunk: the logged figure is one agent's return (2.53 keeps the last agent's
            # of an episode's last chunk, and adds up its earlier chunks' returns)
            one_agents += any(abs(logged - r) <= 1e-4 * (1 + abs(r)) for r in each)
        assert one_agents > 0, str(report)
        # every episode the check compared is named: the bug is in each one
        assert len(report.differences) == report.n_compared, str(report)
