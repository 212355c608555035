"""A dead writer's pid that another process has since been given is not taken for the writer.

Files that name their writer (a lock file, a temporary name, the meta of a ledger file) record its
start time with its pid (stepledger/processes.py). Each test gives such a file the pid of a real
live process (a ``sleep`` this test starts) and either that process's start time (the writer is
alive) or another one (the writer is gone, and its pid was reused): the reader (``show``'s
leftovers, compare's notes) and the next writer of the ledger must tell the two apart.
"""

import json
import os
import subprocess
import sys
import warnings

import pytest

import hostile_ledgers as H
from stepledger import LedgerEnv, compare
from stepledger.format import schema as S
from stepledger.report.read import leftovers

import envs_for_tests as E

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="start times are read from /proc")


def _start_of(pid):
    """Field 22 of /proc/PID/stat, read here on its own (not by the code under test)."""
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


@pytest.fixture
def sleeper():
    """A live process that is not stepledger's: (its pid, its start time)."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc.pid, _start_of(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def _lock(directory, name, pid, start):
    with open(os.path.join(directory, name + S.LOCK_SUFFIX), "w") as f:
        json.dump({S.META_PID: pid, S.META_PID_START: start, S.META_HOST: os.uname().nodename,
                   S.META_WRITER: "0" * 16}, f)


def _record_one(directory, index=0):
    env = LedgerEnv(E.CountEnv(length=4), directory, index=index)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env.reset()
        env.step(0)
        env.close()
    return env.ledger_path, [str(w.message) for w in caught if "stepledger" in str(w.message)]


@pytest.mark.parametrize("reused", [True, False], ids=["pid-reused", "writer-alive"])
def test_a_lock_of_a_reused_pid_is_a_dead_writers(tmp_path, sleeper, reused):
    d = str(tmp_path)
    pid, start = sleeper
    _lock(d, "env-0.npz", pid, start + 1 if reused else start)
    found = dict(leftovers(d))[os.path.basename("env-0.npz" + S.LOCK_SUFFIX)]
    if reused:
        assert found == "left by process %d, which is gone; the next writer of env-0.npz takes it over" % pid
    else:
        assert found == "process %d is recording env-0.npz" % pid
    path, warned = _record_one(d)
    if reused:  # the lock is taken over: the ledger is env-0.npz, the lock gone with its close()
        assert os.path.basename(path) == "env-0.npz" and warned == [], warned
        assert sorted(os.listdir(d)) == ["env-0.npz"]
    else:  # another live recording holds env-0.npz: this one records beside it, and says so
        assert os.path.basename(path).startswith("env-0" + S.DUPLICATE_INFIX), path
        assert len(warned) == 1 and "process %d" % pid in warned[0], warned
        assert os.path.exists(os.path.join(d, "env-0.npz" + S.LOCK_SUFFIX))


@pytest.mark.parametrize("reused", [True, False], ids=["pid-reused", "writer-alive"])
def test_a_temporary_file_of_a_reused_pid_is_removed_by_the_next_writer(tmp_path, sleeper, reused):
    d = str(tmp_path)
    pid, start = sleeper
    # NAME.tmp-{pid}-{start}-{random}: beside the final file and in its spill directory
    tmps = [os.path.join(d, "env-0.npz%s%d-%d-0badc0de" % (S.TMP_INFIX, pid, start + 7 if reused else start)),
            os.path.join(d, "env-0.npz.spill", "seg-000000.npz%s%d-%d-12345678"
                         % (S.TMP_INFIX, pid, start + 7 if reused else start))]
    os.makedirs(os.path.dirname(tmps[1]))
    for tmp in tmps:
        with open(tmp, "wb") as f:
            f.write(b"PK\x03\x04 cut short")
    found = dict(leftovers(d))
    for tmp in tmps:
        why = found[os.path.relpath(tmp, d)]
        if reused:
            assert why.startswith("a write cut short (its process is gone)"), why
        else:
            assert why == "a write in progress (process %d)" % pid
    _record_one(d)
    # the one beside the final file is the next writer's to judge (a spill directory's segments, written
    # whole or cut short, are all an earlier recording's once this one holds the lock: it removes them)
    assert os.path.exists(tmps[0]) is not reused


@pytest.mark.parametrize("reused", [True, False], ids=["pid-reused", "writer-alive"])
def test_compare_does_not_take_a_reused_pid_for_a_recording_in_progress(tmp_path, sleeper, reused):
    """Ledgers written open (a flush, a spill) by processes whose pids now belong to another process."""
    env_dir, trainer = H.record_pair(tmp_path)
    pid, start = sleeper
    for path in H.ledger_files(env_dir, trainer):
        H.edit_meta(path, **{S.META_STATE: S.STATE_OPEN, S.META_PID: pid,
                             S.META_PID_START: start + 1 if reused else start})
    report = compare(env_dir, trainer)
    assert report.ok, str(report)
    text = str(report)
    if reused:
        assert "in progress" not in text, text
        assert "trainer.npz: not closed (its process is gone), last written " in text, text
        assert "env-0.npz, env-1.npz not closed (its process is gone)" in text, text
    else:
        assert "trainer.npz: in progress, last written " in text, text
        assert "env-0.npz, env-1.npz in progress" in text, text
    if reused:  # and a file of an older version, which names no start time: the pid decides, as it did
        for path in H.ledger_files(env_dir, trainer):
            H.edit_meta(path, drop=(S.META_PID_START,))
        assert "env-0.npz, env-1.npz in progress" in str(compare(env_dir, trainer))
