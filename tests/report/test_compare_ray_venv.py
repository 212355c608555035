"""The Ray compare tests (tests/report/test_compare_ray.py) in the Ray venv, which tests/rllib/test_rllib_venv.py
builds and keeps (Ray 2.60 pins gymnasium 1.2.2): pytest runs that file there as a subprocess, with this checkout on
its path, and must pass with nothing skipped."""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(testpaths.TESTS_DIR, "rllib"))
from test_rllib_venv import inner_results, ray_python  # noqa: E402,F401  (ray_python: the venv's fixture)

ROOT = testpaths.ROOT


def test_the_ray_compare_tests_pass_in_the_ray_venv(ray_python, tmp_path):  # noqa: F811
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STEPLEDGER_REQUIRE_CORE", "RAY_ADDRESS")}
    env["PYTHONPATH"] = ROOT
    junit = str(tmp_path / "ray.xml")
    proc = subprocess.run([ray_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", "--junitxml=" + junit,
                           os.path.join(ROOT, "tests", "report", "test_compare_ray.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1500)
    results = inner_results(junit)
    tail = "\n--- the inner pytest's output ends:\n" + proc.stdout[-4000:] + "\n--- its stderr ends:\n" + \
        proc.stderr[-1500:]
    assert results is not None, "the Ray compare tests did not run (pytest exited with %d)%s" % (proc.returncode, tail)
    tests, failed, skipped = results
    named = "".join("\n  %s: %s\n%s" % (name, message, lines) for name, message, lines in failed)
    assert not failed, "%d of the %d Ray compare tests failed in their venv:%s%s" % (len(failed), tests, named, tail)
    assert not skipped, "Ray compare tests skipped in their venv: %s" % "; ".join(skipped)
    assert tests and proc.returncode == 0, tail
