"""What a type checker (and so an editor) sees of stepledger's public names.

The library folders that are not dependencies (``stepledger.sb3``, ``stepledger.rllib``, ...) import their names on first use (a
module ``__getattr__``), so that importing the folder does not import the library; a ``TYPE_CHECKING`` block
tells a type checker what each name is. mypy is run on a snippet that uses every name of each folder's
table (``_NAMES``) and of ``stepledger.__all__``, with the project's configuration, and each revealed type
must be the name's own, not ``Any``.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

import importlib

import stepledger
from stepledger.libraries import LIBRARIES

pytest.importorskip("mypy", reason="mypy is not installed here (.ci/run installs it)")

ROOT = pathlib.Path(stepledger.__file__).parent.parent
# every library folder that imports its names on first use (its ``_NAMES``), from the table of libraries
LAZY = {name: module for name in LIBRARIES
        for module in [importlib.import_module("stepledger." + name)] if hasattr(module, "_NAMES")}
_REVEALED = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): note: Revealed type is \"(?P<type>.*)\"$")


def _mypy(tmp_path, code):
    """(exit status, {line: revealed type}, error lines) of mypy on ``code``, with the project's configuration."""
    snippet = tmp_path / "snippet.py"
    snippet.write_text(code)
    env = dict(os.environ, MYPYPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--no-error-summary", "--hide-error-context", str(snippet)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    revealed, errors = {}, []
    for line in proc.stdout.splitlines():
        m = _REVEALED.match(line)
        if m:
            revealed[int(m.group("line"))] = m.group("type")
        elif ": error:" in line:
            errors.append(line)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 2: mypy could not run
    return proc.returncode, revealed, errors


def _reveal_each(module, names):
    """A snippet that reveals ``module.name`` for each name, one a line from line 3 on."""
    lines = ["import %s" % module, ""] + ["reveal_type(%s.%s)" % (module, n) for n in names]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("lib", sorted(LAZY))
def test_every_lazily_imported_name_has_its_own_type(tmp_path, lib):
    module = "stepledger." + lib
    names = sorted(LAZY[lib]._NAMES)
    assert names
    status, revealed, errors = _mypy(tmp_path, _reveal_each(module, names))
    assert status == 0, errors
    assert sorted(revealed) == list(range(3, 3 + len(names)))
    untyped = [n for k, n in enumerate(names) if revealed[3 + k] == "Any"]
    assert not untyped, "%s: seen as Any by a type checker (missing from its TYPE_CHECKING block): %s" % (
        module, ", ".join(untyped))
    classes = [n for n in names if isinstance(getattr(LAZY[lib], n), type)]
    for k, n in enumerate(names):  # a class is seen as its own constructor
        if n in classes:
            assert revealed[3 + k].endswith("-> %s.%s" % (getattr(LAZY[lib], n).__module__, n)), revealed[3 + k]


def test_a_from_import_of_a_lazy_name_is_the_class(tmp_path):
    code = ("from stepledger.sb3 import LedgerVecEnv\nfrom stepledger.pettingzoo import LedgerParallelEnv\n"
            "from stepledger.rllib import instrument\n"
            "reveal_type(LedgerVecEnv)\nreveal_type(LedgerParallelEnv)\nreveal_type(instrument)\n")
    status, revealed, errors = _mypy(tmp_path, code)
    assert status == 0, errors
    assert revealed[4].endswith("-> stepledger.sb3.vec_env.LedgerVecEnv")
    assert revealed[5].endswith("-> stepledger.pettingzoo.parallel.LedgerParallelEnv")
    assert revealed[6].startswith("def (config: ")


def test_the_package_face_is_typed(tmp_path):
    names = sorted(n for n in stepledger.__all__ if n != "__version__")
    status, revealed, errors = _mypy(tmp_path, _reveal_each("stepledger", names) +
                                     'reveal_type(stepledger.read("ledger").streams)\n'
                                     'reveal_type(stepledger.compare("ledger", "trainer.npz").by_env())\n')
    assert status == 0, errors
    untyped = [n for k, n in enumerate(names) if revealed[3 + k] == "Any"]
    assert not untyped, untyped
    n = 3 + len(names)
    assert revealed[n] == "dict[int, stepledger.report.read.Stream]"
    assert revealed[n + 1] == "dict[int, stepledger.report.compare.EnvDifference]"
    assert revealed[3 + names.index("compare")].endswith("-> stepledger.report.compare.Report")


def test_a_wrong_argument_to_compare_is_an_error(tmp_path):
    """The annotations are checked: passing a number where a path goes is refused."""
    status, _, errors = _mypy(tmp_path, "import stepledger\nstepledger.compare(3, 'trainer.npz')\n")
    assert status == 1
    assert len(errors) == 1 and 'Argument 1 to "compare" has incompatible type "int"' in errors[0], errors


@pytest.mark.parametrize("lib", sorted(LAZY))
def test_a_misspelt_lazy_name_is_an_error_not_any(tmp_path, lib):
    # the folder's module __getattr__ is hidden from a type checker, which sees the TYPE_CHECKING block alone
    name = sorted(LAZY[lib]._NAMES)[0]
    status, _, errors = _mypy(tmp_path, "from stepledger.%s import %sx\n" % (lib, name))
    assert status == 1 and len(errors) == 1, errors
    assert 'Module "stepledger.%s" has no attribute "%sx"' % (lib, name) in errors[0], errors
