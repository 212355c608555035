"""The base install is NumPy and Gymnasium only: isal is an optional accelerator, and files written with and
without it read the same."""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import ast
import json
import os
import re
import subprocess
import sys

import pytest

from side_venv import hiding

ROOT = testpaths.ROOT

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None

_NO_ISAL = hiding("isal")

_RUN = r"""
import functools, json, os, sys
import gymnasium as gym, numpy as np
from stepledger import LedgerEnv, LedgerVectorEnv
from stepledger.format.zipwriter import DEFLATE
d, side = sys.argv[1], sys.argv[2]
def make(i):
    return LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=20), d, index=i)
envs = gym.vector.SyncVectorEnv([functools.partial(make, i) for i in range(3)])
if side == "both":
    envs = LedgerVectorEnv(envs, os.path.join(d, "trainer.npz"))
envs.reset(seed=0)
rng = np.random.default_rng(0)
for _ in range(150):
    envs.step(rng.uniform(-2, 2, (3, 1)).astype(np.float32))
envs.close()
print(DEFLATE)
"""


def _python(code, *args, isal=True):
    prefix = "" if isal else _NO_ISAL
    return subprocess.run([sys.executable, "-c", prefix + code, *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


@pytest.mark.skipif(tomllib is None, reason="tomllib needs Python 3.11")
def test_base_install_is_numpy_and_gymnasium_only():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    names = sorted(dep.split(">")[0].split("=")[0].split("[")[0].strip() for dep in project["dependencies"])
    assert names == ["gymnasium", "numpy"]
    assert any(dep.startswith("isal") for dep in project["optional-dependencies"]["isal"])


def _names(deps):
    return {re.split(r"[<>=!~;\[ ]", dep, 1)[0].strip().lower() for dep in deps}


@pytest.mark.skipif(tomllib is None, reason="tomllib needs Python 3.11")
def test_the_pettingzoo_extra_is_what_multiagent_needs_and_the_readme_line_is_true():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    extra = _names(extras["pettingzoo"])
    # stepledger.pettingzoo's env side wraps PettingZoo's parallel envs; its trainer side records SuperSuit's
    # vector envs, the only ones it has (LedgerSuperSuitVecEnv, index_supersuit_copies, check --trainer supersuit)
    assert {"pettingzoo", "supersuit"} <= extra, extras["pettingzoo"]
    assert set(extras["pettingzoo"]) <= set(extras["test"])  # the versions the suite runs
    # The README's multi-agent install line: the extra and what the line adds give every module the quickstart
    # imports, and the line adds nothing the extra holds already
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    section = readme[readme.index("## Quickstart: PettingZoo"):]
    section = section[:section.index("\n## ", 1)]
    line = re.search(r'`pip install "\.\[pettingzoo\]"([^`]*)`', section)
    assert line, "no install line in the README's PettingZoo quickstart"
    added = {name.lower() for name in line.group(1).split()}
    code = section.split("```python", 1)[1].split("```", 1)[0]
    imported = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    imported -= {"stepledger", "numpy", "gymnasium"}  # this package and its base install
    assert imported and imported <= extra | added, (imported, extra, added)
    assert not added & extra, added & extra


def test_runs_without_isal_and_files_read_the_same_both_ways(tmp_path):
    pytest.importorskip("isal")
    a, b = tmp_path / "with", tmp_path / "without"
    with_isal = _python(_RUN, str(a), "both")
    without = _python(_RUN, str(b), "both", isal=False)
    assert with_isal.returncode == 0 and without.returncode == 0, with_isal.stderr + without.stderr
    assert with_isal.stdout.split() == ["isal"] and without.stdout.split() == ["zlib"]

    read_cols = r"""
import json, sys
import numpy as np
from stepledger import read
from stepledger.format import schema as S
out = {}
for path in sys.argv[1:]:
    with read(path) as ledger:
        settings = {k: v for k, v in ledger.meta.items() if k not in S.PER_FILE_META}  # not writer, times, pid
        out[path] = {"meta": settings, "cols": {str(i): {k: np.asarray(v).tolist() for k, v in s.columns.items()}
                                                    for i, s in ledger.streams.items()}}
print(json.dumps(out))
"""
    paths = [str(a), str(a / "trainer.npz"), str(b), str(b / "trainer.npz")]
    for isal in (True, False):  # each reader reads both writers' files, and they hold the same
        proc = _python(read_cols, *paths, isal=isal)
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
        assert got[paths[0]] == got[paths[2]] and got[paths[1]] == got[paths[3]]
    # and each install compares the other's ledgers (one run's two sides; ledgers of two runs are
    # not paired, however alike their events)
    for d, isal in ((b, True), (a, False)):
        proc = _python("import sys; from stepledger.cli import main; sys.exit(main(sys.argv[1:]))",
                       "compare", str(d), str(d / "trainer.npz"), isal=isal)
        assert proc.returncode == 0 and proc.stdout.strip() == "0 of 3 envs differ", proc.stdout + proc.stderr


def test_numpy_reads_a_file_written_without_isal(tmp_path):
    d = tmp_path / "l"
    assert _python(_RUN, str(d), "env", isal=False).returncode == 0
    import numpy as np
    with np.load(d / "env-0.npz", allow_pickle=False) as z:
        assert z["kind"][0] == 0 and len(z["h_rew"]) == len(z["kind"]) == 151
        assert json.loads(str(z["meta"]))["side"] == "env"


def test_the_core_in_use_and_the_pure_python_switch():
    code = "import stepledger; print(stepledger.CORE)"
    forced = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                            env=dict(os.environ, STEPLEDGER_PUREPYTHON="1"))
    assert forced.stdout.strip() == "python", forced.stderr
    version = subprocess.run([sys.executable, "-m", "stepledger", "--version"], capture_output=True, text=True,
                             timeout=60, cwd=ROOT, env=dict(os.environ, STEPLEDGER_PUREPYTHON="1"))
    assert "(core: python)" in version.stdout
