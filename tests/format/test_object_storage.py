"""Ledgers on a real S3-compatible object store on loopback (SeaweedFS, else moto's server), through s3fs
configured as a user configures it (FSSPEC_S3_ENDPOINT_URL and the AWS variables): the README's flows, the
example, a kill mid-spill, refused credentials, a missing bucket, and the store going away before close()
and in the middle of a run. Nothing may be lost: what storage did not take is on local disk, where a line
says, and ``stepledger push`` publishes it."""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("fsspec")
pytest.importorskip("s3fs")

import s3server  # noqa: E402
from envs_for_tests import record_cartpole_run  # noqa: E402

from stepledger import LedgerEnv, LedgerVectorEnv, TrainerLedger, compare, read
from stepledger import core
from stepledger.format import processes
from stepledger.format import storage
from stepledger.format import remote as uploader  # noqa: E402
from stepledger.errors import LedgerError  # noqa: E402

ROOT = testpaths.ROOT
TESTS_DIR = testpaths.TESTS_DIR


@pytest.fixture(scope="session")
def s3(s3_server):
    return s3_server


@pytest.fixture
def bucket(s3, monkeypatch, tmp_path):
    """A new bucket on the session's server, this process pointed at it, and a keep directory of its own."""
    s3.configure(monkeypatch)
    monkeypatch.setenv("STEPLEDGER_UNPUBLISHED", str(tmp_path / "unpublished"))
    return s3.make_bucket("t-" + uuid.uuid4().hex[:12])


def _environ(server, tmp_path, fast_fail=False, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPLEDGER_", "FSSPEC_S3"))}
    env.update(server.environ(fast_fail=fast_fail))
    env["STEPLEDGER_UNPUBLISHED"] = str(tmp_path / "unpublished")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, TESTS_DIR, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _run(args, env, cwd, timeout=240):
    return subprocess.run(args, env=env, cwd=str(cwd), capture_output=True, text=True, timeout=timeout)


def _cli(env, cwd, *args):
    return _run([sys.executable, "-m", "stepledger"] + list(args), env, cwd, timeout=120)


def _readme_block(marker):
    """The README's quickstart that uses ``marker`` (its first such block)."""
    text = open(os.path.join(ROOT, "README.md")).read()
    return [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if marker in b and '"ledger"' in b][0]


def _names(server, prefix):
    fs = server.filesystem()
    return sorted(p[len(prefix) + 1:] for p in fs.find(prefix))


# ---------------------------------------------------------------- the README's flows and the example


@pytest.mark.parametrize("marker", ["AsyncVectorEnv", "SubprocVecEnv"])
def test_readme_flow_on_s3(s3, bucket, tmp_path, marker):
    # The quickstart as printed, with the URL in place of "ledger": compare in the same process right after
    # close() must see the env ledgers the workers have just published.
    url = "s3://%s/readme" % bucket
    block = _readme_block(marker).replace('"ledger/trainer.npz"', '"%s/trainer.npz"' % url) \
                                 .replace('"ledger"', '"%s"' % url)
    block = block.replace("n_steps=256).learn(2048", "n_steps=64).learn(256")  # the same flow, shorter
    assert url in block
    script = tmp_path / "quickstart.py"
    script.write_text(block)
    env = _environ(s3, tmp_path)
    proc = _run([sys.executable, str(script)], env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if "compare(" in block:
        assert proc.stdout.strip().splitlines()[-1] == "0 of 4 envs differ", proc.stdout
    assert _names(s3, "%s/readme" % bucket) == ["env-0.npz", "env-1.npz", "env-2.npz", "env-3.npz", "trainer.npz"]
    cmd = _cli(env, tmp_path, "compare", url, url + "/trainer.npz")
    assert cmd.returncode == 0 and cmd.stdout.strip() == "0 of 4 envs differ", cmd.stdout + cmd.stderr
    show = _cli(env, tmp_path, "show", url)
    assert show.returncode == 0 and show.stdout.startswith(url + ": a directory of 4 env ledgers and 1 trainer ledger"), show.stdout + show.stderr
    assert not os.path.exists(tmp_path / "unpublished")  # nothing failed, nothing kept


def test_example_with_dir_on_s3(s3, bucket, tmp_path):
    url = "s3://%s/ex-1" % bucket
    env = _environ(s3, tmp_path)
    proc = _run([sys.executable, os.path.join(ROOT, "examples", "gymnasium_async.py"), "--fault", "--keep-values", "--dir", url],
                env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("env 1, episode 0, step 13: reward differs (env gave ")
    assert lines[1].startswith("env 3, episode 1, step 16: obs differs (env gave [")
    assert lines[2].startswith("env 4, episode 0, step 25: terminated, truncated differ")
    assert lines[3:] == ["3 of 8 envs differ", "ledgers in " + url]


def test_compare_sees_what_is_there_now(s3, bucket):
    # A listing cached before the env ledgers were published must not hide them; nor may a removed file linger.
    url = "s3://%s/fresh" % bucket
    with pytest.raises(LedgerError, match="no such file"):
        read(url)  # s3fs now has a listing of the bucket, from before the ledgers
    record_cartpole_run(url, 20)
    assert compare(url, url + "/trainer.npz")
    s3.filesystem().rm("%s/fresh/env-1.npz" % bucket)  # behind this process's back
    with read(url) as ledger:
        assert sorted(ledger.streams) == [0]


# ---------------------------------------------------------------- errors at construction


def test_missing_bucket_is_an_error_and_is_not_created(s3, bucket):
    for name in ("no-such-bucket-%s" % uuid.uuid4().hex[:8], "Bad_Bucket"):
        url = "s3://%s/run-x" % name
        with pytest.raises(LedgerError) as exc:
            LedgerEnv(gym.make("CartPole-v1"), url, index=0)
        assert str(exc.value) == ("%s/env-0.npz: the bucket %r does not exist; create it first "
                                  "(stepledger never creates one)" % (url, name))
        with pytest.raises(LedgerError) as exc:
            LedgerVectorEnv(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")]), url + "/trainer.npz")
        assert "does not exist" in str(exc.value) and "\n" not in str(exc.value)
        assert not s3.filesystem().exists(name)


def test_refused_credentials_are_an_error_at_construction(s3, bucket, monkeypatch, tmp_path):
    if not s3.refuses_bad_credentials:
        pytest.skip("moto's server accepts any credentials")
    s3.configure(monkeypatch, secret="not-the-secret")
    url = "s3://%s/run-creds" % bucket
    with pytest.raises(LedgerError) as exc:
        LedgerEnv(gym.make("CartPole-v1"), url, index=0)
    assert str(exc.value).startswith(url + "/env-0.npz: the storage refused these credentials")
    assert "\n" not in str(exc.value)
    # in worker processes: the trainer's construction fails with one line, the workers' too, no ledger lost
    code = """
import functools, gymnasium as gym, sys
from stepledger import LedgerEnv
from stepledger.errors import LedgerError
try:
    envs = gym.vector.AsyncVectorEnv([functools.partial(lambda i: LedgerEnv(gym.make("CartPole-v1"), %r, index=i), i)
                                      for i in range(2)])
except Exception as exc:
    print("ERROR", type(exc).__name__, str(exc).splitlines()[-1])
""" % url
    proc = _run([sys.executable, "-c", code], _environ(s3, tmp_path, AWS_SECRET_ACCESS_KEY="nope"), tmp_path)
    assert "the storage refused these credentials" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert s3.filesystem().find(bucket) == []  # nothing was written, not even the probe


def test_unreachable_storage_is_an_error_at_construction(monkeypatch, tmp_path):
    pytest.importorskip("s3fs")
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    import fsspec.config
    import s3fs
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": "http://127.0.0.1:9",  # and one attempt
                                                   "config_kwargs": {"retries": {"max_attempts": 1}}})
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(LedgerError) as exc:
        LedgerEnv(gym.make("CartPole-v1"), "s3://some-bucket/run", index=0)
    assert str(exc.value).startswith("s3://some-bucket/run/env-0.npz: cannot reach the storage (")
    assert "\n" not in str(exc.value)
    s3fs.S3FileSystem.clear_instance_cache()


# ---------------------------------------------------------------- a kill mid-spill

SPILLER = """
import os, sys, time, gymnasium as gym
from stepledger import LedgerEnv, core
core.set_memory_limit(3000)
env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=50), sys.argv[1], index=0)
env.reset(seed=0)
env.action_space.seed(0)
rec = env._recording
for i in range(10**9):
    _, _, term, trunc, _ = env.step(env.action_space.sample())
    if term or trunc:
        env.reset()
    if len(rec.place.uploaded) >= 3 and i % 50 == 0:
        print("SPILLED", len(rec.segments), flush=True)
        time.sleep(0.05)
"""


def test_kill_mid_spill(s3, bucket, tmp_path):
    url = "s3://%s/killed" % bucket
    stage_tmp = tmp_path / "tmpdir"
    stage_tmp.mkdir()
    env = _environ(s3, tmp_path, TMPDIR=str(stage_tmp))
    proc = subprocess.Popen([sys.executable, "-c", SPILLER, url], env=env, cwd=str(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("SPILLED"):
                break
            assert line or proc.poll() is None, proc.stderr.read()
        else:
            raise AssertionError("no spill in 90 s")
        proc.send_signal(signal.SIGKILL)  # mid-run, with spills being written and uploaded
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # storage holds this run's segments: a partial ledger
    with read(url) as ledger:
        assert ledger.partial and len(ledger.streams[0]) > 0
        in_storage = len(ledger.streams[0])
    # the killed process's stage is named by `stepledger show`, then removed by the next writer in that TMPDIR
    (stage,) = [p for p in os.listdir(stage_tmp) if p.startswith("stepledger-stage-")]
    show = _cli(env, tmp_path, "show", url)
    assert show.returncode == 0, show.stderr
    assert ("left by process %d, which is gone: %s" % (proc.pid, stage_tmp / stage)) in show.stdout, show.stdout
    assert "partial" in show.stdout.splitlines()[0]
    writer = """
import sys, gymnasium as gym
from stepledger import LedgerEnv
env = LedgerEnv(gym.make("CartPole-v1"), sys.argv[1], index=0)
env.reset(seed=0)
env.step(0)
env.close()
"""
    (info,) = uploader.leftover_stages(str(stage_tmp))
    assert info["url"] == url + "/env-0.npz" and info["pid"] == proc.pid
    not_uploaded = sorted(info["not_uploaded"])  # spilled while the upload queue was busy, as the kill came
    nxt = _run([sys.executable, "-c", writer, "s3://%s/next" % bucket], env, tmp_path)
    assert nxt.returncode == 0, nxt.stderr
    assert [p for p in os.listdir(stage_tmp) if p.startswith("stepledger-stage-")] == []
    # what the killed process had spilled but not uploaded was moved to the keep directory, not deleted
    kept_dir = tmp_path / "unpublished" / "s3" / bucket / "killed"
    kept = sorted(os.listdir(kept_dir / "env-0.npz.spill")) if kept_dir.exists() else []
    assert kept == not_uploaded
    if kept:
        push = _cli(env, tmp_path, "push", str(kept_dir), url)
        assert push.returncode == 0 and push.stdout.splitlines()[-1].startswith("published %d file" % len(kept))
        with read(url) as ledger:
            assert ledger.partial and len(ledger.streams[0]) > in_storage


def test_stage_of_a_live_process_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPLEDGER_UNPUBLISHED", str(tmp_path / "unpublished"))
    live = tmp_path / ("stepledger-stage-%d-abc" % os.getpid())
    live.mkdir()
    (live / "owner.json").write_text(json.dumps({"pid": os.getpid(), "start": processes.start_time(os.getpid()),
                                                 "url": "s3://b/x/env-0.npz"}))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = tmp_path / ("stepledger-stage-%d-def" % dead.pid)
    gone.mkdir()
    (gone / "owner.json").write_text(json.dumps({"pid": dead.pid, "start": 1, "url": "s3://b/x/env-1.npz"}))
    (gone / "seg-000000.npz").write_bytes(b"x")
    (gone / "seg-000000.npz.uploaded").write_bytes(b"")
    zombie = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = processes.start_time(zombie.pid)
        zombie.kill()  # killed and not yet reaped: its stage is a dead process's too
        time.sleep(0.5)
        killed = tmp_path / ("stepledger-stage-%d-ghi" % zombie.pid)
        killed.mkdir()
        (killed / "owner.json").write_text(json.dumps({"pid": zombie.pid, "start": start, "url": "s3://b/x/env-2.npz"}))
        assert sorted(i["path"] for i in uploader.leftover_stages(str(tmp_path))) == [str(gone), str(killed)]
        uploader.clear_dead_stages(str(tmp_path))
    finally:
        zombie.wait()
    assert live.exists() and not gone.exists() and not killed.exists()


# ---------------------------------------------------------------- storage going away


@pytest.fixture
def outage_server(monkeypatch, tmp_path):
    """A private server for a test that stops it."""
    server = s3server.started_or_skip()
    server.configure(monkeypatch, fast_fail=True)
    monkeypatch.setenv("STEPLEDGER_UNPUBLISHED", str(tmp_path / "unpublished"))
    try:
        yield server
    finally:
        server.close()


def test_server_stopped_before_close(outage_server, s3, monkeypatch, tmp_path):
    name = outage_server.make_bucket("outage-%s" % uuid.uuid4().hex[:8])
    url = "s3://%s/run" % name
    old = core.memory_limit()
    core.set_memory_limit(4000)  # spills: some segments are in storage when it goes away
    try:
        envs = LedgerVectorEnv(gym.vector.SyncVectorEnv(
            [functools.partial(lambda i: LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=30), url, index=i), i)
             for i in range(3)]), url + "/trainer.npz")
        envs.reset(seed=0)
        envs.action_space.seed(0)
        for _ in range(200):
            envs.step(envs.action_space.sample())
        for rec in _recordings(envs):
            rec.place.wait()
        assert len(_names(outage_server, name + "/run")) >= 4  # segments were uploaded
        outage_server.stop()
        t0 = time.monotonic()
        with pytest.warns(uploader.StorageWarning) as warned:
            envs.close()  # no raise: every ledger is kept locally, one line each
        took = time.monotonic() - t0
    finally:
        core.set_memory_limit(old)
    lines = [str(w.message) for w in warned]
    assert len(lines) == 4 and all("not published" in x and "\n" not in x for x in lines), lines
    keep = tmp_path / "unpublished" / "s3" / name / "run"
    for ledger in ("env-0.npz", "env-1.npz", "env-2.npz", "trainer.npz"):
        kept = keep / ledger
        (line,) = [x for x in lines if x.startswith("%s/%s: " % (url, ledger))]
        assert "the complete ledger is kept at %s; publish it later with: stepledger push %s %s/%s" % (
            kept, kept, url, ledger) in line
        assert kept.exists()
    assert compare(str(keep), str(keep / "trainer.npz"))  # complete and readable as they are
    assert took < 60
    # publish them later, to a store that is there (the session's server, same bucket name)
    s3.configure(monkeypatch)
    s3.make_bucket(name)
    env = _environ(s3, tmp_path)
    push = _cli(env, tmp_path, "push", str(keep), url)
    assert push.returncode == 0, push.stderr
    cmp = _cli(env, tmp_path, "compare", url, url + "/trainer.npz")
    assert cmp.returncode == 0 and cmp.stdout.strip() == "0 of 3 envs differ", cmp.stdout + cmp.stderr
    assert not keep.exists()  # pushed files are removed locally once storage has them


def _recordings(envs):
    out = [envs.ledger.recording] if isinstance(getattr(envs, "ledger", None), TrainerLedger) else []
    for e in envs.unwrapped.envs if hasattr(envs.unwrapped, "envs") else []:
        while e is not None and not isinstance(e, LedgerEnv):
            e = getattr(e, "env", None)
        if e is not None:
            out.append(e._recording)
    return [r for r in out if r is not None]


MID_RUN = """
import functools, glob, os, sys, time, gymnasium as gym, numpy as np
from stepledger import LedgerEnv, LedgerVectorEnv, core, storage

url, hold, err = sys.argv[1:4]
publish = storage.publish


def hung_publish(local, dest):  # in every process (the workers are forked from this one)
    if os.path.exists(hold):  # an upload hangs in the network (a connection that never answers) while it is there
        mark = "%s-%d" % (hold, os.getpid())
        open(mark, "w").close()
        deadline = time.monotonic() + 150
        while os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.unlink(mark)
    return publish(local, dest)


storage.publish = hung_publish


def make(i):
    core.set_memory_limit(4000)
    return LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=40), url, index=i)


def given_up():  # each ledger's uploads failed and it said so, once a ledger
    with open(err) as f:
        return f.read().count("uploads to storage failed") >= 3


if __name__ == "__main__":
    core.set_memory_limit(4000)  # spills every few dozen steps, on both sides
    envs = gym.vector.AsyncVectorEnv([functools.partial(make, i) for i in range(2)], context="fork")
    envs = LedgerVectorEnv(envs, url + "/trainer.npz")
    envs.reset(seed=0)
    actions = np.zeros((2, 1), np.float32)
    steps = 0
    for i in range(300):
        envs.step(actions)
        steps += 1
    print("HALF", flush=True)
    sys.stdin.readline()  # the test stops the server now
    # the next spills' uploads hang: the steps go on, a hundred of them once an upload is hung
    open(hold, "w").close()
    since = None
    while (since is None or steps < since + 100) and steps < 10**5:
        envs.step(actions)
        steps += 1
        if since is None and glob.glob(hold + "-*"):
            since = steps
    print("HUNG", len(glob.glob(hold + "-*")), steps - (since or steps), flush=True)
    os.unlink(hold)
    # then the uploads fail (the server is gone) until each ledger gives up, its retries done; steps go on
    t0, slowest = time.monotonic(), 0.0
    while not given_up() and time.monotonic() - t0 < 150:
        t = time.perf_counter()
        envs.step(actions)
        slowest = max(slowest, time.perf_counter() - t)
        steps += 1
    print("STEPS", steps, "%.3f" % slowest, given_up(), flush=True)
    envs.close()
    print("CLOSED", 1 + steps, flush=True)
"""


def test_server_stopped_mid_run(outage_server, tmp_path):
    # Spilling on both sides when the store goes away: no step waits for the network, each ledger warns once,
    # recording goes on locally, and close() ends with every ledger complete on local disk, one line each.
    name = outage_server.make_bucket("midrun-%s" % uuid.uuid4().hex[:8])
    url = "s3://%s/run" % name
    env = _environ(outage_server, tmp_path, fast_fail=True)
    hold, err_path = str(tmp_path / "hold"), str(tmp_path / "stderr")
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen([sys.executable, "-c", MID_RUN, url, hold, err_path], env=env, cwd=str(tmp_path),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err_file, text=True)
    try:
        assert proc.stdout.readline().strip() == "HALF", open(err_path).read()
        assert any(".spill/seg-" in n for n in _names(outage_server, name + "/run"))  # spills reached storage
        outage_server.stop()
        proc.stdin.write("\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = open(err_path).read()
    assert proc.returncode == 0, err[-3000:]
    # training went on at its pace: a hundred steps while uploads hung in the network (a step that waited for
    # one would never have come back)
    (hung,) = [x.split() for x in out.splitlines() if x.startswith("HUNG")]
    assert int(hung[1]) >= 1 and int(hung[2]) >= 100, out
    (steps,) = [x.split() for x in out.splitlines() if x.startswith("STEPS")]
    assert steps[3] == "True", out + err[-3000:]  # and on while they failed, until each ledger gave up
    warned = re.findall(r"StorageWarning: (\S+): uploads to storage failed", err)
    assert sorted(warned) == [url + "/env-0.npz", url + "/env-1.npz", url + "/trainer.npz"], err  # once a ledger
    assert all("recording goes on locally" in x for x in err.splitlines() if "uploads to storage failed" in x)
    kept = [x for x in err.splitlines() if "not published" in x]
    assert len(kept) == 3, err
    keep = tmp_path / "unpublished" / "s3" / name / "run"
    assert sorted(os.listdir(keep)) == ["env-0.npz", "env-1.npz", "trainer.npz"]
    assert compare(str(keep), str(keep / "trainer.npz"))
    n_events = int(out.split("CLOSED")[1].split()[0])
    with read(str(keep)) as ledger:
        assert [len(s) for s in ledger.streams.values()] == [n_events, n_events]


# ---------------------------------------------------------------- an earlier run's pieces at the same URL


def _spill_and_vanish(url, steps=150):
    """A run that spilled segments to ``url`` and died before writing its final file (as if killed)."""
    env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=20), url, index=0)
    env.reset(seed=1)
    for _ in range(steps):
        _, _, term, trunc, _ = env.step(np.zeros(1, np.float32))
        if term or trunc:
            env.reset()
    rec = env._recording
    rec.place.wait()
    assert len(rec.place.uploaded) >= 2
    rec.place.stop()
    rec._release()  # gone without a final file, its segments left in storage
    return len(rec.place.uploaded)


@pytest.mark.parametrize("spills", [False, True])
def test_an_earlier_runs_segments_are_not_read_as_this_run(s3, bucket, spills):
    url = "s3://%s/again" % bucket
    old = core.memory_limit()
    core.set_memory_limit(2000)
    try:
        _spill_and_vanish(url)
        with read(url) as ledger:
            assert ledger.partial and len(ledger.streams[0]) > 100  # the dead run's partial ledger
        if not spills:
            core.set_memory_limit(old)
        env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=20), url, index=0)
        env.reset(seed=2)
        for _ in range(120 if spills else 5):
            env.step(np.zeros(1, np.float32))
        if spills:
            env._recording.place.wait()
            with read(url) as ledger:  # killed now, a reader would find this run's segments only
                assert ledger.partial and len(ledger.streams[0]) <= 121
                assert len(ledger._files) == len(env._recording.place.uploaded)
        env.close()
    finally:
        core.set_memory_limit(old)
    with read(url) as ledger:
        assert not ledger.partial and len(ledger.streams[0]) == (121 if spills else 6)
    assert _names(s3, "%s/again" % bucket) == ["env-0.npz"]


def test_a_flush_without_waiting_is_uploaded_in_the_background(s3, bucket):
    url = "s3://%s/flushed" % bucket
    env = LedgerEnv(gym.make("Pendulum-v1"), url, index=0)
    env.reset(seed=0)
    for _ in range(10):
        env.step(np.zeros(1, np.float32))
    rec = env._recording
    assert rec.write(wait=False) == 11  # returns once the snapshot is staged
    rec.place.wait()
    with read(url) as ledger:
        assert not ledger.partial and len(ledger.streams[0]) == 11
    assert [n for n in os.listdir(rec.place.stage) if n.startswith("flush-")] == []  # the snapshot is gone
    for _ in range(5):
        env.step(np.zeros(1, np.float32))
    env.close()
    with read(url) as ledger:
        assert len(ledger.streams[0]) == 16


def test_a_ledger_never_closed_is_published_at_exit(s3, bucket, tmp_path):
    # At exit concurrent.futures stops taking work before atexit handlers run, and s3fs needs it to upload.
    url = "s3://%s/atexit" % bucket
    stage_tmp = tmp_path / "tmpdir"
    stage_tmp.mkdir()
    code = """
import sys, gymnasium as gym, numpy as np
from stepledger import LedgerEnv, core
core.set_memory_limit(3000)
env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=1000), sys.argv[1], index=0)
env.reset(seed=0)
for _ in range(500):
    env.step(np.zeros(1, np.float32))
"""  # no close()
    proc = _run([sys.executable, "-c", code, url], _environ(s3, tmp_path, TMPDIR=str(stage_tmp)), tmp_path)
    assert proc.returncode == 0 and "StorageWarning" not in proc.stderr, proc.stderr
    with read(url) as ledger:
        assert not ledger.partial and len(ledger.streams[0]) == 501
    assert _names(s3, "%s/atexit" % bucket) == ["env-0.npz"]  # segments removed once the final file was there
    assert os.listdir(stage_tmp) == [] and not os.path.exists(tmp_path / "unpublished")


# ---------------------------------------------------------------- memory of a read


@pytest.mark.parametrize("size_known", [True, False])
def test_a_large_object_is_copied_in_ranged_reads_of_bounded_memory(s3, bucket, monkeypatch, tmp_path, size_known):
    """s3fs's get_file downloads an object of more than its block size (50 MB) in parts, ten at once, each held
    whole in memory (a trainer ledger of 200 MB took 455 MB, and a trainer ledger grows with the number of
    envs): an object larger than WHOLE_FETCH_MAX, or of a size not known,
    is copied FETCH_BLOCK bytes at a time; the small ones together, as before. Both arrive whole, and an object
    gone since it was listed is skipped."""
    import tracemalloc
    monkeypatch.setattr(storage, "FETCH_BLOCK", 1 << 20)
    monkeypatch.setattr(storage, "WHOLE_FETCH_MAX", 1 << 20)
    fs = s3.filesystem()
    big = np.random.default_rng(0).integers(0, 256, size=80 << 20, dtype=np.uint8).tobytes()
    small = big[:100_000]
    fs.pipe({"%s/blobs/big" % bucket: big, "%s/blobs/small-1" % bucket: small, "%s/blobs/small-2" % bucket: small})
    url = "s3://%s/blobs/" % bucket
    sizes = {"big": len(big) if size_known else None, "small-1": len(small), "small-2": len(small), "gone": 10,
             "gone-big": None}
    copies = [(url + name, str(tmp_path / name), size) for name, size in sizes.items()]
    storage.fetch(url + "small-1", str(tmp_path / "warm"))  # the client set up (botocore's models), before
    tracemalloc.start()
    try:
        storage.fetch_all(copies)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (tmp_path / "big").read_bytes() == big
    assert (tmp_path / "small-1").read_bytes() == (tmp_path / "small-2").read_bytes() == small
    assert not (tmp_path / "gone").exists() and not (tmp_path / "gone-big").exists()
    assert peak < 4 * storage.FETCH_BLOCK + 2 * len(small) + (1 << 20), peak  # a few blocks, not the 80 MB object


def test_a_run_read_from_s3_with_small_blocks_reads_as_it_does_whole(s3, bucket, monkeypatch):
    url = "s3://%s/blocks" % bucket
    record_cartpole_run(url, 300)
    whole = str(compare(url, url + "/trainer.npz"))
    with read(url + "/trainer.npz") as ledger:
        events = {i: np.asarray(s.columns["h_obs"]) for i, s in ledger.streams.items()}
    monkeypatch.setattr(storage, "FETCH_BLOCK", 4096)
    monkeypatch.setattr(storage, "WHOLE_FETCH_MAX", 4096)
    assert str(compare(url, url + "/trainer.npz")) == whole
    with read(url + "/trainer.npz") as ledger:
        assert {i: np.asarray(s.columns["h_obs"]) for i, s in ledger.streams.items()}.keys() == events.keys()
        for i, s in ledger.streams.items():
            assert np.array_equal(np.asarray(s.columns["h_obs"]), events[i])
