"""LedgerEnv(env, directory) without index=: the index given later, before the first event.

By ``set_index`` (through wrappers with get_wrapper_attr, per env of a vector env with
set_attr("stepledger_index", [...])), or by the trainer side's link (its position in the
vector env), on real Gymnasium Sync/Async vector envs and real SB3 Dummy/Subproc VecEnvs.
Given twice, given after events, never given: each has one defined outcome, and nothing is lost.
"""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import functools
import json
import os
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest

import ending_harness as H
import envs_for_tests as E
from stepledger import LedgerEnv, LedgerError, LedgerVectorEnv, compare, read
from stepledger.format import schema as S

TESTS_DIR = testpaths.TESTS_DIR
TIMEOUT = 120


def _environ():
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, env.get("PYTHONPATH")) if p)
    return env


def cli(*args):
    return subprocess.run([sys.executable, "-m", "stepledger", *args], capture_output=True, text=True,
                          env=_environ(), timeout=TIMEOUT)


def deferred(directory, length=4, **kw):
    """A LedgerEnv given no index (module level: spawn and SB3's workers build it from a partial)."""
    return LedgerEnv(E.CountEnv(length=length), directory, **kw)


def unindexed(directory):
    return sorted(n for n in os.listdir(directory) if n.startswith(S.UNINDEXED_PREFIX))


def env_files(directory):
    return sorted(n for n in os.listdir(directory) if n.startswith("env-") and n.endswith(".npz"))


# ---------------------------------------------------------------- the trainer side's link gives the index

def _gym_run(kind, directory, n, steps, lengths=None, env_kw=None, **trainer_kw):
    lengths = lengths or [4] * n
    fns = [functools.partial(deferred, directory, lengths[i], **(env_kw or {})) for i in range(n)]
    venv = gym.vector.SyncVectorEnv(fns) if kind == "sync" else gym.vector.AsyncVectorEnv(fns, context="fork")
    envs = LedgerVectorEnv(venv, os.path.join(directory, "trainer.npz"), **trainer_kw)
    envs.reset(seed=0)
    for _ in range(steps):
        envs.step(np.zeros(n, np.int64))
    return envs


def _sb3_run(kind, directory, n, steps):
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from stepledger.sb3 import LedgerVecEnv
    fns = [functools.partial(deferred, directory, 3 + i) for i in range(n)]
    venv = DummyVecEnv(fns) if kind == "dummy" else SubprocVecEnv(fns, start_method="fork")
    envs = LedgerVecEnv(venv, os.path.join(directory, "trainer.npz"))
    envs.reset()
    for _ in range(steps):
        envs.step(np.zeros(n, np.int64))
    return envs


@pytest.mark.parametrize("kind", ["sync", "async", "dummy", "subproc"])
def test_the_trainer_sides_link_gives_each_env_its_position(tmp_path, kind):
    if kind in ("dummy", "subproc"):
        pytest.importorskip("stable_baselines3")
    d = str(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning of any kind: nothing is unindexed or mis-indexed
        envs = (_gym_run(kind, d, 3, 12, lengths=[3, 4, 5]) if kind in ("sync", "async") else _sb3_run(kind, d, 3, 12))
        if kind == "sync":
            assert envs.env.get_attr("stepledger_index") == (0, 1, 2)
        envs.close()
    assert env_files(d) == ["env-0.npz", "env-1.npz", "env-2.npz"], os.listdir(d)
    with read(d) as led:
        for i, stream in led.streams.items():
            assert stream.meta[S.META_POSITION] == i
            assert len(stream) >= 13  # the reset and 12 steps (SB3 adds the resets of its autoresets)
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok and report.notes == [], str(report)


def test_the_streams_are_each_envs_own(tmp_path):
    """Envs of different lengths: a stream filed under another env's index would differ from its first episode end."""
    d = str(tmp_path)
    _gym_run("sync", d, 3, 20, lengths=[2, 3, 7]).close()
    with read(d) as led:
        for i, length in enumerate([2, 3, 7]):
            kind = np.asarray(led.streams[i].columns["kind"])
            assert kind[length + 1] == S.KIND_RESET and not (kind[1: length + 1] == S.KIND_RESET).any()
    assert compare(d, os.path.join(d, "trainer.npz")).ok


# ---------------------------------------------------------------- set_index, and set_attr per env

def test_set_index_through_wrappers(tmp_path):
    d = str(tmp_path)
    env = gym.wrappers.RecordEpisodeStatistics(deferred(d))  # any wrapper outside it
    assert env.get_wrapper_attr("ledger_path") is None  # nothing is named until the index is known
    env.get_wrapper_attr("set_index")(5)
    assert env.get_wrapper_attr("ledger_path") == os.path.join(d, "env-5.npz")
    env.reset(seed=0)
    env.step(0)
    env.close()
    assert env_files(d) == ["env-5.npz"]
    with read(os.path.join(d, "env-5.npz")) as led:
        assert list(led.streams) == [5] and len(led.streams[5]) == 2


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_set_attr_gives_each_env_its_own_index(tmp_path, kind):
    """Global indices, as a runner of several (RLlib's) gives: per env through the vector env's set_attr."""
    d = str(tmp_path)
    fns = [functools.partial(deferred, d, 2 + i) for i in range(3)]
    venv = gym.vector.SyncVectorEnv(fns) if kind == "sync" else gym.vector.AsyncVectorEnv(fns, context="fork")
    venv.set_attr("stepledger_index", [7, 8, 9])
    assert venv.get_attr("stepledger_index") == (7, 8, 9)
    venv.reset(seed=0)
    for _ in range(6):
        venv.step(np.zeros(3, np.int64))
    venv.close()
    assert env_files(d) == ["env-7.npz", "env-8.npz", "env-9.npz"]
    with read(d) as led:
        for k, i in enumerate([7, 8, 9]):  # env 7 is the sub-env of length 2, and so on
            kind_col = np.asarray(led.streams[i].columns["kind"])
            assert kind_col[2 + k + 1] == S.KIND_RESET


def test_call_gives_every_env_the_same_index_and_is_refused_in_one_process(tmp_path):
    d = str(tmp_path)
    one = gym.vector.SyncVectorEnv([functools.partial(deferred, d)])
    one.call("set_index", 4)  # one sub-env: call() is fine
    assert one.get_attr("stepledger_index") == (4,)
    venv = gym.vector.SyncVectorEnv([functools.partial(deferred, d)] * 2)
    with pytest.raises(LedgerError) as info:
        venv.call("set_index", 0)
    msg = str(info.value)
    assert "\n" not in msg and "index 0 is already given to another LedgerEnv" in msg and "env-0.npz" in msg
    one.close()
    venv.close()  # open recordings would stay registered in this process, and be spilled by later tests


def test_call_with_one_index_in_two_worker_processes_is_named_by_compare(tmp_path):
    """AsyncVectorEnv: each worker is a process of its own; the second writer records beside the first."""
    d = str(tmp_path)
    venv = gym.vector.AsyncVectorEnv([functools.partial(deferred, d)] * 2, context="fork")
    venv.call("set_index", 0)
    envs = LedgerVectorEnv(venv, os.path.join(d, "trainer.npz"))
    envs.reset(seed=0)
    for _ in range(5):
        envs.step(np.zeros(2, np.int64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        envs.close()
    names = env_files(d)
    assert "env-0.npz" in names and any(S.DUPLICATE_INFIX in n for n in names), names
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert not report.ok  # env 1 has no env-side stream of its own
    assert any("both recorded env 0" in n for n in report.notes), str(report)


# ---------------------------------------------------------------- given twice, given after events

def test_an_index_is_given_once(tmp_path):
    d = str(tmp_path)
    env = deferred(d)
    env.set_index(1)
    env.set_index(1)  # the same again: nothing happens
    with pytest.raises(LedgerError) as info:
        env.set_index(2)
    assert str(info.value) == ("LedgerEnv: set_index(2): this env already has index 1 (from set_index()); an "
                               "env's index is given once")
    fixed = LedgerEnv(E.CountEnv(), d, index=3)
    with pytest.raises(LedgerError, match=r"already has index 3 \(from index=\)"):
        fixed.set_index(0)
    linked = deferred(d)
    linked.stepledger_link = ("run-a", 6)
    with pytest.raises(LedgerError, match=r"already has index 6 \(from the trainer side's link\)"):
        linked.set_index(0)
    for bad in (-1, 1.0, True, "2", None):
        with pytest.raises(ValueError, match="LedgerEnv.set_index: index must be"):
            deferred(d).set_index(bad)
    for e in (env, fixed, linked):
        e.close()
    assert os.listdir(d) == []  # no events, no files


def test_set_index_then_a_link_of_another_position_warns_and_compare_says_so(tmp_path):
    """The explicit index wins over the trainer side's link; the mismatch is not silent."""
    d = str(tmp_path)
    venv = gym.vector.SyncVectorEnv([functools.partial(deferred, d)] * 2)
    venv.set_attr("stepledger_index", [1, 0])  # swapped
    with pytest.warns(RuntimeWarning, match=r"LedgerEnv\(index=1\) is env 0 of the trainer's vector env"):
        envs = LedgerVectorEnv(venv, os.path.join(d, "trainer.npz"))
    envs.reset(seed=0)
    envs.step(np.zeros(2, np.int64))
    envs.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert any("env-1.npz: its LedgerEnv is env 0 of the trainer's vector env" in n for n in report.notes)


def test_set_index_after_events_is_refused_and_the_ledger_is_intact(tmp_path):
    d = str(tmp_path)
    env = deferred(d)
    env.set_index(2)
    env.reset(seed=0)
    env.step(0)
    with pytest.raises(LedgerError) as info:
        env.set_index(3)
    assert str(info.value) == ("LedgerEnv: set_index(3) after this env recorded 2 events as env 2: its index is "
                               "fixed at its first event")
    env.set_index(2)  # the index it has: still nothing happens
    env.step(0)
    env.close()
    with read(os.path.join(d, "env-2.npz")) as led:
        assert len(led.streams[2]) == 3
    # recorded without an index: the refusal names where its events go
    with pytest.warns(RuntimeWarning, match="had no index at its first event"):
        lost = deferred(d)
        lost.reset(seed=0)
    with pytest.raises(LedgerError) as info:
        lost.set_index(0)
    msg = str(info.value)
    assert "\n" not in msg and "without an index" in msg and lost.ledger_path in msg
    lost.close()


# ---------------------------------------------------------------- never given: not lost, and named by compare

def _unlinked_run(directory, indices, steps=9):
    """A trainer-side ledger that cannot reach the env side (a VectorWrapper in between: no link)."""
    fns = [functools.partial(deferred, directory, 3) if i is None else
           functools.partial(E.make_count_env, i, directory, 3) for i in indices]
    envs = LedgerVectorEnv(gym.vector.VectorWrapper(gym.vector.SyncVectorEnv(fns)),
                           os.path.join(directory, "trainer.npz"), autoreset_mode="next_step")
    with pytest.warns(RuntimeWarning, match="had no index at its first event; it records to .*env-unindexed-"):
        envs.reset(seed=0)
    for _ in range(steps):
        envs.step(np.zeros(len(indices), np.int64))
    envs.close()


def test_never_given_is_recorded_apart_and_compare_names_it(tmp_path):
    d = str(tmp_path)
    _unlinked_run(d, [0, None, 2])
    [name] = unindexed(d)
    with read(os.path.join(d, name)) as led:  # a ledger like any other, its events all there
        assert led.side == "env" and list(led.streams) == [0] and len(led.streams[0]) == 10
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert [(x.env, x.what, x.side) for x in report.differences] == [(1, "one_side", "trainer")]
    assert ("%s: recorded by a LedgerEnv that had no index at its first event; its 10 events were not compared; "
            "its first events match the trainer's env 1" % name) in report.notes, report.notes
    out = cli("compare", d, os.path.join(d, "trainer.npz"), "--json")
    assert out.returncode == 1
    assert any(name in n for n in json.loads(out.stdout)["notes"])
    show = cli("show", d)
    assert show.returncode == 0 and name in show.stdout


def test_only_unindexed_ledgers_is_refused_with_one_line(tmp_path):
    d = str(tmp_path)
    _unlinked_run(d, [None, None])
    names = unindexed(d)
    assert len(names) == 2
    out = cli("compare", d, os.path.join(d, "trainer.npz"))
    assert out.returncode == 2 and out.stdout == ""
    line = out.stderr.strip()
    assert "\n" not in line and "no env ledgers with an index" in line and all(n in line for n in names)
    assert "Traceback" not in out.stderr


# ---------------------------------------------------------------- live mode

def test_live_without_index_refuses_before_the_env_is_reset(tmp_path):
    inner = E.CountEnv()
    env = LedgerEnv(inner, str(tmp_path), live=True)
    with pytest.raises(LedgerError, match=r"LedgerEnv\(live=True\) has no index at its first event"):
        env.reset(seed=0)
    assert inner.episode == -1  # the env itself was not reset
    env.set_index(0)
    _, info = env.reset(seed=0)
    assert S.TOKEN_KEY in info
    env.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_live_with_the_index_from_the_link(tmp_path, kind):
    d = str(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # also "events arrive without a live token": the check must be active
        envs = _gym_run(kind, d, 2, 10, env_kw={"live": True}, live=True, on_fault="record")
        assert envs.live_faults == []
        envs.close()
    assert compare(d, os.path.join(d, "trainer.npz")).ok


# ---------------------------------------------------------------- killed runs, re-runs into the same directory

_KILLED = """
import functools, sys, time
import gymnasium as gym, numpy as np
import envs_for_tests as E
from stepledger import LedgerEnv, LedgerVectorEnv
d, linked = sys.argv[1], sys.argv[2] == "linked"
def make(i):
    if i == 0 or linked:
        return LedgerEnv(E.CountEnv(length=5), d, flush_interval=0.3)
    return LedgerEnv(E.CountEnv(length=5), d, index=i, flush_interval=0.3)
venv = gym.vector.AsyncVectorEnv([functools.partial(make, i) for i in range(2)], context="fork")
if not linked:
    venv = gym.vector.VectorWrapper(venv)  # the trainer side cannot reach the env side: env 0 has no index
envs = LedgerVectorEnv(venv, d + "/trainer.npz", flush_interval=0.3, autoreset_mode="next_step")
envs.reset(seed=0)
t0 = time.monotonic()
while True:
    envs.step(np.zeros(2, np.int64))
    if time.monotonic() - t0 > 1.2:
        print("ready", flush=True)
        t0 = float("inf")
    time.sleep(0.001)
"""


def _spilled(directory, how):
    """More than 10 events of each side in the periodic spills: what the kill leaves for the test to read."""
    trainer, envs = H.on_disk(os.path.join(directory, "trainer.npz")), H.on_disk(directory)
    if how == "unlinked":  # env 0's events are in a ledger of their own, named for its process
        names = [n[:-len(".spill")] for n in unindexed(directory) if n.endswith(".spill")]
        envs[0] = sum(H.on_disk(os.path.join(directory, n)).get(0, 0) for n in names)
    return len(trainer) == 2 and all(n > 10 for n in list(trainer.values()) + [envs.get(0, 0), envs.get(1, 0)])


def _run_and_kill(directory, how):
    proc = subprocess.Popen([sys.executable, "-W", "ignore", "-c", _KILLED, directory, how], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_environ(), start_new_session=True)
    try:
        H.kill_group_when_ready(proc, lambda: _spilled(directory, how), TIMEOUT)
    finally:
        H.reap(proc)


def test_a_killed_run_with_indices_from_the_link_is_not_a_difference(tmp_path):
    d = str(tmp_path)
    _run_and_kill(d, "linked")
    with read(d) as led:
        assert sorted(led.streams) == [0, 1] and led.partial  # read from the spilled segments
        assert all(len(s) > 10 for s in led.streams.values())
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, str(report)
    assert cli("compare", d, os.path.join(d, "trainer.npz")).returncode == 0


def test_a_killed_run_keeps_the_events_of_an_env_never_given_an_index(tmp_path):
    d = str(tmp_path)
    _run_and_kill(d, "unlinked")
    left = [n for n in os.listdir(d) if n.startswith(S.UNINDEXED_PREFIX) and not n.endswith(S.LOCK_SUFFIX)
            and S.MAP_INFIX not in n]  # its mapped part is beside it too
    [spill] = left
    assert spill.endswith(".npz.spill"), left  # killed before any final file: only its segments
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert [(x.env, x.what) for x in report.differences] == [(0, "one_side")]
    [note] = [n for n in report.notes if n.startswith(spill[:-len(".spill")])]
    assert "had no index at its first event" in note and "match the trainer's env 0" in note


def test_reruns_into_the_same_directory(tmp_path):
    d = str(tmp_path)
    # run 1: three envs, one of them never given an index (its trainer side could not reach it)
    _unlinked_run(d, [0, None, 2])
    import time
    from stepledger.report.compare import CLOCK_SLACK
    time.sleep(CLOCK_SLACK + 0.2)  # run 1's env side had no run id: it is told apart by its times
    # run 2: two envs, indices from the link; run 1's env-2.npz and its unindexed file stay behind
    _gym_run("sync", d, 2, 7).close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, str(report)
    assert any(n.startswith("env-2.npz is from another run") for n in report.notes), report.notes
    [name] = unindexed(d)
    assert any(n.startswith(name + " is from another run") for n in report.notes), report.notes
    # run 3, same again with the index given by set_attr: still clean, run 2's ledgers replaced
    fns = [functools.partial(deferred, d)] * 2
    venv = gym.vector.SyncVectorEnv(fns)
    venv.set_attr("stepledger_index", [0, 1])
    envs = LedgerVectorEnv(venv, os.path.join(d, "trainer.npz"))
    envs.reset(seed=1)
    for _ in range(3):
        envs.step(np.zeros(2, np.int64))
    envs.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok and report.envs == [0, 1], str(report)


@pytest.mark.parametrize("kind", ["dummy", "subproc"])
def test_sb3_env_method_gives_each_env_its_own_index(tmp_path, kind):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv
    d = str(tmp_path)
    fns = [functools.partial(deferred, d, 2 + i) for i in range(2)]
    venv = DummyVecEnv(fns) if kind == "dummy" else SubprocVecEnv(fns, start_method="fork")
    for i in range(2):
        venv.env_method("set_wrapper_attr", "stepledger_index", 5 + i, indices=[i])
    assert venv.get_attr("stepledger_index") == [5, 6]
    if kind == "dummy":  # (SubprocVecEnv's worker dies of an exception in env_method: SB3 forwards none)
        with pytest.raises(LedgerError, match="already has index 5"):
            venv.env_method("set_index", 9, indices=[0])
    venv.reset()
    for _ in range(4):
        venv.step(np.zeros(2, np.int64))
    venv.close()
    assert env_files(d) == ["env-5.npz", "env-6.npz"]
