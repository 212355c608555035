"""The reader's less common paths: which source it reads when spill segments and a final file of one
recording are both there, kept values across several segments, what it refuses (an env in two files,
a repeated env_index, decreasing offsets) and what a failed write leaves behind (nothing)."""

import os
import shutil
import time

import numpy as np
import pytest

import envs_for_tests as E
from hostile_ledgers import members, npy_bytes, record_pair, write_members
from stepledger import LedgerEnv, LedgerError, compare, read
from stepledger.format import schema as S
from stepledger.format.ledgerfile import Segment, write_ledger
from stepledger.report.read import leftovers


def _count_env(directory, keep_values=False):
    env = LedgerEnv(E.CountEnv(), str(directory), index=0, keep_values=keep_values)
    env.reset()
    return env


def _steps(env, n, truth=None):
    """n more events (steps, and a reset after each 5-step episode); their observations go into truth."""
    for _ in range(n):
        inner = env.env.unwrapped
        if inner.t >= inner.length:
            env.reset()
        else:
            env.step(inner.t % 3)
        if truth is not None:
            truth.append(E.obs_value(inner.episode, inner.t))


def _killed(env):
    """As if the process were killed now: nothing more is written, the files stay as they are (its
    memory is given back, so that the next recordings of this process spill as often as before)."""
    env._recording._release()


def _spill_count(env):
    return env._recording.spills


# ---------------------------------------------------------------- final file or segments

def _write_final(env):
    """The final file as close() writes it, before close() removes the spill segments."""
    env._recording.write()


def test_segments_written_after_a_final_file_are_read_in_its_place(tmp_path, small_memory):
    """One recording: a final file was written, then more events spilled, then the process died.
    The segments hold every event the file holds and more: they are the ledger."""
    env = _count_env(tmp_path)
    _steps(env, 400)
    assert _spill_count(env) >= 1
    _write_final(env)
    with read(env.ledger_path) as led:
        flushed = len(led.streams[0])
        assert not led.partial and flushed == 401
    spills = _spill_count(env)
    _steps(env, 600)
    assert _spill_count(env) > spills
    spilled = env._recording._spilled_events
    _killed(env)
    assert os.path.exists(env.ledger_path) and os.listdir(env.ledger_path + ".spill")
    with read(env.ledger_path) as led:
        assert led.partial and len(led.streams[0]) == spilled > flushed
        assert led.streams[0].columns["kind"][0] == S.KIND_RESET


def test_a_final_file_that_holds_more_than_the_segments_is_read_in_their_place(tmp_path, small_memory):
    """One recording: spilled, then close() wrote everything (the segments and the events in memory) and
    the process died before it removed the segments. The file is the ledger."""
    env = _count_env(tmp_path)
    _steps(env, 300)
    spilled = env._recording._spilled_events
    assert 0 < spilled < 301
    _write_final(env)
    _killed(env)
    assert os.listdir(env.ledger_path + ".spill")
    with read(env.ledger_path) as led:
        assert not led.partial and len(led.streams[0]) == 301 > spilled


def test_a_file_and_segments_that_hold_as_many_events_read_as_the_file(tmp_path, small_memory):
    """A final file written right after a spill: it holds what the segments hold, and is complete."""
    env = _count_env(tmp_path)
    while _spill_count(env) == 0:
        _steps(env, 1)
    _write_final(env)
    _killed(env)
    with read(env.ledger_path) as led:
        assert not led.partial and len(led.streams[0]) == env._recording._spilled_events


def _killed_after_spilling(directory, events):
    env = _count_env(directory)
    _steps(env, events)
    assert _spill_count(env) >= 1
    _killed(env)
    return env.ledger_path, env._recording._spilled_events


def _closed(directory, events):
    env = _count_env(directory)
    _steps(env, events)
    env.close()
    return env.ledger_path


@pytest.mark.parametrize("newer", ["segments", "file"])
def test_of_two_recordings_the_one_that_began_last_is_read(tmp_path, small_memory, newer):
    """A final file and segments of two recordings of one path (copied together: no writer cleaned up
    after the other). The one that began last is the ledger, whichever holds more."""
    a, b = tmp_path / "a", tmp_path / "b"
    if newer == "segments":
        old = _closed(a, 900)  # the longer one
        time.sleep(0.01)
        new, n = _killed_after_spilling(b, 300)
        shutil.copy(old, new)  # the older, longer final file next to the newer segments
        path = new
    else:
        old, _ = _killed_after_spilling(a, 900)
        time.sleep(0.01)
        path = _closed(b, 300)
        shutil.copytree(old + ".spill", path + ".spill")  # the older segments, with more events, next to it
        n = 301
    assert os.path.exists(path) and os.listdir(path + ".spill")
    with read(path) as led:
        assert led.partial == (newer == "segments") and len(led.streams[0]) == n


# ---------------------------------------------------------------- kept values across segments

def test_kept_values_across_several_segments(tmp_path, small_memory):
    env = _count_env(tmp_path, keep_values=True)
    truth = [E.obs_value(0, 0)]
    _steps(env, 900, truth)
    assert _spill_count(env) >= 3
    n = env._recording._spilled_events
    _killed(env)
    with read(env.ledger_path) as led:
        stream = led.streams[0]
        assert led.partial and len(stream.pieces) >= 3 and len(stream) == n
        assert stream.values["values_obs_0"].tolist() == [v.tolist() for v in truth[:n]]
        # one event in each segment, and the first and last of a segment: from the right piece, at the right row
        bounds = np.cumsum([p.stop - p.start for p in stream.pieces])
        for index in sorted({0, n - 1, *(int(b) for b in bounds[:-1]), *(int(b) - 1 for b in bounds[:-1]),
                             int(bounds[1]) + 7}):
            obs = stream.value_rows("obs", index)
            assert obs[0].tolist() == truth[index].tolist(), index
        acts = stream.values["values_act_0"]
        kinds = stream.columns["kind"]
        steps = stream.columns["step"]
        assert acts[kinds == S.KIND_STEP].tolist() == ((steps[kinds == S.KIND_STEP] - 1) % 3).tolist()
        assert stream.value_rows("obs", n) is None  # past the end


def test_kept_values_of_the_second_stream_of_segments(tmp_path, run_python):
    """A trainer ledger's segments hold every env's stream: env 1's rows start after env 0's in each.
    The trainer process is killed (os._exit) after spilling several times: the events since its last spill are
    read from its mapped part, which holds no values (value_rows gives None there)."""
    d = str(tmp_path)
    run_python("import os, numpy as np, gymnasium as gym, envs_for_tests as E\n"
               "from stepledger import LedgerEnv, LedgerVectorEnv, core\n"
               "core.set_memory_limit(4096)\n"
               "envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([lambda i=i: LedgerEnv(E.CountEnv(length=4 + i), "
               "%r, index=i) for i in range(2)]), %r, keep_values=True)\n"
               "envs.reset(seed=0)\n"
               "for t in range(400): envs.step(np.array([t %% 3, (t + 1) %% 3]))\n"
               "os._exit(0)\n" % (d, os.path.join(d, "trainer.npz")))
    with read(os.path.join(d, "trainer.npz")) as tr:
        assert tr.partial
        unkept = 0
        for i in range(2):
            stream = tr.streams[i]
            assert len(stream.pieces) >= 3
            cols = stream.columns
            truth = np.array([E.obs_value(e, t) for e, t in zip(cols["episode"], cols["step"])])
            kept = stream.values["values_obs_0"]
            assert 0 < len(kept) < len(stream), (i, len(kept), len(stream))
            unkept += len(stream) - len(kept)
            assert np.array_equal(kept, truth[:len(kept)]), i
            for index in range(0, len(stream), 37):
                row = stream.value_rows("obs", index)
                if index < len(kept):
                    assert row[0].tolist() == truth[index].tolist(), (i, index)
                else:
                    assert row is None, (i, index)
        assert unkept == tr.meta[S.META_MAPPED]  # those of the events read from the mapped part


# ---------------------------------------------------------------- refusals

def _replace(path, **arrays):
    write_members(path, [(name, ctype, npy_bytes(arrays[name[:-4]]) if name[:-4] in arrays else data)
                         for name, ctype, data in members(path)])


def test_an_env_in_two_files_of_a_directory_is_refused(tmp_path):
    env_dir, trainer = record_pair(tmp_path)
    _replace(os.path.join(env_dir, "env-1.npz"), env_index=np.array([0], np.int64))
    with pytest.raises(LedgerError) as err:
        read(env_dir)
    message = str(err.value)
    assert "\n" not in message and "env 0 " in message and "env-0.npz" in message and "env-1.npz" in message
    with pytest.raises(LedgerError, match="env 0 "):
        compare(env_dir, trainer)


@pytest.mark.parametrize("ids", [[1, 1], [0, 0]])
def test_a_repeated_env_index_is_refused(tmp_path, ids):
    _, trainer = record_pair(tmp_path)
    _replace(trainer, env_index=np.array(ids, np.int64))
    with pytest.raises(LedgerError, match=r"^%s: env_index holds .*repeated env index" % trainer):
        read(trainer)


@pytest.mark.parametrize("how", ["decreasing", "not from 0"])
def test_offsets_that_decrease_or_do_not_start_at_zero_are_refused(tmp_path, how):
    _, trainer = record_pair(tmp_path)
    with read(trainer) as led:
        total = led.n_events()
    offsets = np.array([0, total + 4, total] if how == "decreasing" else [3, 10, total], np.int64)
    _replace(trainer, offsets=offsets)
    with pytest.raises(LedgerError, match=r"^%s: stream offsets " % trainer):
        read(trainer)


# ---------------------------------------------------------------- a failed write leaves nothing

def _good_segment(n):
    cols = {name: np.zeros(n, dtype=dt) for name, dt in S.EVENT_COLUMNS}
    return cols


class _Interrupted:
    """A column whose second chunk is never read: Ctrl-C arrives while the file is written."""

    dtype, shape = np.dtype(np.uint64), (8,)

    def __getitem__(self, key):
        raise KeyboardInterrupt


@pytest.mark.parametrize("failure", ["wrong length", "interrupted"])
def test_a_failed_write_leaves_the_previous_file_and_no_temporary_file(tmp_path, failure):
    _, trainer = record_pair(tmp_path)
    with open(trainer, "rb") as f:
        before = f.read()
    with read(trainer) as led:
        meta = {k: v for k, v in led.meta.items()}
    cols = _good_segment(8)
    if failure == "wrong length":
        cols["h_rew"] = np.zeros(5, np.uint64)  # a column shorter than the others
        expected = LedgerError
    else:
        cols["h_obs"] = _Interrupted()
        expected = KeyboardInterrupt
    with pytest.raises(expected):
        write_ledger(trainer, meta, [0], [Segment({0: cols})])
    assert sorted(os.listdir(tmp_path)) == ["env-0.npz", "env-1.npz", "trainer.npz"]
    assert not [n for n in os.listdir(tmp_path) if S.TMP_INFIX in n]
    assert leftovers(str(tmp_path)) == []
    with open(trainer, "rb") as f:
        assert f.read() == before
