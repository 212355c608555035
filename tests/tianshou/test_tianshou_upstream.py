"""Tianshou's own vector-env and collector tests, run with the ledgers inserted and with pass-through wrappers.

Tianshou's sdist ships no tests (2.0.1: its tarball holds the package, README, LICENSE and pyproject only), so
they are taken from the repository at the installed version's tag: ``$STEPLEDGER_TIANSHOU_TESTS`` (a directory
holding ``test/base``), or ``git archive v{version}`` of a checkout of thu-ml/tianshou at
``$STEPLEDGER_TIANSHOU_REPO``; without either the test skips and says so. ``test/base/test_env.py`` and
``test/base/test_collector.py`` run twice in a separate pytest (tests/tianshou/ts_upstream_plugin.py): every
test's outcome must be the same both ways, and every ledger pair a LedgerCollector recorded must compare clean.
"""

import json
import os
import subprocess
import sys

import pytest

tianshou = pytest.importorskip("tianshou")

from stepledger import compare  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FILES = ("test/base/test_env.py", "test/base/test_collector.py")
# Left out: envpool's (not installed; they skip anyway), the async ones that sleep for seconds, and the Atari
# setting one (its buffers of frames take over 5 GB).
DESELECT = "not envpool and not test_async_env and not test_async_check_id and not atari_setting"


def _upstream_tests(tmp):
    version = tianshou.__version__
    given = os.environ.get("STEPLEDGER_TIANSHOU_TESTS")
    if given:
        if not os.path.isdir(os.path.join(given, "test", "base")):
            pytest.fail("STEPLEDGER_TIANSHOU_TESTS=%s holds no test/base" % given)
        return given, version
    repo = os.environ.get("STEPLEDGER_TIANSHOU_REPO")
    if not repo:
        pytest.skip("Tianshou's sdist ships no tests; set STEPLEDGER_TIANSHOU_REPO to a git checkout of "
                    "thu-ml/tianshou (tag v%s) or STEPLEDGER_TIANSHOU_TESTS to a directory holding its test/base"
                    % version)
    out = os.path.join(tmp, "tianshou-%s" % version)
    os.makedirs(out, exist_ok=True)
    archive = subprocess.run(["git", "-C", repo, "archive", "v%s" % version, "test/__init__.py", "test/base"],
                             capture_output=True, timeout=120)
    if archive.returncode != 0:
        pytest.skip("no tag v%s in %s: %s" % (version, repo, archive.stderr.decode(errors="replace").strip()))
    subprocess.run(["tar", "x", "-C", out], input=archive.stdout, check=True, timeout=120)
    return out, version


def _run_suite(tests, mode, out):
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, STEPLEDGER_UPSTREAM_MODE=mode, STEPLEDGER_UPSTREAM_OUT=out,
               PYTHONPATH=os.pathsep.join([tests, ROOT, HERE, os.path.dirname(HERE),
                                           os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "ts_upstream_plugin", "-p", "no:cacheprovider",
           "-p", "no:randomly", "-k", DESELECT, "--rootdir", tests] + [os.path.join(tests, f) for f in FILES]
    done = subprocess.run(cmd, cwd=tests, env=env, capture_output=True, text=True, timeout=1200)
    path = os.path.join(out, "outcomes.json")
    assert os.path.exists(path), done.stdout[-3000:] + done.stderr[-3000:]
    with open(path) as f:
        outcomes = json.load(f)

    def lines(name):
        p = os.path.join(out, name)
        if not os.path.exists(p):
            return []
        with open(p) as f:
            return [json.loads(line) for line in f]

    return outcomes, lines("venvs.jsonl"), lines("collectors.jsonl"), done.stdout


def test_tianshous_own_env_and_collector_tests_with_the_ledgers_inserted(tmp_path):
    tests, version = _upstream_tests(str(tmp_path))
    ledger, venvs, collectors, out = _run_suite(tests, "ledger", str(tmp_path / "ledger"))
    plain, venvs_plain, _, _ = _run_suite(tests, "passthrough", str(tmp_path / "passthrough"))

    # 1. Every test's outcome with the ledgers equals its outcome with pass-through wrappers.
    assert sorted(ledger) == sorted(plain) and len(ledger) >= 15, out[-3000:]
    differ = {k: (ledger[k], plain[k]) for k in ledger if ledger[k] != plain[k]}
    assert not differ, differ
    assert sum(v == "passed" for v in ledger.values()) >= 12
    assert len(venvs) == len(venvs_plain) >= 10  # the env side was inserted, as often both ways

    # 2. Every ledger pair a LedgerCollector recorded compares clean.
    recorded = [c for c in collectors if c["recorded"]]
    compared, unclean = 0, []
    for c in recorded:
        d = c["dir"]
        trainer = os.path.join(d, "trainer.npz")
        if not os.path.exists(trainer):
            continue  # built, never reset or collected: nothing on either side
        report = compare(d, trainer)
        compared += 1
        if not report.ok:
            unclean.append((c["test"], str(report)))
    assert not unclean, unclean
    assert compared >= 5
    counts = {"tianshou": version, "upstream_tests": len(ledger), "passed": sum(v == "passed" for v in ledger.values()),
              "outcomes_equal": len(ledger) - len(differ), "vector_envs_built": len(venvs),
              "collectors_recorded": len(recorded), "collectors_not_recorded": len(collectors) - len(recorded),
              "ledger_pairs_compared": compared, "clean": compared - len(unclean)}
    print("upstream Tianshou suite:", json.dumps(counts, sort_keys=True))
