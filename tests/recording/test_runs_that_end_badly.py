"""Runs that end badly: no ledger is lost, and an interrupted run is not a boundary fault.

Each case runs a real training script (tests/ending_harness.py) in its own
process group, on real vector envs, and ends it the way real runs end: close(),
no close(), an exception, Ctrl-C (SIGINT to the whole process group, as a
terminal sends it), SIGTERM to the trainer (as a scheduler sends it), SIGKILL to
one worker, and SIGKILL to every process after they sat idle for several flush
intervals (the trainer in a long update, its workers waiting for actions). Then
every ledger must read, and compare must find no difference.
"""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import ending_harness as H

from stepledger.format import schema as S
from stepledger import compare, read

TESTS_DIR = testpaths.TESTS_DIR
HARNESSES = ["async-fork", "async-forkserver", "async-spawn", "sync", "subproc", "dummy"]
ENDINGS = ["close", "no-close", "exception", "ctrl-c", "sigterm", "sigkill-worker", "idle-sigkill"]
MULTIPROCESS = {"async-fork", "async-forkserver", "async-spawn", "subproc"}
N_ENVS = 2
TIMEOUT = 60


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, env.get("PYTHONPATH")) if p)
    env["PYTHONFAULTHANDLER"] = "1"  # a process that hangs can be asked where (_fail_with_stacks)
    return env


def _wait_gone(pids, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("worker %d still running %d s after the trainer ended" % (pid, timeout))


def _read_line(proc, prefix):
    while True:
        line = proc.stdout.readline()
        if not line:
            pytest.fail("the script ended before printing %r:\n%s" % (prefix, proc.stderr.read()[-3000:]))
        if line.startswith(prefix):
            return line.split()[1:]


def run_case(directory, harness, ending):
    """Run the script and end it; returns (the trainer's exit code, worker pids, vector steps at 'ready', what
    the trainer and its workers wrote to stderr)."""
    how = {"ctrl-c": "wait", "sigterm": "wait", "sigkill-worker": "wait", "idle-sigkill": "idle"}.get(ending, ending)
    script = "import ending_harness as H; H.main(%r, %r, %r)" % (harness, how, directory)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(), start_new_session=True)
    try:
        workers = [int(p) for p in _read_line(proc, "workers")]
        ready = None
        if ending in ("ctrl-c", "sigterm", "sigkill-worker"):
            ready = int(_read_line(proc, "ready")[0])
            time.sleep(0.7)  # more than two flush intervals of stepping after 'ready'
            if ending == "ctrl-c":
                os.killpg(proc.pid, signal.SIGINT)
            elif ending == "sigterm":
                os.kill(proc.pid, signal.SIGTERM)
            else:
                # killed without warning: what its periodic spills wrote since 'ready' survives (spills go by
                # time: wait for one, however busy the machine)
                H.wait_for(lambda: H.on_disk(directory).get(N_ENVS - 1, 0) >= ready, TIMEOUT)
                os.kill(workers[-1], signal.SIGKILL)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    # SB3's SubprocVecEnv waits forever for a dead worker (its siblings hold the pipe
                    # open): the user presses Ctrl-C, as they would
                    os.killpg(proc.pid, signal.SIGINT)
        elif ending == "idle-sigkill":
            ready, events = [int(x) for x in _read_line(proc, "idle")[:2]]
            # no step anywhere: every event of either side reaches the disk by each process's idle spiller, an
            # interval and a tenth on (or as soon as a busy machine runs the threads)
            H.wait_for(lambda: sum(H.on_disk(os.path.join(directory, "trainer.npz")).values()) == events and
                       sum(H.on_disk(directory).values()) == events, TIMEOUT)
            os.killpg(proc.pid, signal.SIGKILL)  # the trainer and every worker, none of which can act
        try:
            proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            _fail_with_stacks(proc)
        _wait_gone(workers)
        return proc.returncode, workers, ready, proc.stderr.read()
    finally:
        H.reap(proc)


def _fail_with_stacks(proc):
    """The script did not end: every Python process of its group prints where it is (PYTHONFAULTHANDLER, set
    by _env, makes SIGABRT dump each thread's stack), and the test fails with them and the process list."""
    listing = subprocess.run(["ps", "-o", "pid,ppid,stat,wchan:20,cmd", "-g", str(proc.pid)],
                             capture_output=True, text=True).stdout
    os.killpg(proc.pid, signal.SIGABRT)
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    pytest.fail("the script did not end within %d s\n%s\n%s" % (TIMEOUT, listing, proc.stderr.read()[-20000:]))


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("harness", HARNESSES)
def test_no_ledger_lost_and_no_false_alarm(tmp_path, harness, ending):
    if ending == "sigkill-worker" and harness not in MULTIPROCESS:
        pytest.skip("no worker process to kill")
    if harness == "async-forkserver" and sys.platform != "linux":
        pytest.skip("forkserver is for POSIX")
    directory = str(tmp_path)
    code, workers, ready, stderr = run_case(directory, harness, ending)
    # no process warned that it could not write a ledger (a worker's SIGTERM cutting into its close() after a
    # Ctrl-C wrote the file a second time, from segments the first close had removed)
    assert "could not write" not in stderr, stderr[-3000:]
    if ending == "sigterm":
        assert code == -signal.SIGTERM  # the trainer still dies of SIGTERM: stepledger changed nothing
    elif ending == "idle-sigkill":
        assert code == -signal.SIGKILL
    elif ending in ("close", "no-close"):
        assert code == 0

    trainer = read(os.path.join(directory, "trainer.npz"))
    envs = read(directory)
    try:
        assert sorted(envs.streams) == list(range(N_ENVS)), os.listdir(directory)
        assert sorted(trainer.streams) == list(range(N_ENVS))
        states = {i: s.meta[S.META_STATE] for i, s in envs.streams.items()}
        if ending == "close":
            assert trainer.meta[S.META_STATE] == S.STATE_CLOSED and set(states.values()) == {S.STATE_CLOSED}
        if ending == "no-close":
            assert trainer.meta[S.META_STATE] == S.STATE_EXIT
        if ending == "sigterm":
            assert trainer.meta[S.META_STATE] == S.STATE_SIGNAL
        for i in range(N_ENVS):
            n_env, n_tr = len(envs.streams[i]), len(trainer.streams[i])
            if ending == "sigkill-worker" and i == N_ENVS - 1:
                # killed without warning: its last periodic spill, at most about one interval old
                assert n_env >= ready, (n_env, ready)
            elif ending == "idle-sigkill":
                # killed without warning, but idle since more than an interval: every event of either side,
                # spilled by each process's idle spiller (there was no step to spill them)
                assert n_env == n_tr and n_tr > ready, (i, n_env, n_tr, ready)
                assert envs.partial and trainer.partial
            else:
                # every process could still act: everything is there, up to the one step in flight
                assert abs(n_env - n_tr) <= 2, (i, n_env, n_tr, states)
                assert n_tr >= (ready or 400)
        # ledgers of one run: the trainer side told the env side its run through the vector env
        assert {s.meta[S.META_RUN] for s in envs.streams.values()} == {trainer.meta[S.META_RUN]}
    finally:
        trainer.close()
        envs.close()

    report = compare(directory, os.path.join(directory, "trainer.npz"))
    assert report.ok, str(report)
    if ending == "close":
        assert report.notes == [], report.notes
    text = str(report)
    assert "differ" in text.splitlines()[0]
    cli = subprocess.run([sys.executable, "-m", "stepledger", "compare", directory,
                          os.path.join(directory, "trainer.npz")], capture_output=True, text=True, env=_env(),
                         timeout=TIMEOUT)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    # nothing half-written is left behind once every writer is gone, but for a killed worker's
    left = [n for n in os.listdir(directory) if S.TMP_INFIX in n or n.endswith(S.LOCK_SUFFIX)]
    if ending not in ("sigkill-worker", "idle-sigkill"):
        assert left == [], left


# ---------------------------------------------------------------- re-runs, runs in progress, run identity

import functools  # noqa: E402
import threading  # noqa: E402
import warnings  # noqa: E402

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

import envs_for_tests as E  # noqa: E402
from stepledger import LedgerEnv, LedgerError, LedgerVectorEnv  # noqa: E402
from stepledger.report.read import leftovers  # noqa: E402

READER = sys.modules["stepledger.read"]  # the module (stepledger.read is also the name of its function)


def count_env(i, directory, interval=None):
    return LedgerEnv(E.CountEnv(length=4), directory, index=i, flush_interval=interval)


def sync_run(directory, n, steps, close=True, interval=None):
    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv(
        [functools.partial(count_env, i, directory, interval) for i in range(n)]),
        os.path.join(directory, "trainer.npz"), flush_interval=interval)
    envs.reset(seed=0)
    for _ in range(steps):
        envs.step(np.zeros(n, np.int64))
    if close:
        envs.close()
    return envs


def cli(*args):
    return subprocess.run([sys.executable, "-m", "stepledger", *args], capture_output=True, text=True, env=_env(),
                          timeout=TIMEOUT)


def test_shorter_rerun_into_the_same_directory(tmp_path):
    d = str(tmp_path)
    sync_run(d, 8, 30)
    sync_run(d, 4, 20)  # the same script again, with fewer envs: env-4..7.npz are the first run's
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok and report.envs == [0, 1, 2, 3], str(report)
    lines = str(report).splitlines()
    assert lines[0] == "0 of 4 envs differ"
    for i in range(4, 8):
        assert any(line.startswith("env-%d.npz is from another run (run " % i) and line.endswith(": not compared")
                   for line in lines), lines
    assert cli("compare", d, os.path.join(d, "trainer.npz")).returncode == 0


def test_compare_while_the_new_run_is_going(tmp_path):
    d = str(tmp_path)
    sync_run(d, 8, 30)
    envs = sync_run(d, 4, 10, close=False, interval=0.05)
    time.sleep(0.1)
    for _ in range(10):
        envs.step(np.zeros(4, np.int64))  # past the interval: everything so far goes to spill segments
    for i in range(4):  # by the steps, or by the idle spiller as soon as a busy machine runs it
        _wait_for(lambda: _spilled(os.path.join(d, "env-%d.npz" % i)), timeout=60)
    _wait_for(lambda: _spilled(os.path.join(d, "trainer.npz")), timeout=60)
    report = compare(d, os.path.join(d, "trainer.npz"))
    text = str(report)
    assert report.ok and report.envs == [0, 1, 2, 3], text  # the new run's, not the old run's 8
    assert "trainer.npz: in progress, last written " in text and "events so far" in text
    assert "env-0.npz, env-1.npz, env-2.npz, env-3.npz in progress" in text
    assert "env-7.npz is from another run" in text
    envs.close()
    done = compare(d, os.path.join(d, "trainer.npz"))
    assert done.ok and not [n for n in done.notes if "in progress" in n]


def _spilled(path):
    """The new run's spill segments are what ``path`` reads as (not the earlier run's closed file)."""
    with read(path) as led:
        return led.partial


def test_compare_at_any_moment_of_a_rerun_finds_no_difference(tmp_path):
    """A shorter run into a directory of a closed run of 8 envs, compared again and again as it starts,
    spills, merges and closes: whatever files stand at that moment (the old run's, the new run's first
    segments on one side only, both), the report is never a difference and never an error."""
    d = str(tmp_path)
    sync_run(d, 8, 30)
    envs = sync_run(d, 4, 0, close=False, interval=0.002)
    seen = set()
    for t in range(300):
        envs.step(np.zeros(4, np.int64))
        if t % 3 == 0:
            try:
                report = compare(d, os.path.join(d, "trainer.npz"))
            except LedgerError as exc:
                envs.close()
                pytest.fail("compare at vector step %d of the re-run: %s" % (t, exc))
            assert report.ok, str(report)
            seen.add(tuple(report.envs))
    envs.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok and report.envs == [0, 1, 2, 3], str(report)
    assert (0, 1, 2, 3) in seen, seen


def _flushed_run(d):
    """A trainer ledger of 2 envs and 5 vector steps in ``d``, flushed to a segment, its recording still open."""
    envs = sync_run(d, 2, 5, close=False)
    envs.flush()
    return envs, os.path.join(d, "trainer.npz")


def test_a_read_between_the_first_spill_of_a_rerun_and_the_removal_of_the_old_file_finds_the_rerun(
        tmp_path, monkeypatch):
    """The reader lists the spill directory (empty), then the re-run's first spill puts its segment there and
    removes the old run's final file, then the reader looks for the final file (gone): it must look again
    and read the re-run, not say "no such file" (seen in CI: compare of a re-run exited with that error)."""
    d = str(tmp_path)
    sync_run(d, 2, 10)
    envs = sync_run(d, 2, 5, close=False)
    path = os.path.join(d, "trainer.npz")
    real, looks = READER._segments, []

    def listing_then_the_writer_moves(p):
        found = real(p)
        if p == path and not looks:
            envs.flush()  # the recording thread's spill: segment written, then the old final file removed
        looks.append(found)
        return found

    monkeypatch.setattr(READER, "_segments", listing_then_the_writer_moves)
    try:
        led = READER.read_ledger(path)
        assert looks[0] == [] and not os.path.exists(path)
        assert led.n_events() == 2 + 2 * 5 and led.partial  # the re-run: 2 resets, 5 vector steps
    finally:
        monkeypatch.setattr(READER, "_segments", real)
        envs.close()
    assert READER.read_ledger(path).n_events() == 12


def test_a_read_between_close_writing_the_final_file_and_removing_the_segments_finds_the_ledger(
        tmp_path, monkeypatch):
    """The other order: the reader lists the segments, close() writes the final file and removes them, the
    reader opens what it listed. It must look again and read the final file."""
    d = str(tmp_path)
    envs, path = _flushed_run(d)
    real, looks = READER._segments, []

    def listing_then_close(p):
        found = real(p)
        if p == path and not looks:
            envs.close()
        looks.append(found)
        return found

    monkeypatch.setattr(READER, "_segments", listing_then_close)
    led = READER.read_ledger(path)
    assert looks[0] and not READER._segments(path) and not led.partial and led.n_events() == 12


def test_env_ledgers_of_an_entirely_different_run_are_refused(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    sync_run(a, 2, 10)
    sync_run(b, 2, 10)
    with pytest.raises(LedgerError, match="are from different runs"):
        compare(a, os.path.join(b, "trainer.npz"))
    proc = cli("compare", a, os.path.join(b, "trainer.npz"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert a in proc.stderr and os.path.join(b, "trainer.npz") in proc.stderr


def test_wrong_index_is_told_by_the_trainer_side(tmp_path):
    d = str(tmp_path)
    fns = [functools.partial(count_env, 1, d), functools.partial(count_env, 0, d)]  # swapped
    with pytest.warns(RuntimeWarning, match=r"LedgerEnv\(index=1\) is env 0 of the trainer's vector env"):
        envs = LedgerVectorEnv(gym.vector.SyncVectorEnv(fns), os.path.join(d, "trainer.npz"))
    envs.reset(seed=0)
    envs.step(np.array([0, 1]))
    envs.close()
    text = str(compare(d, os.path.join(d, "trainer.npz")))
    assert "env-1.npz: its LedgerEnv is env 0 of the trainer's vector env" in text


# ---------------------------------------------------------------- two writers of one ledger

def test_two_ledgers_on_one_index_in_one_process(tmp_path):
    # built after the first recorded: a copy (docs/INDICES.md), which records a file of its own
    first = count_env(0, str(tmp_path))
    first.reset()
    second = count_env(0, str(tmp_path))
    second.reset()
    assert os.path.basename(second.ledger_path).startswith("env-0" + S.COPY_INFIX)
    second.close()
    first.close()
    assert os.path.basename(first.ledger_path) == "env-0.npz"
    count_env(0, str(tmp_path)).close()  # once the first is closed, the path is free again


def test_two_ledgers_built_before_either_records_write_two_files(tmp_path):
    d = str(tmp_path)
    a, b = count_env(0, d), count_env(0, d)  # as a vector env builds its envs, before any reset
    for env in (a, b):
        env.reset()
        env.step(0)
    a.flush()
    with pytest.warns(RuntimeWarning, match="is being recorded by another ledger"):
        b.flush()
    assert os.path.basename(b.ledger_path).startswith("env-0" + S.DUPLICATE_INFIX)
    a.close()
    b.close()
    assert len(read(a.ledger_path).streams[0]) == len(read(b.ledger_path).streams[0]) == 2


def test_two_processes_on_one_index_write_two_files(tmp_path):
    d = str(tmp_path)
    fns = [functools.partial(count_env, 0, d), functools.partial(count_env, 0, d)]
    envs = LedgerVectorEnv(gym.vector.AsyncVectorEnv(fns, context="fork"), os.path.join(d, "trainer.npz"))
    envs.reset(seed=0)
    for _ in range(6):
        envs.step(np.array([0, 1]))
    envs.close()
    names = sorted(os.listdir(d))
    dups = [n for n in names if S.DUPLICATE_INFIX in n]
    assert "env-0.npz" in names and len(dups) == 1, names
    with read(os.path.join(d, "trainer.npz")) as trainer:
        n = len(trainer.streams[0])
        assert n == len(trainer.streams[1]) == 7  # a reset, four steps, the autoreset, one step
    assert len(read(os.path.join(d, dups[0])).streams[0]) == n  # nothing overwritten: both whole
    assert len(read(os.path.join(d, "env-0.npz")).streams[0]) == n
    text = str(compare(d, os.path.join(d, "trainer.npz")))
    assert "%s and env-0.npz both recorded env 0 at the same time" % dups[0] in text
    assert "env 1: recorded only on the trainer side" in text


def test_flush_and_close_from_several_threads(tmp_path):
    env = count_env(0, str(tmp_path))
    env.reset()
    errors = []

    def flusher():
        try:
            for _ in range(30):
                env.flush()
        except Exception as exc:  # pragma: no cover - the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=flusher) for _ in range(3)]
    for t in threads:
        t.start()
    n = 1 + E.step_count_env(env, 3000)
    for t in threads:
        t.join()
    closers = [threading.Thread(target=env.close) for _ in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in closers:
            t.start()
        for t in closers:
            t.join()
    assert not errors, errors
    # the flushes from other threads wrote the file: that is this ledger's own, not another LedgerEnv's
    assert [str(w.message) for w in caught] == []
    with read(env.ledger_path) as led:
        assert len(led.streams[0]) == n and led.meta[S.META_STATE] == S.STATE_CLOSED
    assert os.listdir(str(tmp_path)) == ["env-0.npz"]


# ---------------------------------------------------------------- failing at construction, failing writes

def test_bad_paths_fail_at_construction(tmp_path):
    venv = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
    (tmp_path / "a-file").write_text("x")
    cases = [
        (str(tmp_path), "is a directory; give the ledger's file name"),
        (str(tmp_path / "a-file" / "trainer.npz"), "is a file, not a directory"),
        (str(tmp_path / "a-file" / "sub" / "trainer.npz"), "cannot create the directory"),
    ]
    for path, words in cases:
        with pytest.raises(LedgerError, match=words) as info:
            LedgerVectorEnv(venv, path)
        assert len(str(info.value).splitlines()) == 1 and "LedgerVectorEnv: " in str(info.value)
    with pytest.raises(LedgerError, match="looks like a ledger file"):
        LedgerEnv(gym.make("CartPole-v1"), str(tmp_path / "ledger.npz"), index=0)
    assert not (tmp_path / "ledger.npz").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A real 512 KB filesystem (tmpfs), mounted for the test: writes to it fail for real when it is full."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (%s)" % proc.stderr.strip())
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_read_only_directory_fails_at_construction(small_disk):
    subprocess.run(["mount", "-o", "remount,ro", small_disk], check=True)
    with pytest.raises(LedgerError, match="cannot write in the directory .*Read-only"):
        LedgerEnv(gym.make("CartPole-v1"), small_disk, index=0)


def test_full_disk_warns_once_backs_off_and_loses_nothing(small_disk):
    from stepledger.recording.recording import _RETRY, Recording
    env = count_env(0, small_disk, interval=0.01)
    attempts, retries = [], []  # writes tried on the step path, and by the idle spiller
    original, original_copies = Recording.spill, Recording._spill_copies

    def counting_spill(rec):
        attempts.append(time.monotonic())
        return original(rec)

    def counting_copies(rec):
        retries.append(time.monotonic())
        return original_copies(rec)

    filler = os.path.join(small_disk, "filler")
    with open(filler, "wb", buffering=0) as f:  # the disk is full before the first write
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    Recording.spill, Recording._spill_copies = counting_spill, counting_copies
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env.reset()
            n, started = 1, time.monotonic()
            # 1.5 s or a ledger that fits the disk once it has room, and 1000 steps however long they take
            while (time.monotonic() - started < 1.5 and n < 6000) or n < 1000:
                time.sleep(0.0002)
                n += E.step_count_env(env)
            elapsed = time.monotonic() - started
    finally:
        Recording.spill, Recording._spill_copies = original, original_copies
    full = [w for w in caught if "cannot write the ledger" in str(w.message)]
    assert len(full) == 1 and env.ledger_path in str(full[0].message) and "No space left" in str(full[0].message)
    # backed off: of a spill due every 10 ms, not one try a step but the first and one at each retry time of the
    # back-off schedule within the time the steps took (two in 1.5 s), however long that was. The idle spiller
    # makes the retries off the step path when it wakes first; on a busy machine a step may find one due
    # before it does, or make the first try after the spiller's (seen in CI: two on the step path, one by
    # the spiller): two more at the most
    scheduled = 1 + sum(1 for k in range(1, len(_RETRY) + 1) if sum(_RETRY[:k]) <= elapsed)
    assert 1 <= len(attempts) + len(retries) <= scheduled + 2, (attempts, retries, elapsed)
    assert not [p for p in os.listdir(small_disk) if S.TMP_INFIX in p]  # a failed write leaves nothing
    os.unlink(filler)  # space again: close writes every event, none was lost
    env.close()
    with read(env.ledger_path) as led:
        assert len(led.streams[0]) == n


def test_leftovers_are_listed_then_removed_by_the_next_writer(tmp_path):
    d = str(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    tmp = os.path.join(d, "env-0.npz%s%s-0badc0de" % (S.TMP_INFIX, dead))
    with open(tmp, "wb") as f:
        f.write(b"PK\x03\x04 cut short")
    with open(os.path.join(d, "env-0.npz" + S.LOCK_SUFFIX), "w") as f:
        json.dump({"pid": int(dead), "host": os.uname().nodename, "writer": "0" * 16}, f)
    found = dict(leftovers(d))
    assert "a write cut short" in found[os.path.basename(tmp)]
    assert "which is gone" in found["env-0.npz" + S.LOCK_SUFFIX]
    other = count_env(1, d)  # another env's ledger, so that the directory has one to show
    other.reset()
    other.close()
    show = cli("show", d)
    assert show.returncode == 0 and "not a ledger: %s (a write cut short" % os.path.basename(tmp) in show.stdout
    assert "not a ledger: env-0.npz.lock (left by process %s, which is gone" % dead in show.stdout
    assert [n for n in read(d).streams] == [1]  # neither is ever read as a ledger
    env = count_env(0, d)
    env.reset()
    env.step(0)
    env.close()
    assert sorted(os.listdir(d)) == ["env-0.npz", "env-1.npz"]


# ---------------------------------------------------------------- spills while a process is idle

import math  # noqa: E402

from stepledger.recording.recording import Recording  # noqa: E402


class OddShapeEnv(E.CountEnv):
    """CountEnv whose observation has another shape than its space's every 7th step (kept as its encoding)."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return (obs[:2] if self.t % 7 == 3 else obs), reward, terminated, truncated, info


def _lengths(path):
    with read(path) as led:
        assert led.partial
        return [len(s) for s in led.streams.values()]


def _wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within %.0f s" % timeout
        time.sleep(0.01)


def _columns_and_values(path, rows):
    with read(path) as led:
        return {i: (s.columns, s.values, [s.value_rows("obs", k) for k in range(len(s))] if rows else [])
                for i, s in led.streams.items()}


def test_idle_spills_race_with_steps_and_lose_or_repeat_nothing(tmp_path, monkeypatch):
    """Steps in bursts with pauses longer than the interval: the idle spiller writes in every pause, and the
    steps that follow append while it copies and writes. Every ledger ends as one recorded with no spill."""
    idle_writes = []
    original = Recording._spill_copies

    def counting(rec):
        idle_writes.append(rec.path)
        return original(rec)

    monkeypatch.setattr(Recording, "_spill_copies", counting)
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns often: the idle spiller copies in the middle of steps
    try:
        finals = _record_in_bursts(tmp_path, 1000)
        assert len(idle_writes) > 20, len(idle_writes)
        _same_ledgers(finals["idle"], finals["reference"])
        # and with the idle spiller never waiting for the steps to stop: it copies and writes all the time,
        # while the steps append (events and kept values), grow the buffers and spill
        del idle_writes[:]
        finals = _record_in_bursts(tmp_path / "always", 300, always=True)
        assert len(idle_writes) > 100, len(idle_writes)
        _same_ledgers(finals["idle"], finals["reference"])
    finally:
        sys.setswitchinterval(previous)


def _record_in_bursts(tmp_path, steps, always=False):
    finals = {}
    for name, interval in (("idle", 0.02), ("reference", math.inf)):
        d = str(tmp_path / name)
        envs = LedgerVectorEnv(gym.vector.SyncVectorEnv(
            [functools.partial(lambda i: LedgerEnv(E.CountEnv(length=5 + i), d, index=i, keep_values=True,
                                                   flush_interval=interval), i) for i in range(2)]),
            os.path.join(d, "trainer.npz"), keep_values=True, flush_interval=interval)
        odd = LedgerEnv(OddShapeEnv(length=9), os.path.join(d, "odd"), index=0, keep_values=True,
                        flush_interval=interval)
        if always and name == "idle":
            for rec in [envs.ledger.recording, odd._recording] + [env._recording for env in envs.env.envs]:
                rec.grace = -math.inf  # due at once, always
        envs.reset(seed=0)
        odd.reset()
        n_odd = 1
        pauses = np.random.default_rng(0).uniform(0.0, 0.006, steps)
        for t in range(steps):
            envs.step(np.array([t % 3, (t + 1) % 3]))
            odd.step(t % 3)
            n_odd += 1
            if odd.env.unwrapped.t >= 9:
                odd.reset()
                n_odd += 1
            if t % 25 == 24:
                # idle for about an interval: the idle spiller writes what is in memory, now or as the steps
                # go on again
                time.sleep(0.021 + pauses[t])
            if name == "idle" and t == 599 and not always:
                # idle: everything so far reaches the disk with no step (an interval and a tenth on, or as soon
                # as a busy machine runs the thread), read as a partial ledger
                _wait_for(lambda: _lengths(os.path.join(d, "odd", "env-0.npz")) == [n_odd])
                _wait_for(lambda: _lengths(os.path.join(d, "trainer.npz")) == [t + 2, t + 2])
        envs.close()
        odd.close()
        finals[name] = {p: _columns_and_values(os.path.join(d, p), rows=p.startswith("odd"))
                        for p in ("trainer.npz", "env-0.npz", "env-1.npz", "odd/env-0.npz")}
    return finals


def _same_ledgers(got, expected):
    for p, streams in got.items():
        _same_ledgers_of(streams, expected[p], p)
    odd_shapes = [r[0].shape for r in got["odd/env-0.npz"][0][2] if r is not None]
    assert (2,) in odd_shapes and (3,) in odd_shapes  # values of another shape went through the idle spills too



@pytest.mark.parametrize("writer", ["flush", "idle spiller"])
def test_a_merge_that_fails_after_its_segment_is_written_loses_and_repeats_nothing(tmp_path, monkeypatch, writer):
    """A spill writes its segment, then merges the last segments; when the merge fails (here: a segment
    that cannot be read back, as a race in numpy's header parser once made happen in CI), the segment
    already holds its events. The retry must not write them again, and nothing may be lost."""
    from stepledger.format import local
    from stepledger.recording import recording
    failing = {"on": False, "merges": 0}
    original = recording.segment_from_file

    def unreadable(path):
        if failing["on"]:
            failing["merges"] += 1
            raise LedgerError("%s: member env_index is not a readable array (injected)" % path)
        return original(path)

    monkeypatch.setattr(recording, "segment_from_file", unreadable)
    finals = {}
    for name in ("failing", "reference"):
        d = str(tmp_path / name)
        env = LedgerEnv(OddShapeEnv(length=9), d, index=0, keep_values=True, flush_interval=math.inf)
        rec = env._recording
        rec.grace = -math.inf  # the idle spiller's way in: due at once
        env.reset()
        n, errors = 1, []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for spill in range(3 * local.MERGE):
                for t in range(5):
                    env.step(t % 3)
                    n += 1
                    if env.env.unwrapped.t >= 9:
                        env.reset()
                        n += 1
                # the merges of the first eight segments fail, later ones succeed
                failing["on"] = name == "failing" and spill < local.MERGE + 3
                try:
                    env.flush() if writer == "flush" else rec.idle_spill()
                except LedgerError as exc:
                    errors.append(str(exc))
                failing["on"] = False
        env.close()
        if name == "failing":
            assert failing["merges"] > 0
            if writer == "flush":  # flush() says so, naming the ledger, as one line
                assert errors and all(env.ledger_path in e and "\n" not in e for e in errors), errors
            else:  # the idle spiller warns once, then says when it writes again
                said = [str(w.message) for w in caught if env.ledger_path in str(w.message)]
                assert any("cannot write the ledger" in s for s in said), said
                assert any("is being written again" in s for s in said), said
        finals[name] = {"env-0.npz": _columns_and_values(os.path.join(d, "env-0.npz"), rows=True)}
    got, ref = finals["failing"]["env-0.npz"], finals["reference"]["env-0.npz"]
    assert len(got[0][0]["kind"]) == len(ref[0][0]["kind"]) == n
    _same_ledgers_of(got, ref)


def _same_ledgers_of(streams, ref, p="env-0.npz"):
    assert sorted(streams) == sorted(ref)
    for i in streams:
        cols, values, rows = streams[i]
        rcols, rvalues, rrows = ref[i]
        for name in cols:
            assert np.array_equal(cols[name], rcols[name]), (p, i, name)
        assert sorted(values) == sorted(rvalues) and values
        for name in values:
            assert np.array_equal(values[name], rvalues[name]), (p, i, name)
        assert len(rows) == len(rrows)
        for a, b in zip(rows, rrows):
            assert (a is None) == (b is None) and (a is None or all(np.array_equal(x, y) for x, y in zip(a, b)))


_LIFECYCLE = """
import os, sys, threading, time
import gymnasium as gym
import envs_for_tests as E
from stepledger import LedgerEnv

def spiller():
    return [t for t in threading.enumerate() if t.name == "stepledger-idle-spill"]

def within(condition, timeout=60.0):  # as soon as the thread has run, however busy the machine
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()

d = sys.argv[1]
built = LedgerEnv(E.CountEnv(), d, index=0, flush_interval=0.05)  # built for its spaces, records nothing
time.sleep(0.2)
print("before the first event", len(spiller()))
env = LedgerEnv(E.CountEnv(), d, index=1, flush_interval=0.05)
env.reset()
print("after it", len(spiller()), all(t.daemon for t in spiller()))
print("idle", within(lambda: os.path.isdir(os.path.join(d, "env-1.npz.spill"))))
env.close()
built.close()
stat = os.stat(os.path.join(d, "env-1.npz"))
print("after close", within(lambda: not spiller()))
time.sleep(0.3)
print("then", sorted(os.listdir(d)), os.stat(os.path.join(d, "env-1.npz")) == stat)
env = LedgerEnv(E.CountEnv(), d, index=2, flush_interval=0.05)
env.reset()
env.step(0)
print("again", len(spiller()), within(lambda: os.path.isdir(os.path.join(d, "env-2.npz.spill"))))
"""


def test_the_idle_spiller_starts_at_the_first_event_never_writes_after_close_and_lets_the_process_exit(tmp_path):
    d = str(tmp_path)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _LIFECYCLE, d], capture_output=True, text=True, env=_env(),
                          timeout=TIMEOUT, cwd=d)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "before the first event 0",  # a ledger that records nothing starts no thread (Gymnasium's throwaway env)
        "after it 1 True",
        "idle True",  # spilled with no step
        "after close True",  # closed: the thread is gone
        "then ['env-1.npz'] True",  # and nothing is written after
        "again 1 True",  # the next recording starts it again
    ], proc.stdout + proc.stderr
    assert time.monotonic() - started < TIMEOUT
    with read(os.path.join(d, "env-2.npz")) as led:  # written at exit, the daemon thread did not hold it up
        assert len(led.streams[2]) == 2 and led.meta[S.META_STATE] == S.STATE_EXIT


_FORK_WHILE_SPILLING = """
import functools, os, sys, time
import gymnasium as gym, numpy as np
import envs_for_tests as E
from stepledger import LedgerEnv, LedgerVectorEnv
d = sys.argv[1]
# the trainer's own LedgerEnv records first: its process has an idle spiller when the workers are forked
mine = LedgerEnv(E.CountEnv(length=4), os.path.join(d, "own"), index=0, flush_interval=0.3)
mine.reset()
n = 1 + E.step_count_env(mine, 50)
time.sleep(0.5)  # the idle spiller runs: it is there at the fork
venv = gym.vector.AsyncVectorEnv([functools.partial(LedgerEnv, E.CountEnv(length=3 + i), os.path.join(d, "w"),
                                                    index=i, flush_interval=0.3) for i in range(2)], context="fork")
envs = LedgerVectorEnv(venv, os.path.join(d, "w", "trainer.npz"), flush_interval=0.3)
envs.reset(seed=0)
t0 = time.monotonic()
while time.monotonic() - t0 < 0.8:
    envs.step(np.array([0, 1]))
    n += E.step_count_env(mine)
print("idle", n, envs.ledger.recording.n_events(), os.getpid(), flush=True)
time.sleep(120)
"""


def _writers(led):
    """The pids that wrote the files a ledger was read from."""
    return {p.lf.meta[S.META_PID] for s in led.streams.values() for p in s.pieces}


def test_processes_forked_while_the_idle_spiller_runs_spill_their_own_and_only_theirs(tmp_path):
    d = str(tmp_path)
    proc = subprocess.Popen([sys.executable, "-W", "ignore", "-c", _FORK_WHILE_SPILLING, d], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(), start_new_session=True, cwd=d)
    try:
        n, events, pid = [int(x) for x in _read_line(proc, "idle")]
        # every process idle: each one's idle spiller writes its own ledgers' events (wait for them all,
        # however busy the machine), then the whole group is killed
        H.wait_for(lambda: H.on_disk(os.path.join(d, "own", "env-0.npz")) == {0: n} and
                   sum(H.on_disk(os.path.join(d, "w", "trainer.npz")).values()) == events and
                   sum(H.on_disk(os.path.join(d, "w")).values()) == events, TIMEOUT)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(TIMEOUT)
    finally:
        H.reap(proc)
    with read(os.path.join(d, "own", "env-0.npz")) as led:
        assert led.partial and len(led.streams[0]) == n
        assert _writers(led) == {pid}  # no forked worker wrote the parent's ledger
    with read(os.path.join(d, "w", "trainer.npz")) as trainer, read(os.path.join(d, "w")) as workers:
        assert [len(s) for s in workers.streams.values()] == [len(s) for s in trainer.streams.values()]
        assert pid not in _writers(workers) and len(_writers(workers)) == 2
    report = compare(os.path.join(d, "w"), os.path.join(d, "w", "trainer.npz"))
    assert report.ok, str(report)


# ---------------------------------------------------------------- more of what is left behind, failing writes

_KILLED_WRITER = """
import os, signal, sys
import envs_for_tests as E
from stepledger import LedgerEnv
env = LedgerEnv(E.CountEnv(length=4), sys.argv[1], index=0)
env.reset()
for _ in range(5):
    env.step(0)
env.flush()  # a spill segment, as a periodic spill leaves it
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_clean_rerun_removes_what_a_killed_run_left(tmp_path):
    d = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, d], capture_output=True, text=True, env=_env(),
                          timeout=TIMEOUT, cwd=d)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left = sorted(os.listdir(d))  # and its mapped part, which a kill leaves (empty here: let go of at the spill)
    assert [n for n in left if S.MAP_INFIX not in n] == ["env-0.npz.lock", "env-0.npz.spill"], left
    assert len([n for n in left if n.startswith("env-0.npz" + S.MAP_INFIX)]) == 1, left
    assert "env-0.npz.lock (left by process" in cli("show", d).stdout
    env = count_env(0, d)  # the same script again, which closes this time, with no spill of its own
    env.reset()
    env.step(0)
    env.close()
    assert sorted(os.listdir(d)) == ["env-0.npz"]  # the lock, the stale segment, its directory and map are gone
    show = cli("show", d)
    assert show.returncode == 0 and "not a ledger" not in show.stdout and "2 events" in show.stdout, show.stdout
    with read(d) as led:
        assert len(led.streams[0]) == 2 and not led.partial


def _ancestors(path):
    path = os.path.abspath(path)
    while True:
        yield path
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def test_a_directory_that_cannot_be_written_for_want_of_permission_fails_at_construction(tmp_path):
    d = tmp_path / "theirs"
    d.mkdir()
    code = ("import gymnasium as gym\n"
            "from stepledger import LedgerEnv, LedgerError, LedgerVectorEnv\n"
            "for build in (lambda: LedgerEnv(gym.make('CartPole-v1'), %r, index=0),\n"
            "              lambda: LedgerVectorEnv(gym.vector.SyncVectorEnv([lambda: gym.make('CartPole-v1')]), %r)):\n"
            "    try:\n"
            "        build()\n"
            "    except LedgerError as exc:\n"
            "        print(exc)\n" % (str(d), str(d / "trainer.npz")))
    opened = []  # (directory, its mode) opened for nobody to pass through, restored after
    if os.geteuid() == 0:  # root writes anywhere: try it as nobody, in a directory of root's
        d.chmod(0o755)
        # nobody must pass through every directory above it: pytest's basetemp is root's only (0700), one
        # level further up under pytest-xdist (popen-gwN)
        for p in _ancestors(str(tmp_path)):
            mode = os.stat(p).st_mode
            if not mode & 0o001:
                opened.append((p, mode))
                os.chmod(p, mode | 0o001)
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code]
        # nobody must reach this venv and checkout: a CI clone sits below a mktemp -d only root may enter
        import stepledger
        for top in (sys.prefix, os.path.dirname(os.path.dirname(os.path.abspath(stepledger.__file__)))):
            for p in _ancestors(top):
                mode = os.stat(p).st_mode
                if not mode & 0o001:
                    opened.append((p, mode))
                    os.chmod(p, mode | 0o001)
    else:
        d.chmod(0o555)
        argv = [sys.executable, "-c", code]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=TIMEOUT, cwd="/")
    except FileNotFoundError:
        pytest.skip("no setpriv to drop root's rights")
    finally:
        for p, mode in reversed(opened):
            os.chmod(p, mode)
    if "Permission denied" in proc.stderr and "python" in proc.stderr.splitlines()[-1].lower():
        pytest.skip("nobody cannot run this Python: %s" % proc.stderr.strip()[-200:])
    if os.geteuid() == 0 and "ModuleNotFoundError" in proc.stderr:
        # this venv or checkout sits below a directory only root may enter (a mktemp -d, as a CI clone)
        pytest.skip("nobody cannot read this Python's packages: %s" % proc.stderr.strip().splitlines()[-1])
    lines = proc.stdout.splitlines()
    assert lines == ["LedgerEnv: cannot write in the directory %s (Permission denied)" % d,
                     "LedgerVectorEnv: cannot write in the directory %s (Permission denied)" % d], proc.stdout + proc.stderr
    assert os.listdir(str(d)) == []


@pytest.mark.parametrize("spilled", [False, True])
def test_a_close_on_a_full_disk_keeps_the_events_until_there_is_room(small_disk, spilled):
    env = count_env(0, small_disk)
    env.reset()
    n = 1 + E.step_count_env(env, 21)
    if spilled:
        env.flush()  # the lock is taken and a segment written: the final file is what fails
    n += E.step_count_env(env, 19)
    filler = os.path.join(small_disk, "filler")
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    with pytest.raises(LedgerError) as info:
        env.close()
    text = str(info.value)
    assert env.ledger_path in text and "No space left" in text and "\n" not in text
    if spilled:
        assert "call close() again" in text
    os.unlink(filler)
    env.close()  # room again: nothing was lost
    with read(env.ledger_path) as led:
        assert len(led.streams[0]) == n and led.meta[S.META_STATE] == S.STATE_CLOSED
    assert sorted(os.listdir(small_disk)) == ["env-0.npz"]


def test_a_ledger_whose_files_change_under_many_looks_in_a_row_is_read(tmp_path, monkeypatch):
    """The idle spiller merges a ledger's segments every few ms: on a busy machine each of several quick looks
    can list a segment that is gone by its opening (seen: "seg-000062.npz: no such file" from a compare of a
    run with a 2 ms interval). The reader keeps looking, with a growing pause, and reads the ledger."""
    d = str(tmp_path)
    envs, path = _flushed_run(d)
    real, looks = READER._segments, []

    def a_vanished_segment_listed(p):
        found = real(p)
        looks.append(p)
        if p == path and len(looks) <= 12:
            return found + [os.path.join(os.path.dirname(found[0]), "seg-999999.npz")]
        return found

    monkeypatch.setattr(READER, "_segments", a_vanished_segment_listed)
    try:
        assert READER.read_ledger(path).n_events() == 12 and len(looks) > 12
    finally:
        monkeypatch.setattr(READER, "_segments", real)
        envs.close()


def test_a_ledger_that_never_stops_changing_is_refused_in_time(tmp_path, monkeypatch):
    d = str(tmp_path)
    envs, path = _flushed_run(d)
    real = READER._segments
    monkeypatch.setattr(READER, "_segments", lambda p: real(p) + [os.path.join(d, "trainer.npz.spill", "seg-999999.npz")])
    monkeypatch.setattr(READER, "_CHANGING_FOR", 0.3)
    started = time.monotonic()
    try:
        with pytest.raises(LedgerError, match="trainer.npz: keeps changing while it is read"):
            READER.read_ledger(path)
        assert time.monotonic() - started < 30
    finally:
        monkeypatch.setattr(READER, "_segments", real)
        envs.close()


def test_a_damaged_segment_of_a_ledger_with_no_final_file_is_refused_at_once(tmp_path):
    """Looking again is for files that vanish; a segment that is there and damaged is refused on the first look
    (a segments-only ledger has no final file: that absence is not a change under the reader)."""
    d = str(tmp_path)
    envs, path = _flushed_run(d)
    seg = READER._segments(path)[0]
    try:
        with open(seg, "r+b") as f:
            f.seek(0)
            f.write(b"\0" * 64)
        started = time.monotonic()
        with pytest.raises(LedgerError) as info:
            READER.read_ledger(path)
        assert "keeps changing" not in str(info.value) and os.path.basename(seg) in str(info.value)
        assert time.monotonic() - started < 5  # not the 10 s a changing ledger is given
    finally:  # the close would merge the damaged segment: left unwritten
        from stepledger.recording import spiller
        for rec in list(spiller.OPEN.values()):
            if rec.path.startswith(d):
                rec.discard()
