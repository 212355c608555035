"""LedgerEnv inside real vector-env workers: AsyncVectorEnv and SB3 SubprocVecEnv,
under fork, forkserver and spawn; and workers killed with SIGKILL."""

import functools
import glob
import math
import multiprocessing as mp
import os
import random
import signal
import time

import numpy as np
import pytest
from gymnasium import spaces as gs
from gymnasium.vector import AsyncVectorEnv

import envs_for_tests as E
from stepledger import LedgerError, read
from stepledger.format import schema as S
from stepledger.format.ledgerfile import LedgerFile
from stepledger.format.spaces import LeafLayout

METHODS = [m for m in ("fork", "forkserver", "spawn") if m in mp.get_all_start_methods()]
BOX3 = gs.Box(-1e6, 1e6, shape=(3,), dtype=np.float32)
LAYOUT = LeafLayout(BOX3)


def obs_digest(episode, t):
    from stepledger import core
    return core.digest_leaves(LAYOUT.cast(E.obs_value(episode, t)))


def expected_kinds(length, n_events, same_step):
    """Kinds of a CountEnv(length) stream: under next-step autoreset every vector step is one event."""
    kinds = [0]
    while len(kinds) < n_events:
        kinds += [1] * length + [0]
    return kinds[:n_events]


def no_temp_files(directory):
    return not [p for p in glob.glob(os.path.join(directory, "**", "*"), recursive=True) if ".tmp-" in p]


def file_bytes(directory):
    return {p: open(p, "rb").read() for p in sorted(glob.glob(os.path.join(directory, "*.npz")))}


def steps_then_close(venv, n, steps, directory):
    """``steps`` steps of action 0 and close(): each env's final file and nothing temporary; the env ledgers."""
    for _ in range(steps):
        venv.step(np.zeros(n, dtype=np.int64))
    venv.close()
    assert sorted(os.listdir(directory)) == ["env-%d.npz" % i for i in range(n)]
    assert no_temp_files(directory)
    return read(directory)


# ---------------------------------------------------------------- normal runs

@pytest.mark.parametrize("method", METHODS)
def test_async_vector_env(tmp_path, method):
    directory = str(tmp_path)
    n, steps = 3, 12
    fns = [functools.partial(E.make_count_env, i, directory, length=3 + i) for i in range(n)]
    envs = AsyncVectorEnv(fns, context=method)
    # nothing written but the workers' mapped parts, made as their ledgers are; the throwaway env-0 built in this
    # process wrote nothing, and its mapped part went with its close
    left = os.listdir(directory)
    assert all(S.MAP_INFIX in name for name in left) and len(left) <= n, left
    assert len([name for name in left if name.startswith("env-0.npz")]) <= 1, left
    envs.reset(seed=0)
    led = steps_then_close(envs, n, steps, directory)
    assert not led.partial and list(led.streams) == list(range(n))
    for i in range(n):
        cols = led.streams[i].columns
        assert cols["kind"].tolist() == expected_kinds(3 + i, 1 + steps, False)
        assert cols["h_obs"][0] == obs_digest(0, 0)

    # Build and close the vector env again, recording nothing: the throwaway
    # env-0 and the workers leave the ledgers as they were.
    before = file_bytes(directory)
    AsyncVectorEnv(fns, context=method).close()
    assert file_bytes(directory) == before


@pytest.mark.parametrize("method", METHODS)
def test_sb3_subproc_vec_env(tmp_path, method):
    from stable_baselines3.common.vec_env import SubprocVecEnv
    directory, n, steps = str(tmp_path), 2, 11
    venv = SubprocVecEnv([functools.partial(E.make_count_env, i, directory, length=4 + i) for i in range(n)],
                         start_method=method)
    venv.reset()
    led = steps_then_close(venv, n, steps, directory)
    for i in range(n):
        length = 4 + i
        # same-step autoreset: each vector step is a step, plus a reset when the episode ends
        n_events = 1 + steps + steps // length
        assert led.streams[i].columns["kind"].tolist() == expected_kinds(length, n_events, True)


# ---------------------------------------------------------------- killed workers

def check_killed_ledger(directory, n, max_events, every=False):
    """After SIGKILL: every complete segment is read, and after them the events of the mapped part (``every``:
    all ``max_events`` of each env), nothing half-written loads."""
    led = read(directory)
    assert led.partial
    for i in range(n):
        path = os.path.join(directory, "env-%d.npz" % i)
        segs = sorted(glob.glob(path + ".spill/seg-*.npz"))
        assert segs, "no spilled segment for env %d" % i
        # A kill during a merge leaves the merged segment next to some of the segments it
        # covers (its meta says which): those are not counted, as the reader does not read them.
        covered, counts, first = set(), {}, {}
        for seg in segs:
            with np.load(seg, allow_pickle=False) as z:  # a segment that exists is complete
                counts[seg] = int(z["offsets"][-1])
                assert z["kind"].shape == (counts[seg],)
            with LedgerFile(seg) as lf:
                first[seg] = lf.meta[S.META_SEGMENT]
                covered.update(range(first[seg] + 1, lf.meta.get(S.META_THROUGH, first[seg]) + 1))
        total = sum(counts[seg] for seg in segs if first[seg] not in covered)
        stream = led.streams[i]
        assert total <= len(stream) <= max_events
        assert len(stream) == max_events or not every, (len(stream), max_events)
        total = len(stream)
        cols = stream.columns
        # the events are the true prefix of what the env gave
        assert cols["kind"].tolist() == expected_kinds(5, total, False)
        for k in (0, total - 1):
            assert cols["h_obs"][k] == obs_digest(int(cols["episode"][k]), int(cols["step"][k]))


@pytest.mark.parametrize("method", METHODS)
def test_async_worker_killed_leaves_readable_spills(tmp_path, method):
    directory = str(tmp_path)
    n, steps = 2, 700
    fns = [functools.partial(E.make_count_env_spilling, i, directory, 4096, length=5) for i in range(n)]
    envs = AsyncVectorEnv(fns, context=method)
    envs.reset()
    for _ in range(steps):
        envs.step(np.zeros(n, dtype=np.int64))
    for p in envs.processes:
        os.kill(p.pid, signal.SIGKILL)
    for p in envs.processes:
        p.join()
    envs.close(terminate=True)
    assert not [f for f in os.listdir(directory) if f.endswith(".npz")]  # no final file: never closed
    check_killed_ledger(directory, n, 1 + steps, every=True)  # each a reset and every step it returned


def test_sb3_worker_killed_leaves_readable_spills(tmp_path):
    from stable_baselines3.common.vec_env import SubprocVecEnv
    directory = str(tmp_path)
    n, steps = 2, 600
    fns = [functools.partial(E.make_count_env_spilling, i, directory, 4096, length=5) for i in range(n)]
    venv = SubprocVecEnv(fns, start_method="fork" if "fork" in METHODS else "spawn")
    venv.reset()
    for _ in range(steps):
        venv.step(np.zeros(n, dtype=np.int64))
    for p in venv.processes:
        os.kill(p.pid, signal.SIGKILL)
        p.join()
    led = read(directory)
    assert led.partial and sorted(led.streams) == [0, 1]
    for i in range(n):
        assert 0 < len(led.streams[i]) <= 1 + steps + steps // 5


def record_forever(directory, memory_limit, started):
    """A worker that records CountEnv steps until it is killed."""
    env = E.make_count_env_spilling(0, directory, memory_limit, length=5)
    env.reset()
    started.set()
    while True:
        _, _, term, trunc, _ = env.step(0)
        if term or trunc:
            env.reset()


def close_big_ledger(directory, started, closed):
    """A worker that flushes a small ledger, records many more events in memory, then
    is killed while it writes the final file (or once it has written it: ``closed``)."""
    from stepledger import LedgerEnv
    from stepledger import core
    core.set_memory_limit(1 << 30)
    # no spill but by memory (none here): however long the appends take, the idle spiller writes no segment
    env = LedgerEnv(E.CountEnv(length=5), directory, index=0, flush_interval=math.inf)
    env.reset()
    for _ in range(9):
        env.step(0)
    env._recording.write()  # the last complete file: 10 events (flush() would write a spill segment)
    buf = env._recording.buffers[0]
    for i in range(BIG):
        buf.append(0 if i % 6 == 0 else 1, i, i, 0, False, False)
    started.set()
    env.close()
    closed.set()
    time.sleep(60)


BIG = 2_000_000


@pytest.mark.parametrize("memory_limit", [4096, 64 * 1024])
def test_killed_at_any_moment(tmp_path, memory_limit):
    """Kill a recording worker at random moments, again and again: what is on disk always reads."""
    ctx = mp.get_context("fork" if "fork" in METHODS else "spawn")
    rng = random.Random(memory_limit)
    for attempt in range(4):
        directory = str(tmp_path / str(attempt))
        started = ctx.Event()
        proc = ctx.Process(target=record_forever, args=(directory, memory_limit, started))
        proc.start()
        assert started.wait(30)
        time.sleep(rng.uniform(0.2, 0.8))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        if not glob.glob(os.path.join(directory, "env-0.npz.spill", "seg-*.npz")):
            continue  # killed before its first segment: nothing to read, and nothing half-written either
        check_killed_ledger(directory, 1, 10 ** 9)


def test_killed_while_writing_the_final_file(tmp_path):
    ctx = mp.get_context("fork" if "fork" in METHODS else "spawn")
    results = set()
    for delay in (0.05, 0.2, 0.4, None):  # seconds into the write; None: once it is written
        directory = str(tmp_path / str(delay))
        started, closed = ctx.Event(), ctx.Event()
        proc = ctx.Process(target=close_big_ledger, args=(directory, started, closed))
        proc.start()
        assert started.wait(60)
        if delay is None:
            assert closed.wait(120)
        else:
            time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        path = os.path.join(directory, "env-0.npz")
        n = len(read(path).streams[0])  # the last complete file is always there and whole
        assert n in (10, 10 + BIG)
        with np.load(path, allow_pickle=False) as z:
            assert z["step"].shape == (n,)
        results.add(n)
        for tmp in glob.glob(path + ".tmp-*"):
            # A write cut short never loads. (A kill between the fsync and the rename leaves a
            # temporary file that is whole: it loads, with every event.)
            try:
                whole = read(tmp)
            except LedgerError:
                continue
            assert len(whole.streams[0]) == 10 + BIG
            whole.close()
    assert results == {10, 10 + BIG}
