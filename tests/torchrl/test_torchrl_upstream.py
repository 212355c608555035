"""TorchRL's own Gym, batched-env and collector tests, run with the ledgers inserted and with pass-through wrappers.

TorchRL publishes no sdist (0.14.1: wheels only), so its tests come from its repository:
``$STEPLEDGER_TORCHRL_TESTS`` (a directory holding TorchRL's ``test/``), or ``git archive`` of a checkout of
pytorch/rl at ``$STEPLEDGER_TORCHRL_REPO``, at ``$STEPLEDGER_TORCHRL_REF`` (default: the tag ``v{version}`` of
the installed version). Without either the test skips and says so. The files of ``FILES`` run twice in a
separate pytest (tests/torchrl/trl_upstream_plugin.py): every test's outcome must be the same both ways, and every
ledger pair a Collector recorded must compare clean.
"""

import ast
import collections
import glob
import json
import os
import subprocess
import sys

import pytest

torchrl = pytest.importorskip("torchrl")

from stepledger import compare  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FILES = tuple(os.environ.get("STEPLEDGER_TORCHRL_FILES", " ".join((
    "test/libs/test_gym.py", "test/envs/test_parallel.py", "test/envs/test_auto_reset.py", "test/envs/test_env_base.py",
    "test/test_collectors.py"))).split())
# Left out: the tests of other simulators' and devices' paths, and those that sleep or wait on timeouts.
DESELECT = os.environ.get("STEPLEDGER_TORCHRL_DESELECT", "not cuda and not envpool and not brax and not jumanji")


def _upstream_tests(tmp):
    version = torchrl.__version__.split("+")[0]
    given = os.environ.get("STEPLEDGER_TORCHRL_TESTS")
    if given:
        if not os.path.isdir(os.path.join(given, "test")):
            pytest.fail("STEPLEDGER_TORCHRL_TESTS=%s holds no test/" % given)
        return given, "the tests in %s" % given
    repo = os.environ.get("STEPLEDGER_TORCHRL_REPO")
    if not repo:
        pytest.skip("TorchRL publishes no sdist; set STEPLEDGER_TORCHRL_REPO to a git checkout of pytorch/rl "
                    "(and STEPLEDGER_TORCHRL_REF to a commit where it has no tag v%s), or STEPLEDGER_TORCHRL_TESTS "
                    "to a directory holding its test/" % version)
    ref = os.environ.get("STEPLEDGER_TORCHRL_REF", "v%s" % version)
    out = os.path.join(tmp, "torchrl-tests")
    os.makedirs(out, exist_ok=True)
    archive = subprocess.run(["git", "-C", repo, "archive", ref, "test"], capture_output=True, timeout=300)
    if archive.returncode != 0:
        pytest.skip("no %s in %s (set STEPLEDGER_TORCHRL_REF): %s"
                    % (ref, repo, archive.stderr.decode(errors="replace").strip()))
    subprocess.run(["tar", "x", "-C", out], input=archive.stdout, check=True, timeout=300)
    return out, "%s at %s" % (repo, ref)


GYM_NAMES = ("GymEnv", "GymWrapper", "_VERSIONED")  # a test that names one of these steps a Gymnasium env
WHOLE = ("test/libs/test_gym.py",)  # every test of these steps one


# Tests whose outcome the ledgers change, and why: each must still differ exactly so (a fix shows here).
KNOWN = {
    # env.rollout(n, policy) wraps a plain nn.Module policy (fast_wrap) with every observation key as its inputs,
    # INDEX_KEY among them (LedgerGymWrapper puts it in the observation spec): the module gets two arguments
    "test/envs/test_env_base.py::TestEnvBase::test_non_td_policy": ("failed", "passed"),
}


def gym_tests(tests, f):
    """The node ids (``file::Class::test``) of the tests in ``f`` whose source names a Gymnasium env
    (GYM_NAMES): the tests where a ledger can be inserted (the others step TorchRL's own mock envs); all of a
    file of WHOLE."""
    if f in WHOLE:
        return [f]
    with open(os.path.join(tests, f)) as fh:
        source = fh.read()
    ids = []

    def visit(body, prefix):
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, prefix + node.name + "::")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                text = ast.get_source_segment(source, node) or ""
                if any(name in text for name in GYM_NAMES):
                    ids.append(prefix + node.name)

    visit(ast.parse(source).body, f + "::")
    return ids


def _run_suite(tests, mode, out):
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, STEPLEDGER_UPSTREAM_MODE=mode, STEPLEDGER_UPSTREAM_OUT=out, RL_WARNINGS="0",
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "upstream_site"), tests, os.path.join(tests, "test"),
                                           ROOT, HERE, os.path.dirname(HERE),
                                           os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "trl_upstream_plugin", "-p", "no:cacheprovider",
           "-p", "no:randomly", "-k", DESELECT, "--rootdir", tests]
    cmd += [node for f in FILES for node in gym_tests(tests, f)]
    done = subprocess.run(cmd, cwd=tests, env=env, capture_output=True, text=True, timeout=3000)
    path = os.path.join(out, "outcomes.json")
    assert os.path.exists(path), done.stdout[-3000:] + done.stderr[-3000:]
    with open(path) as f:
        outcomes = json.load(f)
    return outcomes, {name: _lines(out, name) for name in ("envs.jsonl", "collectors.jsonl", "errors.jsonl")}, done.stdout


def _lines(out, name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_torchrls_own_gym_batched_env_and_collector_tests_with_the_ledgers_inserted(tmp_path):
    tests, source = _upstream_tests(str(tmp_path))
    ledger, logs, out = _run_suite(tests, "ledger", str(tmp_path / "ledger"))
    plain, plain_logs, _ = _run_suite(tests, "passthrough", str(tmp_path / "passthrough"))

    # 1. Every test's outcome with the ledgers equals its outcome with pass-through wrappers.
    assert sorted(ledger) == sorted(plain) and len(ledger) >= 100, out[-3000:]
    differ = {t: (ledger[t], plain[t]) for t in ledger if ledger[t] != plain[t]}
    assert differ == {t: k for t, k in KNOWN.items() if t in ledger}, differ
    counts = collections.Counter(ledger.values())

    # 2. The trainer side read every batch it was given, and every pair it recorded compares clean.
    assert not logs["errors.jsonl"], logs["errors.jsonl"][:5]
    recorded = [c for c in logs["collectors.jsonl"] if c["recorded"]]
    dirty = []
    for c in recorded:
        if not os.path.exists(c["trainer"]):
            continue  # a collector that yielded no batch writes no trainer ledger
        report = compare(c["dir"], c["trainer"])
        if not report.ok:
            dirty.append((c["test"], str(report)))
    assert not dirty, dirty[:3]
    written = [c for c in recorded if os.path.exists(c["trainer"])]
    assert len(written) >= 5, (len(written), collections.Counter(c.get("why") for c in logs["collectors.jsonl"]))
    envs = len(logs["envs.jsonl"])
    assert envs >= 100 and len(glob.glob(str(tmp_path / "ledger" / "ledgers" / "*" / "env-*.npz"))) >= 50
    print("\nTorchRL's tests from %s: %s; %d envs with a ledger; %d collectors recorded, %d pairs compared clean; "
          "not recorded: %s" % (source, dict(counts), envs, len(recorded), len(written),
                                dict(collections.Counter(c["why"] for c in logs["collectors.jsonl"]
                                                         if not c["recorded"]))))
