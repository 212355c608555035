"""compare as Ray tasks (``compare(..., ray=...)``, ``stepledger compare --ray``) on a real local Ray cluster, against
ledgers on a local path and on the suite's S3-compatible server: the same report as a local compare, tasks that read
their ledgers themselves, bad addresses refused in one line.

These run in the Ray venv (Ray 2.60 pins gymnasium 1.2.2): tests/report/test_compare_ray_venv.py builds it and runs
this file there; in the suite's own venv they are skipped.
"""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import json
import os
import subprocess
import sys
import uuid

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed here: tests/report/test_compare_ray_venv.py runs "
                                        "these in a venv of their own")

import big_ledgers  # noqa: E402
from stepledger import compare  # noqa: E402
from stepledger.errors import LedgerError  # noqa: E402
from stepledger.report import html, parallel  # noqa: E402

ROOT, TESTS_DIR = testpaths.ROOT, testpaths.TESTS_DIR
FAULTS = {1: [(7, "reward")], 3: [(20_000, "obs")], 6: [(201, "truncated")]}


@pytest.fixture(scope="module")
def s3_here(s3_server):
    """The suite's S3-compatible server on loopback (tests/conftest.py), this process's s3fs pointed at it
    for the module's tests."""
    import fsspec.config
    old = {k: os.environ.get(k) for k in s3_server.environ()}
    old_conf = fsspec.config.conf.get("s3")
    os.environ.update(s3_server.environ())
    fsspec.config.conf["s3"] = s3_server.options()
    try:
        yield s3_server
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if old_conf is None:
            fsspec.config.conf.pop("s3", None)
        else:
            fsspec.config.conf["s3"] = old_conf


@pytest.fixture(scope="module")
def cluster(s3_here):
    """A real local Ray cluster of 2 CPUs of its own (address="local": not another on the machine), joined by this process; its workers get the storage settings
    through the runtime environment, as docs/SCALE.md says a cluster's nodes do."""
    context = ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                       runtime_env={"env_vars": dict(s3_here.environ(), PYTHONPATH=ROOT)})
    try:
        yield context.address_info["gcs_address"]  # where another process joins it (HOST:PORT)
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("ray")
    return {"clean": big_ledgers.write_pair(str(base / "clean"), 8, 30_000),
            "faulty": big_ledgers.write_pair(str(base / "faulty"), 8, 30_000, FAULTS)}


@pytest.fixture(scope="module")
def s3(s3_here, runs):
    """Both runs' ledgers uploaded to a bucket: {which: (env URL, trainer URL)}."""
    bucket = s3_here.make_bucket("ray-" + uuid.uuid4().hex[:10])
    fs = s3_here.filesystem()
    urls = {}
    for which, (env_dir, _) in runs.items():
        names = sorted(os.listdir(env_dir))
        fs.put([os.path.join(env_dir, n) for n in names], ["%s/%s/%s" % (bucket, which, n) for n in names])
        urls[which] = ("s3://%s/%s" % (bucket, which), "s3://%s/%s/trainer.npz" % (bucket, which))
    return s3_here, urls


@pytest.fixture
def tasks_seen(monkeypatch):
    """The groups of envs sent to Ray tasks, and the files each task's items name."""
    seen = []
    real = parallel._items

    def spy(work, positions, name=str):
        items = real(work, positions, name)
        seen.append([path for _, item in items for ref in item[1:3] if ref for path, _, _ in ref[0][1]])
        return items
    monkeypatch.setattr(parallel, "_items", spy)
    return seen


@pytest.mark.parametrize("which", ["clean", "faulty"])
@pytest.mark.parametrize("count_all", [False, True])
def test_ray_tasks_give_the_local_report_from_a_path(cluster, runs, which, count_all, tasks_seen):
    env_dir, trainer = runs[which]
    local = compare(env_dir, trainer, count_all=count_all, jobs=1)
    on_ray = compare(env_dir, trainer, count_all=count_all, ray=True)
    assert str(on_ray) == str(local) and on_ray.to_json() == local.to_json()
    assert [d.spread for d in on_ray.differences] == [d.spread for d in local.differences]  # the page's strips
    assert html.to_html(on_ray) == html.to_html(local)
    assert len(tasks_seen) == 2  # one task per CPU of the cluster, each a group of envs
    assert sorted(p for paths in tasks_seen for p in paths if "env-" in p) == sorted(
        os.path.join(env_dir, "env-%d.npz" % e) for e in range(8))
    if which == "faulty":
        assert len(on_ray.differences) == 3


@pytest.mark.parametrize("faulty", [None, (5, 77)])
def test_ray_tasks_pair_batch_files_as_one_process_does(cluster, tmp_path, faulty, tasks_seen):
    """Batch files (env-0-3.npz, env-4-6.npz, env-7.npz: several envs in one file) read by the tasks themselves:
    each env paired with the trainer side's as one process pairs it (tests/batched/test_batch_compare_parallel.py
    for worker processes)."""
    sys.path.insert(0, os.path.join(TESTS_DIR, "batched"))
    from test_batch_compare_parallel import write_batches
    env_dir, trainer = write_batches(str(tmp_path / "run"), faulty)
    local = compare(env_dir, trainer, jobs=1)
    on_ray = compare(env_dir, trainer, ray=True)
    assert str(on_ray) == str(local) and on_ray.to_json() == local.to_json()
    assert local.envs == list(range(8)) and local.ok == (faulty is None), local.lines()
    if faulty is not None:
        assert [(d.env, d.fields, d.event) for d in on_ray.differences] == [(5, ("reward",), 78)]
    assert len(tasks_seen) == 2
    named = sorted({os.path.basename(p) for paths in tasks_seen for p in paths})
    assert named == ["env-0-3.npz", "env-4-6.npz", "env-7.npz", "trainer.npz"]


@pytest.mark.parametrize("which", ["clean", "faulty"])
def test_ray_tasks_read_the_ledgers_from_the_object_store_themselves(cluster, runs, s3, which, tasks_seen):
    _, urls = s3
    local = compare(*runs[which], jobs=1)
    on_ray = compare(*urls[which], ray=True)
    # the same report, but for the names of the files: the URL's rather than the local directory's
    assert on_ray.to_json().replace(urls[which][0], runs[which][0]) == local.to_json()
    assert str(on_ray).replace(urls[which][0], runs[which][0]) == str(local)
    named = [p for paths in tasks_seen for p in paths]
    assert named and all(p.startswith(urls[which][0] + "/") for p in named)  # each task fetches from the URL


def test_the_driver_fetches_what_it_reads_of_the_ledgers_not_their_columns(cluster, runs, s3, monkeypatch):
    """From a URL the driver's copies are filled as it reads them (format/ondemand.py): it fetches the
    directories and the members it checks, the tasks fetch the columns. The report is the local one."""
    from stepledger.format import ondemand
    _, urls = s3
    fetched = {}
    real = ondemand.OnDemand.put

    def put(self, start, data):  # in this process: the driver (the tasks run in Ray's workers)
        fetched[self.url] = fetched.get(self.url, 0) + len(data)
        return real(self, start, data)
    monkeypatch.setattr(ondemand.OnDemand, "put", put)
    local = compare(*runs["clean"], jobs=1)
    on_ray = compare(*urls["clean"], ray=True)
    assert str(on_ray).replace(urls["clean"][0], runs["clean"][0]) == str(local) and on_ray.ok
    env_dir = runs["clean"][0]
    total = sum(os.path.getsize(os.path.join(env_dir, n)) for n in os.listdir(env_dir))
    assert fetched and sum(fetched.values()) <= 0.5 * total, (sum(fetched.values()), total)
    assert not ondemand.COPIES


def test_jobs_sets_the_number_of_ray_tasks(cluster, runs, tasks_seen):
    env_dir, trainer = runs["faulty"]
    local = compare(env_dir, trainer, jobs=1)
    for jobs, tasks in ((1, 1), (3, 3)):
        tasks_seen.clear()
        on_ray = compare(env_dir, trainer, ray=True, jobs=jobs)
        assert str(on_ray) == str(local) and len(tasks_seen) == tasks
    with pytest.raises(ValueError, match=r"^jobs=0: the number of worker processes must be"):
        compare(env_dir, trainer, ray=True, jobs=0)


def test_the_command_runs_on_the_cluster_this_process_joined(cluster, runs):
    from stepledger.cli.main import main
    import contextlib
    import io
    outs = []
    for args in (["--jobs", "1"], ["--ray"]):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main(["compare", *runs["faulty"], "--json", *args])
        outs.append((code, buf.getvalue()))
    assert outs[0] == outs[1] and outs[0][0] == 1
    assert json.loads(outs[0][1])["n_differ"] == 3


def test_the_command_runs_on_a_cluster_at_an_address(cluster, runs):
    """``stepledger compare --ray ADDRESS`` in another process joins the cluster at that address (the suite's own,
    started by this process: a second head node would cost some 30 s), and prints what a local compare prints."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS_DIR]))
    env.pop("RAY_ADDRESS", None)
    assert cluster.rsplit(":", 1)[-1].isdigit(), cluster
    got = subprocess.run([sys.executable, "-m", "stepledger", "compare", *runs["faulty"], "--ray", cluster],
                         capture_output=True, text=True, env=env, timeout=300)
    local = subprocess.run([sys.executable, "-m", "stepledger", "compare", *runs["faulty"], "--jobs", "1"],
                           capture_output=True, text=True, env=env, timeout=300)
    assert got.returncode == local.returncode == 1, got.stderr[-3000:]
    assert got.stdout == local.stdout


def test_an_address_with_no_cluster_is_one_clear_line(runs):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS_DIR]))
    env.pop("RAY_ADDRESS", None)
    got = subprocess.run([sys.executable, "-m", "stepledger", "compare", *runs["clean"], "--ray", "127.0.0.1:1"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert got.returncode == 2 and got.stdout == ""
    last = got.stderr.strip().splitlines()[-1]
    assert last.startswith("stepledger: the Ray cluster at 127.0.0.1:1 cannot be joined (")
    assert "Traceback" not in got.stderr


def test_a_ledger_that_cannot_be_read_in_a_task_is_the_error_one_process_gives(cluster, runs, tmp_path):
    import shutil
    env_dir = str(tmp_path / "run")
    shutil.copytree(runs["clean"][0], env_dir)
    trainer = os.path.join(env_dir, "trainer.npz")
    with pytest.raises(LedgerError) as local:
        with open(trainer, "r+b") as f:  # damage a column the readers only meet when they read it
            f.seek(os.path.getsize(trainer) // 2)
            f.write(b"\xff" * 64)
        compare(env_dir, trainer, jobs=1)
    with pytest.raises(LedgerError) as on_ray:
        compare(env_dir, trainer, ray=True)
    assert str(on_ray.value) == str(local.value)


def test_a_task_whose_worker_is_killed_ends_the_compare_with_one_line(cluster, tmp_path):
    """SIGKILL the Ray worker process running a compare task: WorkerLost, no report."""
    import signal
    import threading
    import time
    psutil = pytest.importorskip("psutil")
    env_dir, trainer = big_ledgers.write_pair(str(tmp_path / "slow"), 4, 1_500_000)
    for attempt in range(3):
        got = {}

        def run():
            try:
                got["report"] = compare(env_dir, trainer, ray=True)
            except BaseException as exc:  # noqa: B036  (looked at below)
                got["error"] = exc
        thread = threading.Thread(target=run)
        thread.start()
        victim = None
        deadline = time.monotonic() + 120
        while victim is None and thread.is_alive() and time.monotonic() < deadline:
            for p in psutil.Process().children(recursive=True):  # this cluster's processes, no other's
                try:
                    if any("ray::_ray_group" in part for part in p.cmdline()):
                        victim = p
                        break
                except psutil.Error:
                    pass
            time.sleep(0.01)
        if victim is not None:
            try:
                victim.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                victim = None
        thread.join(300)
        assert not thread.is_alive()
        if victim is None or "report" in got:  # the task was done before it could be killed: again
            continue
        exc = got["error"]
        assert isinstance(exc, LedgerError) and type(exc).__name__ == "WorkerLost", repr(exc)
        text = str(exc)
        assert text.startswith("the compare worker (a Ray task) comparing env") and "\n" not in text
        assert "not whole, so no report is given" in text
        return
    pytest.fail("no compare task could be killed before it was done, 3 times")
