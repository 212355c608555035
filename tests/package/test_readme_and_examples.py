"""The README's code runs as printed, and the examples and demo do what they say."""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import os
import re
import subprocess
import sys

import pytest

from side_venv import hiding

ROOT = testpaths.ROOT


DOC_PAGES = ["README.md"] + sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(ROOT, "docs"))
                                   if n.endswith(".md"))


def _blocks(lang, pages=("README.md",)):
    out = []
    for page in pages:
        text = open(os.path.join(ROOT, page)).read()
        out += re.findall(r"```%s\n(.*?)```" % lang, text, flags=re.S)
    return out


def _doc_blocks():
    """(page, block) for every Python block of the README and the docs/ pages."""
    return [(page, b) for page in DOC_PAGES for b in _blocks("python", (page,))]


def _run(args, cwd, timeout=300, env_tmp=None):
    env = dict(os.environ, TMPDIR=str(env_tmp)) if env_tmp is not None else None
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def test_readme_has_both_quickstarts():
    blocks = _blocks("python")
    assert any("AsyncVectorEnv" in b and "LedgerVectorEnv" in b for b in blocks)
    assert any("SubprocVecEnv" in b and "LedgerVecEnv" in b for b in blocks)
    assert any("LedgerParallelEnv" in b and "LedgerSuperSuitVecEnv" in b for b in blocks)  # multi-agent


@pytest.mark.parametrize("page, index", [(p, k) for k, (p, _) in enumerate(_doc_blocks())])
def test_readme_and_docs_python_block_runs(tmp_path, page, index):
    block = _doc_blocks()[index][1]
    script = tmp_path / "block.py"
    script.write_text(block)
    proc = _run([sys.executable, str(script)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if "compare(" in block and "print(" in block:
        # a multi-agent env's streams are its agents (2 copies of 2 agents in the README's PettingZoo quickstart,
        # the 2 players of one tic-tac-toe board in docs/MULTIAGENT.md's turn-based loop)
        clean = ("0 of 4 agent streams differ" if "LedgerParallelEnv" in block else
                 "0 of 2 agent streams differ" if "TurnLedger" in block else "0 of 4 envs differ")
        assert clean in proc.stdout
    if "LedgerVecEnv" in block:
        # the README's next step: compare from the command line
        cmd = _run([sys.executable, "-m", "stepledger", "compare", "ledger", "ledger/trainer.npz"], cwd=tmp_path)
        assert cmd.returncode == 0, cmd.stdout + cmd.stderr
        assert cmd.stdout.strip() == "0 of 4 envs differ"


def test_readme_links_every_docs_page_and_they_exist():
    text = open(os.path.join(ROOT, "README.md")).read()
    linked = set(re.findall(r"\]\((docs/[A-Za-z_]+\.md)\)", text))
    pages = {p for p in DOC_PAGES if p.startswith("docs")}
    assert pages <= linked, pages - linked  # each page is reachable from the README
    for page in linked:
        assert os.path.exists(os.path.join(ROOT, page)), page
    # the README stays on a user's path; the long sections live in docs/
    for moved in ("## Checking as the run goes", "## Environments on another machine", "## Ledgers on shared storage",
                  "## What it has found in the libraries", "## Checking the trainer's episode log"):
        assert moved not in text, moved
    for kept in ("## Set-up", "## Quickstart: Gymnasium", "## Quickstart: Stable-Baselines3",
                 "## Quickstart: PettingZoo and SuperSuit", "## Where the two wrappers go", "## Reading a report", "## What it cannot catch"):
        assert kept in text, kept


def test_docs_pages_link_to_pages_that_exist():
    for page in DOC_PAGES[1:]:
        text = open(os.path.join(ROOT, page)).read()
        for target in re.findall(r"\]\(([^)#:]+\.md)\)", text):
            assert os.path.exists(os.path.join(ROOT, "docs", target)), (page, target)


def test_example_gymnasium_async(tmp_path):
    path = os.path.join(ROOT, "examples", "gymnasium_async.py")
    clean = _run([sys.executable, path, "--dir", str(tmp_path / "clean")], cwd=tmp_path)
    assert clean.returncode == 0 and "0 of 8 envs differ" in clean.stdout, clean.stderr
    faulty = _run([sys.executable, path, "--fault", "--dir", str(tmp_path / "faulty")], cwd=tmp_path)
    assert faulty.returncode == 0, faulty.stderr
    lines = faulty.stdout.splitlines()
    assert lines[0].startswith("env 1, episode 0, step 13: reward differs (env gave ")
    # the default: a digest of each observation, so the report says where, and how to see the values
    assert lines[1] == "env 3, episode 1, step 16: obs differs"
    assert lines[2].startswith("env 4, episode 0, step 25: terminated, truncated differ")
    assert lines[3] == "3 of 8 envs differ"
    assert lines[4] == ("hint: record with keep_values=True on both sides to see the observations and actions that "
                        "differ")
    kept = _run([sys.executable, path, "--fault", "--keep-values", "--dir", str(tmp_path / "kept")], cwd=tmp_path)
    assert kept.returncode == 0, kept.stderr
    lines = kept.stdout.splitlines()
    assert lines[1].startswith("env 3, episode 1, step 16: obs differs (env gave [")
    assert "hint: record with keep_values=True" not in kept.stdout


def test_example_sb3_pendulum_catches_its_fault(tmp_path):
    path = os.path.join(ROOT, "examples", "sb3_pendulum.py")
    proc = _run([sys.executable, path, "--steps", "2048", "--fault", "--dir", str(tmp_path)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.match(r"env 2, episode \d+, step \d+: reward differs \(env gave ", proc.stdout), proc.stdout
    assert "1 of 4 envs differ" in proc.stdout


@pytest.mark.parametrize("script", ["gymnasium_async.py", "sb3_pendulum.py"])
def test_example_help(script):
    proc = _run([sys.executable, os.path.join(ROOT, "examples", script), "--help"], cwd=ROOT)
    assert proc.returncode == 0 and "--fault" in proc.stdout


def test_demo_command(tmp_path):
    proc = _run([sys.executable, "-m", "stepledger", "demo", "--dir", str(tmp_path)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "3 of 8 envs differ" in proc.stdout and str(tmp_path) in proc.stdout
    # the demo records as the ledgers do by default, and the README's first report is the demo's, line for line
    readme = open(os.path.join(ROOT, "README.md")).read()
    first = readme[readme.index("```\n") + 4:]
    first = first[:first.index("```")].splitlines()
    assert proc.stdout.splitlines()[:len(first)] == first, proc.stdout
    assert "hint: record with keep_values=True on both sides" in proc.stdout
    kept = _run([sys.executable, "-m", "stepledger", "demo", "--keep-values", "--dir", str(tmp_path / "k")],
                cwd=tmp_path)
    assert kept.returncode == 0, kept.stderr
    assert "env 3, episode 1, step 16: obs differs (env gave [-0.36274984, -0.93188655, 0.863935], trainer received " \
           "[-0.36279297, -0.9321289, 0.86376953], first at [0])" in kept.stdout, kept.stdout
    clean = _run([sys.executable, "-m", "stepledger", "demo", "--clean", "--dir", str(tmp_path / "c")], cwd=tmp_path)
    assert clean.returncode == 0 and "0 of 8 envs differ" in clean.stdout


def test_check_command_on_a_registered_env(tmp_path):
    proc = _run([sys.executable, "-m", "stepledger", "check", "Pendulum-v1", "--vector", "sync", "--steps", "60",
                 "--faults", "obs:f16,reward:stale,truncated:as-term,step:fill", "--dir", str(tmp_path)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "clean run: no difference" in proc.stdout
    assert "4 of 4 exercised faults caught and located" in proc.stdout


def test_check_names_the_sb3_extra_when_sb3_is_missing(tmp_path):
    code = hiding("stable_baselines3") + r"""
from stepledger.cli import main
sys.exit(main(["check", "Pendulum-v1", "--vector", "subproc", "--steps", "5"]))
"""
    proc = _run([sys.executable, "-c", code], cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "plugrl-stepledger[sb3]" in proc.stderr and "Traceback" not in proc.stderr


_BLOCK_SB3 = hiding("stable_baselines3") + r"""
import runpy
sys.argv = [%r] + %r
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("args", [["--help"], ["--steps", "10"]])
def test_sb3_example_without_sb3_names_the_extra(tmp_path, args):
    path = os.path.join(ROOT, "examples", "sb3_pendulum.py")
    proc = _run([sys.executable, "-c", _BLOCK_SB3 % (path, args)], cwd=tmp_path)
    assert "ModuleNotFoundError" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    if args == ["--help"]:
        assert proc.returncode == 0 and "--fault" in proc.stdout and "plugrl-stepledger[sb3]" in proc.stdout
    else:
        assert proc.returncode == 2 and "plugrl-stepledger[sb3]" in proc.stderr


@pytest.mark.parametrize("script, args, words", [
    ("gymnasium_async.py", ["--fault", "--num-envs", "4"], "--fault injects into envs 1, 3, 4, so it needs "
                                                           "--num-envs 5 or more (got 4)"),
    ("gymnasium_async.py", ["--fault", "--steps", "41"], "--fault needs --steps 42 or more"),
    ("sb3_pendulum.py", ["--fault", "--num-envs", "2"], "--fault injects into env 2, so it needs --num-envs 3"),
    ("remote_env.py", ["--serve", "127.0.0.1:0", "--fault", "--num-envs", "1"],
     "--fault changes a reward of env 1, so it needs --num-envs 2 or more (got 1)"),
    ("remote_env.py", ["--serve", "127.0.0.1:0", "--fault", "--max-episode-steps", "11"],
     "--fault changes step 12 of an episode, so it needs --max-episode-steps 12 or more (got 11)"),
])
def test_examples_refuse_flags_that_make_the_fault_inject_nothing(tmp_path, script, args, words):
    proc = _run([sys.executable, os.path.join(ROOT, "examples", script), *args], cwd=tmp_path)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert os.listdir(tmp_path) == []


def test_example_fault_at_the_least_steps_it_accepts(tmp_path):
    path = os.path.join(ROOT, "examples", "gymnasium_async.py")
    proc = _run([sys.executable, path, "--fault", "--steps", "42", "--num-envs", "5"], cwd=tmp_path,
                env_tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "3 of 5 envs differ" in proc.stdout.splitlines(), proc.stdout
    assert os.listdir(tmp_path) == []  # its temporary directory is gone
