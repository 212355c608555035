"""The side venvs of tests/pettingzoo (built by tests/side_venv.py's cached_venv, cached between runs)."""

import os
import sys
import tempfile

import pytest

from side_venv import cached_venv, imported_version

PZ122_VENV = os.environ.get("STEPLEDGER_PZ122_VENV") or os.path.join(
    tempfile.gettempdir(), "stepledger-pz122-venv-py%d%d" % sys.version_info[:2])


@pytest.fixture(scope="session")
def pz122_python():
    """A Python with pettingzoo==1.22.3 (and gymnasium, NumPy 1.x: under NumPy 2 its parallel_to_aec's
    ``int(action)`` raises where under 1.x it casts silently, PettingZoo issue 939), in a venv cached at
    PZ122_VENV."""
    return cached_venv(PZ122_VENV, "stepledger-pz122-np1-ready", "pettingzoo==1.22.3",
                       [["pettingzoo==1.22.3", "gymnasium", "numpy<2"]],
                       lambda python: imported_version(python, "pettingzoo", "pettingzoo"), "1.22.3")
