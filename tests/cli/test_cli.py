"""The command line as CI and scripts use it: valid JSON, error objects, JUnit, pipes, progress, help,
temporary directories, and the check command's refusals."""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import json
import os
import pty
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import gymnasium as gym
import numpy as np
import pytest

from stepledger import LedgerEnv, LedgerVectorEnv
from stepledger.report import jsonout as _jsonout
from stepledger.cli.main import main
from stepledger.faults import FaultyEnv

ROOT = testpaths.ROOT
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run_cli(*args, cwd=None, timeout=120, **kw):
    return subprocess.run([sys.executable, "-m", "stepledger", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=ENV, **kw)


def strict_json(text):
    """json.loads that refuses Infinity and NaN, as JSON.parse does."""
    def refuse(name):
        raise ValueError("not JSON: %s" % name)
    return json.loads(text, parse_constant=refuse)


def pendulum_run(d, n_envs=3, steps=30, fault_env=None, fault="reward:f16", keep_values=False):
    """A real SyncVectorEnv run with both ledgers; env ``fault_env`` gets ``fault`` outside its LedgerEnv."""
    def make(i):
        env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=10), d, index=i, keep_values=keep_values)
        return FaultyEnv(env, fault, index=i, at=3, target=i) if i == fault_env else env

    trainer = os.path.join(d, "trainer.npz")
    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([lambda i=i: make(i) for i in range(n_envs)]), trainer,
                           keep_values=keep_values)
    envs.reset(seed=0)
    envs.single_action_space.seed(0)
    for _ in range(steps):
        envs.step(np.stack([envs.single_action_space.sample() for _ in range(n_envs)]))
    envs.close()
    return d, trainer


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    return pendulum_run(str(tmp_path_factory.mktemp("faulty")), fault_env=1, keep_values=True)


def test_show_json_is_valid_json_with_infinite_bounds(tmp_path):
    # CartPole's observation space has infinite bounds
    d = str(tmp_path)
    env = LedgerEnv(gym.make("CartPole-v1"), d, index=0)
    env.reset(seed=0)
    env.step(0)
    env.close()
    proc = run_cli("show", os.path.join(d, "env-0.npz"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "Infinity" not in proc.stdout and "NaN" not in proc.stdout
    data = strict_json(proc.stdout)
    space = json.dumps(data["meta"]["observation_space"])
    assert '"inf"' in space or '"-inf"' in space
    assert data["streams"][0]["events"] == 2


def test_jsonout_keeps_numbers_and_refuses_nothing_valid():
    out = strict_json(_jsonout.dumps({"a": np.float32(1.5), "b": [float("inf"), -float("inf"), float("nan"), 2],
                                      "c": np.arange(3), "d": np.bool_(True)}))
    assert out == {"a": 1.5, "b": ["inf", "-inf", "nan", 2], "c": [0, 1, 2], "d": True}


def test_compare_json_numbers_are_numbers(faulty, capsys):
    d, t = faulty
    assert main(["compare", d, t, "--json"]) == 1
    data = strict_json(capsys.readouterr().out)
    diff = data["differences"][0]
    assert diff["env"] == 1 and diff["fields"] == ["reward"]
    assert isinstance(diff["env_values"]["reward"], float) and isinstance(diff["trainer_values"]["reward"], float)
    assert np.float32(diff["env_values"]["reward"]) != np.float32(diff["trainer_values"]["reward"])
    assert np.float16(diff["env_values"]["reward"]) == np.float32(diff["trainer_values"]["reward"])


def test_compare_json_kept_values_are_lists_of_numbers(tmp_path, capsys):
    d, t = pendulum_run(str(tmp_path), fault_env=2, fault="obs:f16", keep_values=True)
    assert main(["compare", d, t, "--json"]) == 1
    diff = strict_json(capsys.readouterr().out)["differences"][0]
    gave, got = diff["env_values"]["obs"], diff["trainer_values"]["obs"]
    assert isinstance(gave, list) and len(gave) == 3 and all(isinstance(x, float) for x in gave)
    assert np.array_equal(np.float32(gave).astype(np.float16).astype(np.float32), np.float32(got))


@pytest.mark.parametrize("argv, words", [
    (["compare", "{tmp}/nope", "{tmp}/nope/trainer.npz", "--json"], "no such file"),
    (["show", "{tmp}/nope.npz", "--json"], "no such file"),
    (["episodes", "{tmp}/nope", "{tmp}/log.csv", "--json"], "no such file"),
    (["compare", "--json", "only-one-argument"], "required"),
])
def test_exit_2_with_json_prints_an_error_object(tmp_path, argv, words):
    proc = run_cli(*[a.format(tmp=tmp_path) for a in argv])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    data = strict_json(proc.stdout)
    assert data["ok"] is False and words in data["error"], data
    assert "\n" not in data["error"] and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_junit_report_one_case_per_env(faulty, tmp_path):
    d, t = faulty
    out = tmp_path / "sub" / "report.xml"
    proc = run_cli("compare", d, t, "--junit", str(out))
    assert proc.returncode == 1, proc.stderr
    root = ET.parse(out).getroot()
    assert root.tag == "testsuites" and root.get("failures") == "1" and root.get("tests") == "3"
    cases = root.findall("./testsuite/testcase")
    assert [c.get("name") for c in cases] == ["env 0", "env 1", "env 2"]
    failures = [c.find("failure") for c in cases]
    assert failures[0] is None and failures[2] is None
    line = proc.stdout.splitlines()[0]
    assert failures[1].get("message") == line and line.startswith("env 1, episode 0, step 4: reward differs")
    assert "1 of 3 envs differ" in root.find("./testsuite/system-out").text


def test_junit_clean_report_has_no_failures(tmp_path):
    d, t = pendulum_run(str(tmp_path / "clean"), steps=5)
    assert main(["compare", d, t, "--junit", str(tmp_path / "r.xml")]) == 0
    root = ET.parse(tmp_path / "r.xml").getroot()
    assert root.get("failures") == "0" and not root.findall(".//failure") and len(root.findall(".//testcase")) == 3


def test_junit_to_an_unwritable_place_exits_2(faulty, tmp_path):
    d, t = faulty
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = run_cli("compare", d, t, "--junit", str(blocker / "report.xml"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_broken_pipe_ends_quietly(faulty):
    d, t = faulty
    # a reader that closes the pipe at once: the output is larger than the pipe's buffer
    proc = subprocess.run("%s -m stepledger show %s --json | head -c 1 > /dev/null; "
                          "%s -m stepledger show %s | head -n 1" % (sys.executable, t, sys.executable, d),
                          shell=True, capture_output=True, text=True, timeout=60, env=ENV)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.stdout.count("\n") == 1


def test_broken_pipe_on_a_long_output_exits_quietly(faulty):
    d, t = faulty
    code = ("import sys; from stepledger.cli import main\n"
            "sys.exit(main(['show', %r]))" % t)
    r, w = os.pipe()
    os.close(r)  # nobody will read
    proc = subprocess.run([sys.executable, "-c", code], stdout=w, stderr=subprocess.PIPE, text=True, timeout=60,
                          env=ENV)
    os.close(w)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr


def _with_tty_stderr(args):
    master, slave = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "stepledger", *args], stdout=subprocess.PIPE, stderr=slave,
                              timeout=120, env=ENV)
        os.close(slave)
        slave = None
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        return proc, b"".join(chunks).decode()
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)


def test_progress_on_a_terminal_only(faulty):
    d, t = faulty
    proc, err = _with_tty_stderr(["compare", d, t])
    assert proc.returncode == 1
    assert "stepledger compare, envs: 3 of 3" in err, err
    assert "envs: " not in proc.stdout.decode()
    quiet = run_cli("compare", d, t)
    assert quiet.stderr == "" and quiet.returncode == 1


def test_check_progress_on_a_terminal(tmp_path):
    proc, err = _with_tty_stderr(["check", "Pendulum-v1", "--steps", "8", "--faults", "reward:f16"])
    assert proc.returncode == 0, proc.stdout
    assert "stepledger check, runs: 2 of 2" in err


def test_help_shows_defaults_and_reachable_docs():
    for sub, expected in [("check", ["(default: 200)", "(default: 4)", "(default: sync)", "(default: 20)"]),
                          ("episodes", ["(default: 1e-05)", "(default: auto)"]),
                          ("compare", ["stepledger docs report"])]:
        proc = run_cli(sub, "--help")
        assert proc.returncode == 0
        text = " ".join(proc.stdout.split())
        for words in expected:
            assert words in text, (sub, words, proc.stdout)
        assert "docs/" not in text  # a path in a checkout is not reachable from an installed package


def test_check_help_describes_every_trainer_and_vector_of_the_table():
    from stepledger import libraries
    wide = subprocess.run([sys.executable, "-m", "stepledger", "check", "--help"], capture_output=True, text=True,
                          timeout=120, env=dict(ENV, COLUMNS="2000"))  # argparse wraps at the width: no wrapping
    text = " ".join(wide.stdout.split())
    for lib in libraries.every():
        if lib.trainer:
            assert lib.trainer_help, "%s: a --trainer with no trainer_help in its library.py" % lib.name
            assert "%s: %s" % (lib.trainer, " ".join(lib.trainer_help.split())) in text, lib.name
            if lib.extra:
                assert "[%s] extra" % lib.extra in text, lib.name
        for kind in lib.vectors:
            assert kind in text.split("--vector {", 1)[1], kind


def test_docs_command_prints_the_pages():
    proc = run_cli("docs")
    assert proc.returncode == 0 and "report" in proc.stdout and "format" in proc.stdout
    page = run_cli("docs", "report")
    assert page.returncode == 0 and page.stdout.startswith("# The comparison report")
    missing = run_cli("docs", "nope")
    assert missing.returncode == 2 and "no documentation page 'nope'" in missing.stderr


def test_docs_are_shipped_in_a_built_package(tmp_path):
    """setup.py's build_py copies docs/*.md into the package, where ``stepledger docs`` finds them."""
    build = tmp_path / "build"
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "-d", str(build)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    shipped = sorted(os.listdir(build / "stepledger" / "docs"))
    assert shipped == sorted(n for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md"))
    code = "import stepledger.docs as d; print(d._directory()); print(d.page_text('report').splitlines()[0])"
    run = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, PYTHONPATH=str(build)))
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [str(build / "stepledger" / "docs"), "# The comparison report"]


# ---------------------------------------------------------------- check

def test_check_too_few_steps_fails_and_says_how_many(tmp_path):
    proc = run_cli("check", "CartPole-v1", "--steps", "3")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the boundary is checked" not in proc.stdout
    m = re.search(r"the boundary is NOT checked: 19 of 19 faults had no opportunity in a rollout of 3 steps; "
                  r"it needs at least (\d+) \(--steps \1\)", proc.stdout)
    assert m, proc.stdout
    needs = int(m.group(1))
    # and that many are enough for the step faults
    again = run_cli("check", "CartPole-v1", "--steps", str(needs), "--faults", "obs:zero,action:zero,final-obs:zero")
    assert again.returncode == 0, again.stdout
    assert "3 of 3 exercised faults caught and located; the boundary is checked" in again.stdout


def test_check_short_rollout_of_one_fault_names_the_step(tmp_path):
    from stepledger.check import check_boundary, registered_env
    report = check_boundary(registered_env("Pendulum-v1", 20), steps=4, faults=["reward:f16"])
    assert not report and report.needs == 6
    assert "reward:f16             not exercised (the rollout is too short: env 3 made 4 steps; the fault waits " \
           "for step 5)" in str(report)
    assert report.directory is not None and os.path.isdir(report.directory)  # the report points there: kept
    import shutil
    shutil.rmtree(report.directory)
    assert check_boundary(registered_env("Pendulum-v1", 20), steps=6, faults=["reward:f16"])


def test_check_removes_its_temporary_directory_unless_kept(tmp_path):
    from stepledger.check import check_boundary, registered_env
    report = check_boundary(registered_env("Pendulum-v1", 20), steps=8, faults=["obs:zero"])
    assert report and report.directory is None and "ledgers in" not in str(report)
    kept = check_boundary(registered_env("Pendulum-v1", 20), steps=8, faults=["obs:zero"], keep=True)
    assert kept and os.path.isdir(kept.directory) and ("ledgers in %s" % kept.directory) in str(kept)
    import shutil
    shutil.rmtree(kept.directory)


@pytest.mark.parametrize("argv, words", [
    (["check", "NoSuchEnv-v0"], "cannot make env 'NoSuchEnv-v0': Environment `NoSuchEnv` doesn't exist."),
    (["check", "CartPole-v1", "--num-envs", "0"], "argument --num-envs: must be at least 1, got 0"),
    (["check", "CartPole-v1", "--steps", "-1"], "argument --steps: must be at least 1, got -1"),
    (["check", "CartPole-v1", "--faults", "obs:nope"], "unknown or unsupported fault 'obs:nope'"),
])
def test_check_refusals_exit_2_with_one_line(argv, words):
    proc = run_cli(*argv)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == ""


def test_demo_removes_its_temporary_directory_unless_kept(tmp_path):
    import tempfile
    env = dict(ENV, TMPDIR=str(tmp_path))
    tempfile.tempdir = None
    proc = subprocess.run([sys.executable, "-m", "stepledger", "demo", "--clean"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0 and "0 of 8 envs differ" in proc.stdout, proc.stderr
    assert os.listdir(tmp_path) == [] and "now removed" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "stepledger", "demo", "--clean", "--keep"], capture_output=True,
                          text=True, timeout=120, env=env)
    kept = os.listdir(tmp_path)
    assert len(kept) == 1 and kept[0].startswith("stepledger-demo-")
    assert ("ledgers in %s" % (tmp_path / kept[0])) in proc.stdout


def test_check_junit_one_case_per_fault(tmp_path):
    out = tmp_path / "check.xml"
    proc = run_cli("check", "CartPole-v1", "--steps", "40", "--faults", "obs:zero,reward:f16,truncated:as-term",
                   "--junit", str(out))
    root = ET.parse(out).getroot()
    cases = {c.get("name"): c for c in root.findall("./testsuite/testcase")}
    assert list(cases) == ["clean run", "obs:zero", "reward:f16", "truncated:as-term"]
    assert cases["clean run"].find("failure") is None and cases["obs:zero"].find("failure") is None
    # CartPole's rewards are all 1.0, which float16 keeps: no opportunity, skipped rather than failed
    assert cases["reward:f16"].find("skipped") is not None and cases["reward:f16"].find("failure") is None
    assert "a longer rollout would not change that" in cases["reward:f16"].find("skipped").get("message")
    assert root.get("failures") == ("0" if proc.returncode == 0 else root.get("failures"))
    short = tmp_path / "short.xml"
    proc = run_cli("check", "CartPole-v1", "--steps", "3", "--faults", "obs:zero", "--junit", str(short))
    assert proc.returncode == 1
    failure = ET.parse(short).getroot().find("./testsuite/testcase[@name='obs:zero']/failure")
    assert "the rollout is too short" in failure.get("message")


def test_episodes_junit_one_case_per_env(tmp_path):
    d, _ = pendulum_run(str(tmp_path), n_envs=2, steps=25)
    log = tmp_path / "log.csv"
    # env 0's episodes as recorded; env 1's first episode logged one step short
    from stepledger.episodes import recorded_episodes
    rec = recorded_episodes(d).columns
    rows, seen = ["env,r,l"], set()
    for e, r, n in zip(rec["env"], rec["ret"], rec["length"]):
        short = int(e) == 1 and 1 not in seen
        seen.add(int(e))
        rows.append("%d,%r,%d" % (int(e), float(r), int(n) - (1 if short else 0)))
    log.write_text("\n".join(rows) + "\n")
    out = tmp_path / "ep.xml"
    proc = run_cli("episodes", d, str(log), "--junit", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cases = ET.parse(out).getroot().findall("./testsuite/testcase")
    assert [c.get("name") for c in cases] == ["env 0", "env 1"]
    assert cases[0].find("failure") is None
    assert cases[1].find("failure").get("message").startswith("env 1, episode ")


def test_progress_of_the_episode_check_on_a_terminal(tmp_path):
    d, _ = pendulum_run(str(tmp_path), n_envs=2, steps=25)
    from stepledger.episodes import recorded_episodes
    rec = recorded_episodes(d).columns
    log = tmp_path / "log.csv"
    log.write_text("env,r,l\n" + "".join("%d,%r,%d\n" % (int(e), float(r), int(n))
                                           for e, r, n in zip(rec["env"], rec["ret"], rec["length"])))
    proc, err = _with_tty_stderr(["episodes", d, str(log)])
    assert proc.returncode == 0, proc.stdout
    assert "stepledger episodes, envs: 2 of 2" in err
    assert run_cli("episodes", d, str(log)).stderr == ""


# ---------------------------------------------------------------- the command line in CI (issue 24)

def _junit_cases(path):
    root = ET.parse(path).getroot()
    return root, root.findall("./testsuite/testcase")


@pytest.mark.parametrize("argv, name", [
    (["compare", "{tmp}/nope", "{tmp}/nope/trainer.npz"], "stepledger compare"),
    (["compare", "{d}", "{d}/trainer.npz", "{d}/nope.npz"], "stepledger compare"),
    (["episodes", "{d}", "{tmp}/log.csv"], "stepledger episodes"),
    (["check", "CartPole-v1", "--faults", "obs:nope"], "stepledger check"),
    (["compare", "{d}"], "stepledger compare"),  # a usage error: argparse's line
])
def test_junit_on_exit_2_is_one_failing_case_with_the_error(faulty, tmp_path, argv, name):
    d, _ = faulty
    out = tmp_path / "ci" / "report.xml"
    proc = run_cli(*[a.format(tmp=tmp_path, d=d) for a in argv], "--junit", str(out))
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    root, cases = _junit_cases(out)
    assert (root.get("tests"), root.get("failures")) == ("1", "1")
    assert [c.get("name") for c in cases] == [name]
    failure = cases[0].find("failure")
    message = failure.get("message")
    assert message == failure.text and message
    # the error the command printed, without its "stepledger: " (argparse's line without its usage tail)
    assert line == "stepledger: " + message or line.startswith(message.replace(": ", ": error: ", 1)), (line, message)


def test_junit_on_exit_2_leaves_no_file_where_none_can_be_written(faulty, tmp_path):
    d, t = faulty
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = run_cli("compare", str(tmp_path / "nope"), t, "--junit", str(blocker / "report.xml"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "stepledger: %s: no such file" % (tmp_path / "nope")]
    assert blocker.read_text() == "x"


def test_an_env_file_given_alone_compares_that_env(faulty):
    d, t = faulty  # 3 envs, env 1's rewards rounded through float16 outside its LedgerEnv
    env_0, env_1 = os.path.join(d, "env-0.npz"), os.path.join(d, "env-1.npz")
    proc = run_cli("compare", env_0, t)
    assert proc.returncode == 0 and proc.stderr == "", proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "0 of 1 envs differ",
        "%s given alone: env 0 compared, not the trainer side's envs 1 and 2" % env_0]
    proc = run_cli("compare", env_1, t, "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = strict_json(proc.stdout)
    assert data["envs"] == [1] and [x["env"] for x in data["differences"]] == [1]
    assert data["differences"][0]["line"].startswith("env 1, episode 0, step 4: reward differs")
    assert data["notes"] == ["%s given alone: env 1 compared, not the trainer side's envs 0 and 2" % env_1]
    whole = run_cli("compare", d, t)  # the directory: every env, as before
    assert whole.returncode == 1 and "1 of 3 envs differ" in whole.stdout.splitlines()


def test_a_stray_file_named_like_a_ledger_is_named_and_the_rest_compared(tmp_path):
    d, t = pendulum_run(str(tmp_path / "run"), n_envs=3, steps=12)
    with open(os.path.join(d, "env-9.npz"), "w") as f:
        f.write("not a ledger\n")
    proc = run_cli("compare", d, t)
    note = "env-9.npz: not read, so not compared: not a ledger (13 bytes, too short for an .npz file)"
    assert proc.returncode == 3 and proc.stderr == "", proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == ["0 of 3 envs differ", note]
    proc = run_cli("compare", d, t, "--json", "--junit", str(tmp_path / "r.xml"))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    data = strict_json(proc.stdout)
    assert data["ok"] is True and data["complete"] is False and data["envs"] == [0, 1, 2]
    assert data["unread"] == [{"file": "env-9.npz", "why": "not a ledger (13 bytes, too short for an .npz file)"}]
    assert data["notes"] == [note]
    root, cases = _junit_cases(tmp_path / "r.xml")
    assert [c.get("name") for c in cases] == ["env 0", "env 1", "env 2", "env-9.npz"]
    assert root.get("failures") == "0" and cases[3].find("skipped").get("message") == note
    # a file in the place of an env the trainer recorded: that env is not compared either (not a difference)
    with open(os.path.join(d, "env-9.npz"), "rb") as f:
        junk = f.read()
    with open(os.path.join(d, "env-2.npz"), "wb") as f:
        f.write(junk)
    proc = run_cli("compare", d, t)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "0 of 2 envs differ",
        "env-2.npz: not read, so env 2 is not compared: not a ledger (13 bytes, too short for an .npz file)",
        note]
    # a difference still exits 1, and the file not read is named all the same
    e, tf = pendulum_run(str(tmp_path / "faulty"), n_envs=3, steps=12, fault_env=1)
    with open(os.path.join(e, "env-9.npz"), "wb") as f:
        f.write(junk)
    proc = run_cli("compare", e, tf)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("env 1, episode 0, step 4: reward differs") and lines[1:] == ["1 of 3 envs differ", note]
    # nothing there can be read: cannot compare, exit 2 with the first file's error
    for name in ("env-0.npz", "env-1.npz", "env-2.npz"):
        with open(os.path.join(e, name), "wb") as f:
            f.write(junk)
    proc = run_cli("compare", e, tf)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == "stepledger: %s: not a ledger (13 bytes, too short for an .npz file)" % \
        os.path.join(e, "env-0.npz")


def test_compare_help_documents_the_exit_codes():
    proc = run_cli("compare", "--help")
    text = " ".join(proc.stdout.split())
    assert ("exit codes: 0 no difference, 1 a difference, 2 cannot compare, 3 no difference in what was compared, "
            "but a file named like an env ledger could not be read (the report names it)") in text
    assert "or one env-N.npz, to compare that env alone" in text
