"""compare in worker processes (``jobs=``, ``--jobs``): the same report, byte for byte, and the same exit codes as
one process, for clean and faulty runs, text, JSON and JUnit; a small compare stays in one process; Ctrl-C ends the
workers and leaves nothing behind; a worker that dies ends the compare with one line and exit 2, never a partial
report; ledgers replaced while they are compared (a writer's flush()) are compared as they were read."""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import big_ledgers
from stepledger import compare, wording
from stepledger.errors import LedgerError
from stepledger.report import html, parallel

psutil = pytest.importorskip("psutil")

ROOT, TESTS_DIR = testpaths.ROOT, testpaths.TESTS_DIR
EVENTS = 30_000  # a stream: small, so that the suite is quick; the size rule is lowered to 1 event below
FAULTS = {1: [(7, "reward")], 2: [(20_000, "obs"), (25_000, "action")], 3: [(50, "withheld"), (90, "withheld")],
          4: [(201, "truncated")], 5: [(0, "kind")]}

# Run the command line in a fresh interpreter with the size rule lowered, so that small ledgers use workers.
_CLI = ("import sys; import stepledger.report.parallel as p; p.MIN_EVENTS_A_WORKER = int(sys.argv[1]); "
        "from stepledger.cli.main import main; sys.exit(main(sys.argv[2:]))")


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, TESTS_DIR, env.get("PYTHONPATH")) if p)
    return env


def cli(*args, min_events=1, **kw):
    return subprocess.run([sys.executable, "-c", _CLI, str(min_events), *args], capture_output=True, text=True,
                          env=_env(), timeout=kw.pop("timeout", 180), **kw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A clean run of 6 envs, the same run with faults on the trainer side, and a faulty one with env 3's
    ledger missing and an env ledger the trainer never saw."""
    base = tmp_path_factory.mktemp("parallel")
    clean = big_ledgers.write_pair(str(base / "clean"), 6, EVENTS)
    faulty = big_ledgers.write_pair(str(base / "faulty"), 6, EVENTS, FAULTS)
    odd = big_ledgers.write_pair(str(base / "odd"), 6, EVENTS, FAULTS)
    os.remove(os.path.join(odd[0], "env-3.npz"))
    extra = big_ledgers.write_pair(str(base / "extra"), 8, 1000)
    shutil.copy(os.path.join(extra[0], "env-7.npz"), os.path.join(odd[0], "env-7.npz"))
    return {"clean": clean, "faulty": faulty, "odd": odd}


def assert_same_report(many, one):
    """The text, the JSON and what the HTML page draws (each difference's spread, agents and trainer file; the
    page itself) are one process's."""
    assert str(many) == str(one) and many.to_json() == one.to_json()
    assert [(d.env, d.spread, d.agents, d.trainer_file) for d in many.differences] == \
        [(d.env, d.spread, d.agents, d.trainer_file) for d in one.differences]
    assert (many.agents, many.agent_streams) == (one.agents, one.agent_streams)
    assert html.to_html(many, "compare") == html.to_html(one, "compare")


@pytest.mark.parametrize("which", ["clean", "faulty", "odd"])
@pytest.mark.parametrize("count_all", [False, True])
def test_workers_give_the_report_one_process_gives(runs, which, count_all, workers_used):
    env_dir, trainer = runs[which]
    one = compare(env_dir, trainer, count_all=count_all, jobs=1)
    assert workers_used == []
    for jobs in (2, 3):
        assert_same_report(compare(env_dir, trainer, count_all=count_all, jobs=jobs), one)
    assert workers_used == [2, 3]
    if which != "clean":
        assert len(one.differences) >= 4 and one.hints is not None
        # what the workers carry back beyond the text: the page's per-field strips, the withheld observations
        spread = {d.env: sum(map(sum, d.spread.values())) for d in one.differences if d.what == "fields"}
        assert spread == ({1: 1, 2: 2, 4: 1} if count_all else {1: 0, 2: 0, 4: 0})
    if which == "faulty":
        assert wording.withheld_obs({3: 2}) in one.notes, one.notes


def test_workers_give_a_multi_agent_runs_report_and_page(tmp_path, workers_used):
    """A real PettingZoo run (simple_spread, 3 agents, 3 copies through SuperSuit) with a reward clip between
    the ledgers: with workers, the same text, JSON and HTML page (its grid of env copies by agents)."""
    ss = pytest.importorskip("supersuit")
    simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")
    import numpy as np
    from stepledger.pettingzoo import LedgerParallelEnv, LedgerSuperSuitVecEnv
    d = str(tmp_path / "ledger")
    env = ss.clip_reward_v0(LedgerParallelEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25), d), -1.0, 0.5)
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 3, num_cpus=0, base_class="gymnasium")
    venv = LedgerSuperSuitVecEnv(venv, os.path.join(d, "trainer.npz"))
    venv.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(60):
        venv.step(rng.integers(0, 5, venv.num_envs))
    venv.close()
    for count_all in (False, True):
        one = compare(d, os.path.join(d, "trainer.npz"), count_all=count_all, jobs=1)
        assert one.agents == ["agent_0", "agent_1", "agent_2"] and len(one.envs) == 9 and one.differences
        assert_same_report(compare(d, os.path.join(d, "trainer.npz"), count_all=count_all, jobs=2), one)
        assert 'id="grid"' in html.to_html(one)
        if count_all:
            assert all(sum(d.spread["reward"]) == d.counts["reward"] > 0 for d in one.differences)
    assert workers_used == [2, 2]


@pytest.mark.parametrize("which, code", [("clean", 0), ("faulty", 1), ("odd", 1)])
def test_the_command_prints_the_same_bytes_and_exits_alike_with_jobs(runs, which, code, tmp_path):
    env_dir, trainer = runs[which]
    texts = []
    for extra in ([], ["--all", "--json"]):  # the report's other forms: test_workers_give_the_report_one_process_gives
        outs = []
        for jobs in ("1", "2"):
            junit, page = str(tmp_path / ("junit-%s.xml" % jobs)), str(tmp_path / ("page-%s.html" % jobs))
            got = cli("compare", env_dir, trainer, "--jobs", jobs, "--junit", junit, "--html", page, *extra)
            assert got.returncode == code, got.stderr
            outs.append((got.stdout, got.stderr, open(junit).read(), open(page, encoding="utf-8").read()))
        assert outs[0] == outs[1], (which, extra)
        texts.append(outs[0][0])
    assert "envs differ" in texts[0] and '"envs": [' in texts[1]


_ONE_ENV_KILLED = r"""
import os, signal, sys
import gymnasium as gym, numpy as np
from stepledger import LedgerEnv, LedgerVectorEnv
d = sys.argv[1]
envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([lambda i=i: LedgerEnv(gym.make("CartPole-v1"), d, index=i,
                                                                       flush_interval=1000) for i in range(4)]),
                       os.path.join(d, "trainer.npz"))
envs.reset(seed=0)
rng = np.random.default_rng(0)
for _ in range(300):
    envs.step(rng.integers(0, 2, 4))
envs.ledger.close()  # the trainer file
for i in (0, 1, 3):
    envs.env.envs[i].close()
os.kill(os.getpid(), signal.SIGKILL)  # env 2's recording dies with the process, never spilled
"""


def test_an_env_read_from_its_mapped_part_is_compared_here_and_the_others_by_workers(tmp_path, workers_used,
                                                                                     monkeypatch):
    d = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _ONE_ENV_KILLED, d], env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert not os.path.exists(os.path.join(d, "env-2.npz")) and os.path.exists(os.path.join(d, "env-3.npz"))
    here = []
    real_here = parallel._here
    monkeypatch.setattr(parallel, "_here", lambda fn, work, *a: here.append([w.env for w in work]) or
                        real_here(fn, work, *a))
    one = compare(d, os.path.join(d, "trainer.npz"), jobs=1)
    assert one.ok and sorted(one.envs) == [0, 1, 2, 3], str(one)
    assert any(n.endswith("env-2.npz its process died, and every event it recorded is read (301 from its mapped part)")
               for n in one.notes), one.notes
    assert workers_used == [] and here == [[0, 1, 3], [2]]  # all in this process
    del here[:]
    progress = []
    many = compare(d, os.path.join(d, "trainer.npz"), jobs=2, progress=lambda done, total: progress.append(
        (done, total)))
    assert_same_report(many, one)
    assert workers_used == [2] and here == [[2]]  # env 2 here, envs 0, 1 and 3 in two workers
    assert {total for _, total in progress} == {4} and progress[-1] == (4, 4)


def test_a_small_compare_runs_in_this_process(runs, monkeypatch):
    calls = []
    monkeypatch.setattr(parallel, "_in_processes", lambda *a: calls.append(a))
    env_dir, trainer = runs["faulty"]
    assert not compare(env_dir, trainer)  # 180,000 events: far below the size rule
    assert not compare(env_dir, trainer, jobs=8)
    assert calls == []


def test_plan_gives_runs_of_envs_balanced_by_events():
    class W:
        def __init__(self, n):
            self.env_stream = self.trainer_stream = [0] * n
    work = [W(n) for n in (100, 100, 100, 100, 400)]
    assert parallel.plan(work, 2) == [[0, 1, 2, 3], [4]]  # 404 events and 401
    assert parallel.plan(work, 1) == [[0, 1, 2, 3, 4]]
    assert parallel.plan(work[:1], 4) == [[0]]
    assert sorted(k for run in parallel.plan(work, 3) for k in run) == list(range(5))


@pytest.mark.parametrize("jobs", [0, -1, 1.5, 2.0, "2", True, np.int64(0), np.bool_(True)])
def test_bad_jobs_is_one_clear_line(runs, jobs):
    with pytest.raises(ValueError, match=r"^jobs=.*: the number of worker processes must be a whole number, 1 or more$"):
        compare(*runs["clean"], jobs=jobs)


def test_jobs_may_be_a_numpy_integer(runs):
    assert parallel.check_jobs(np.int64(2)) == 2 and type(parallel.check_jobs(np.int64(2))) is int
    assert str(compare(*runs["faulty"], jobs=np.int32(2))) == str(compare(*runs["faulty"], jobs=1))


@pytest.mark.parametrize("given", ["0", "-2", "two", "1.5", ""])
def test_bad_jobs_on_the_command_line_is_one_clear_line(runs, given, capsys):
    from stepledger.cli.main import main
    with pytest.raises(SystemExit) as exit_:
        main(["compare", *runs["clean"], "--jobs", given])
    got = capsys.readouterr()
    assert exit_.value.code == 2 and got.out == ""
    assert got.err == ("stepledger compare: error: argument --jobs: %r: the number of worker processes must be a "
                          "whole number, 1 or more (see stepledger compare --help)\n" % given)


def _workers_of(proc, want, timeout=60):
    """The worker processes of ``proc`` (a psutil.Process), once there are ``want`` of them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [c for c in proc.children() if c.status() != psutil.STATUS_ZOMBIE]
        if len(found) >= want:
            return found
        if proc.poll() if hasattr(proc, "poll") else not proc.is_running():
            break
        time.sleep(0.002)
    return []


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory):
    """Ledgers long enough that a compare in two workers takes a while: 4 envs of 1,500,000 events."""
    return big_ledgers.write_pair(str(tmp_path_factory.mktemp("slow") / "run"), 4, 1_500_000)


def _start(slow_run, *extra):
    return subprocess.Popen([sys.executable, "-c", _CLI, "1", "compare", *slow_run, "--jobs", "2", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)


def test_ctrl_c_ends_the_workers_and_leaves_nothing_behind(slow_run):
    before = sorted(os.listdir(slow_run[0]))
    for attempt in range(3):
        proc = _start(slow_run)
        workers = _workers_of(psutil.Process(proc.pid), 2)
        if not workers:  # done before its workers were seen: a very quick machine; try again
            proc.communicate(timeout=120)
            continue
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C at a terminal: the whole process group
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert out == "" and "Traceback" not in err
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, "workers left running: %s" % alive
        assert sorted(os.listdir(slow_run[0])) == before
        return
    pytest.fail("the compare ended before its workers were seen, 3 times")


def test_ctrl_c_to_the_parent_alone_ends_the_workers(slow_run):
    for attempt in range(3):
        proc = _start(slow_run)
        workers = _workers_of(psutil.Process(proc.pid), 2)
        if not workers:
            proc.communicate(timeout=120)
            continue
        os.kill(proc.pid, signal.SIGINT)  # kill -INT of the parent only: the workers never see it
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and out == "", err
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive
        return
    pytest.fail("the compare ended before its workers were seen, 3 times")


@pytest.mark.parametrize("json_out", [False, True])
def test_a_worker_killed_ends_the_compare_with_one_line_and_no_report(slow_run, json_out):
    for attempt in range(3):
        proc = _start(slow_run, *(["--json"] if json_out else []))
        workers = _workers_of(psutil.Process(proc.pid), 2)
        if not workers:
            proc.communicate(timeout=120)
            continue
        victim = workers[-1]
        try:
            victim.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            proc.communicate(timeout=120)
            continue
        out, err = proc.communicate(timeout=60)
        if proc.returncode == 0:  # the worker had sent everything before the signal landed: try again
            continue
        assert proc.returncode == 2, (out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err
        assert ("the compare worker (process %d)" % victim.pid) in lines[0]
        assert "killed by signal 9" in lines[0] and "not whole, so no report is given" in lines[0]
        if json_out:
            import json
            got = json.loads(out)
            assert got["ok"] is False and "killed by signal 9" in got["error"]
        else:
            assert out == ""
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive
        return
    pytest.fail("the worker could not be killed before it was done, 3 times")


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_ledgers_replaced_while_compared_are_compared_as_they_were_read(tmp_path, workers_used, monkeypatch, start):
    """A writer's flush() or close() replaces a ledger under its name while compare reads it: what the workers
    compare is the file compare opened (forked workers read the parent's open files; workers started afresh
    find the file changed, and the parent compares those envs itself)."""
    env_dir, trainer = big_ledgers.write_pair(str(tmp_path / "run"), 4, EVENTS, {2: [(11, "reward")]})
    longer = big_ledgers.write_pair(str(tmp_path / "longer"), 4, EVENTS + 5000, {0: [(3, "obs")]})
    expected = compare(env_dir, trainer, jobs=1)
    real = parallel._in_processes
    monkeypatch.setattr(parallel, "_context", lambda: __import__("multiprocessing").get_context(start))

    def replace_then_run(*args):
        for name in ("trainer.npz", "env-1.npz"):  # as flush() publishes a new file: os.replace
            shutil.copy(os.path.join(longer[0], name), os.path.join(env_dir, name + ".new"))
            os.replace(os.path.join(env_dir, name + ".new"), os.path.join(env_dir, name))
        return real(*args)
    monkeypatch.setattr(parallel, "_in_processes", replace_then_run)
    got = compare(env_dir, trainer, jobs=2)
    assert str(got) == str(expected) and got.to_json() == expected.to_json()
    assert "env 2, episode 0, step 11: reward differs" in str(got)
    assert workers_used == [2]


@pytest.mark.xfail(strict=False, reason="a race in reading the trainer side (read._read_one), not in the workers: once in "
                   "several runs under load, a trainer.npz given by name whose spill segments the writer is merging "
                   "is refused 'no such file'; to be fixed in read.py")
def test_a_compare_of_a_run_still_being_written(tmp_path, workers_used):
    """A real writer that keeps flushing (rewriting its ledgers) while compare runs with workers: each compare
    gives a report, never an error or a difference that is not there."""
    path = str(tmp_path / "ledger")
    code = ("import sys, time, numpy as np, gymnasium as gym\n"
            "from stepledger import LedgerEnv, LedgerVectorEnv\n"
            "envs = gym.vector.SyncVectorEnv([lambda i=i: LedgerEnv(gym.make('CartPole-v1'), %r, index=i) "
            "for i in range(3)])\n"
            "envs = LedgerVectorEnv(envs, %r)\n"
            "envs.reset(seed=0)\nprint('go', flush=True)\n"
            "k = 0\n"
            "while True:  # until the test kills it\n"
            "    envs.step(envs.action_space.sample())\n"
            "    k += 1\n"
            "    if k %% 300 == 0:\n"
            "        envs.call('flush'); envs.flush()\n" % (path, os.path.join(path, "trainer.npz")))
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                              text=True, env=_env())
    try:
        assert writer.stdout.readline().strip() == "go"
        deadline = time.monotonic() + 60
        def spilled(name):  # flush() spills the events so far as a segment; compare reads them
            d = os.path.join(path, name + ".spill")
            return os.path.isdir(d) and any(n.startswith("seg-") for n in os.listdir(d))
        while not all(spilled(n) for n in ("trainer.npz", "env-0.npz", "env-1.npz", "env-2.npz")):
            assert time.monotonic() < deadline and writer.poll() is None
            time.sleep(0.05)
        for _ in range(5):
            report = compare(path, os.path.join(path, "trainer.npz"), jobs=2)
            assert not report.differences, str(report)
            assert "in progress" in str(report)
    finally:
        writer.kill()
        writer.wait(30)
    assert workers_used and set(workers_used) == {2}


# ---------------------------------------------------------------- large runs: nothing quadratic in the files

def _counting(monkeypatch, module, name, counts):
    real = getattr(module, name)

    def counted(*a, **kw):
        counts[name] = counts.get(name, 0) + 1
        return real(*a, **kw)
    monkeypatch.setattr(module, name, counted)


def _counts_of_a_compare(tmp_path, monkeypatch, envs):
    """Calls made by one compare of ``envs`` env ledgers whose index is shifted by half of them (every env differs from
    its first event, and each env file matches another trainer env's stream: the index hint pairs them all)."""
    from stepledger.format import ledgerfile
    from stepledger.report import compare as compare_module
    from stepledger.report import read as read_module
    env_dir, trainer = big_ledgers.write_pair(str(tmp_path / ("run-%d" % envs)), envs, 300, shift=envs // 2)
    counts = {}
    with monkeypatch.context() as m:
        for module, name in ((compare_module, "_prefixes_match"), (compare_module, "other_run"),
                             (compare_module, "check_comparable"), (read_module, "_meta_key"),
                             (read_module, "_read_file"), (os, "listdir")):
            _counting(m, module, name, counts)
        real_open = ledgerfile.LedgerFile.__init__

        def opened(self, *a, **kw):
            counts["LedgerFile"] = counts.get("LedgerFile", 0) + 1
            real_open(self, *a, **kw)
        m.setattr(ledgerfile.LedgerFile, "__init__", opened)
        report = compare(env_dir, trainer, jobs=1)
    assert len(report.differences) == envs and "is index= each env's position" in report.hints[0]
    return counts


def test_listing_pairing_and_run_checks_grow_linearly_with_the_files(tmp_path, monkeypatch):
    small, large = (_counts_of_a_compare(tmp_path, monkeypatch, n) for n in (40, 160))
    for name in ("_prefixes_match", "other_run", "_meta_key", "_read_file", "LedgerFile"):
        assert large[name] <= 4 * small[name] + 8, (name, small[name], large[name])
        assert large[name] <= 5 * 160, (name, large[name])  # a few an env, never one an env per env
    assert large["listdir"] <= small["listdir"] + 2  # the directory is listed a set number of times
    assert large["check_comparable"] == small["check_comparable"] == 1
    assert large["_prefixes_match"] == 160  # each env file is compared with the one stream it matches


def test_ray_without_ray_installed_is_one_clear_line(runs):
    try:
        import ray  # noqa: F401
        pytest.skip("Ray is installed here: tests/report/test_compare_ray.py covers --ray")
    except ImportError:
        pass
    got = cli("compare", *runs["clean"], "--ray")
    assert got.returncode == 2 and got.stdout == ""
    assert got.stderr.strip() == 'stepledger: ray= (--ray) needs Ray, which is not installed here: pip install "ray>=2"'
    with pytest.raises(ImportError, match="needs Ray"):
        compare(*runs["clean"], ray="127.0.0.1:6379")


def test_spawned_workers_do_not_run_the_callers_script_again(runs, tmp_path):
    """A script with no ``if __name__ == "__main__"`` that runs a thread (so that workers are spawned, not forked)
    and compares at its end: its code runs once, and the report is one process's."""
    script = tmp_path / "train_then_compare.py"
    script.write_text("import sys, threading, time\n"
                      "print('the script ran', flush=True)\n"
                      "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
                      "import stepledger.report.parallel as p\n"
                      "p.MIN_EVENTS_A_WORKER = 1\n"
                      "calls = []\n"
                      "real = p._in_processes\n"
                      "p._in_processes = lambda *a: calls.append(p._context().get_start_method()) or real(*a)\n"
                      "from stepledger import compare\n"
                      "print(compare(sys.argv[1], sys.argv[2], jobs=2).to_json())\n"
                      "print(calls)\n")
    got = subprocess.run([sys.executable, str(script), *runs["faulty"]], capture_output=True, text=True, env=_env(),
                         timeout=180)
    assert got.returncode == 0, got.stderr[-3000:]
    lines = got.stdout.splitlines()
    assert lines[0] == "the script ran" and lines.count("the script ran") == 1
    assert lines[-1] == "['spawn']"
    assert "\n".join(lines[1:-1]) == compare(*runs["faulty"], jobs=1).to_json()
