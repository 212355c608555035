"""The layouts in stepledger/_schema.py are the ones the cores and the writer use.

The compiled core takes the live token's offsets, its size and the bytes an
event costs from _schema at import; these tests hold both cores to them by
reading what a core built with _schema's offsets (not its struct format), and
by handing a core tokens whose fields were set one by one at those offsets.
"""

import struct
import zipfile

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces as gs

from stepledger import _fallback as F
from stepledger.format import schema as S
from stepledger import LedgerEnv
from stepledger.format.zipwriter import DEFLATE
from stepledger.format.spaces import LeafLayout

C = pytest.importorskip("stepledger._core")
CORES = pytest.mark.parametrize("core", [C, F], ids=["cython", "python"])

SPACE = gs.Box(-1, 1, shape=(3,), dtype=np.float32)


def _field(token, name):
    """A field of a token, read at _schema's offset and width, little-endian (episode and step signed)."""
    at, width = S.TOKEN_OFFSETS[name], S.TOKEN_WIDTHS[name]
    return int.from_bytes(token[at:at + width], "little", signed=name in ("episode", "step"))


def test_token_layout_is_consistent():
    assert S.TOKEN_SIZE == struct.calcsize(S.TOKEN_FORMAT) == sum(S.TOKEN_WIDTHS.values()) == 55
    assert [name for name, _ in S.TOKEN_FIELDS] == list(S.TOKEN_OFFSETS)
    ends = [S.TOKEN_OFFSETS[n] + S.TOKEN_WIDTHS[n] for n in S.TOKEN_OFFSETS]
    assert list(S.TOKEN_OFFSETS.values())[1:] == ends[:-1]  # fields follow each other with no gap
    assert ends[-1] == S.TOKEN_SIZE


def test_compiled_core_was_built_from_schema():
    assert C.COMPILED_LAYOUT == {"size": S.TOKEN_SIZE, "offsets": S.TOKEN_OFFSETS, "widths": S.TOKEN_WIDTHS,
                                 "terminated": S.TOKEN_TERMINATED, "truncated": S.TOKEN_TRUNCATED}


@CORES
def test_token_a_core_builds_reads_at_schema_offsets(core):
    layout = LeafLayout(SPACE)
    buf = core.StreamBuffer()
    rec = core.EventRecorder(buf, layout, layout, True)
    obs = np.array([0.5, -0.25, 0.125], dtype=np.float32)
    rec.reset(obs)
    rec.step(obs, obs, 1.5, False, False)
    rec.step(obs, obs, -2.0, False, True)
    token = rec.token(70000)  # an index wider than two bytes
    assert isinstance(token, bytes) and len(token) == S.TOKEN_SIZE
    cols = buf.columns()
    assert _field(token, "version") == S.TOKEN_VERSION
    assert _field(token, "index") == 70000
    assert _field(token, "counter") == 2
    assert (_field(token, "episode"), _field(token, "step")) == (0, 2)
    assert _field(token, "kind") == S.KIND_STEP == cols["kind"][-1]
    assert _field(token, "h_obs") == cols["h_obs"][-1]
    assert _field(token, "h_act") == cols["h_act"][-1]
    assert _field(token, "h_rew") == cols["h_rew"][-1] == F.reward_bits(-2.0, True)
    assert _field(token, "flags") == S.TOKEN_TRUNCATED
    assert struct.unpack(S.TOKEN_FORMAT, token) == tuple(_field(token, n) for n, _ in S.TOKEN_FIELDS)
    rec.step(obs, obs, 0.0, True, False)
    assert _field(rec.token(0), "flags") == S.TOKEN_TERMINATED


def _checked_recorder(core):
    layout = LeafLayout(SPACE)
    rec = core.VectorRecorder([core.StreamBuffer()], layout, layout, True)
    rec.reset(np.zeros((1, 3), dtype=np.float32))
    rec.actions(np.ones((1, 3), dtype=np.float32))
    rec.step_next(np.full((1, 3), 0.5, dtype=np.float32), np.array([0.25]), np.array([True]), np.array([False]))
    return rec


def _token_of(rec, episode, step):
    kind, h_obs, h_act, h_rew, te, tr = rec.event(0, 0)
    flags = (S.TOKEN_TERMINATED if te else 0) | (S.TOKEN_TRUNCATED if tr else 0)
    values = {"version": S.TOKEN_VERSION, "index": 0, "counter": 1, "episode": episode, "step": step,
              "kind": kind, "h_obs": h_obs, "h_act": h_act, "h_rew": h_rew, "flags": flags}
    out = bytearray(S.TOKEN_SIZE)
    for name, value in values.items():
        at, width = S.TOKEN_OFFSETS[name], S.TOKEN_WIDTHS[name]
        out[at:at + width] = value.to_bytes(width, "little", signed=name in ("episode", "step"))
    return bytes(out)


@CORES
def test_a_core_checks_tokens_at_schema_offsets(core):
    rec = _checked_recorder(core)
    good = _token_of(rec, 3, 7)
    assert rec.check([good]) == []
    assert (int(rec.token_episode[0]), int(rec.token_step[0])) == (3, 7)  # read at their offsets
    for name in S.TOKEN_OFFSETS:
        if name in ("episode", "step"):
            continue  # the position is the env side's, taken as it comes
        bad = bytearray(good)
        bad[S.TOKEN_OFFSETS[name]] ^= 0x04
        assert rec.check([bytes(bad)]) == [(0, 0, bytes(bad))], name
    assert rec.check([good + b"\x00"]) == [(0, 0, good + b"\x00")]  # not TOKEN_SIZE bytes


@CORES
def test_bytes_per_event_is_what_a_core_holds(core):
    assert S.BYTES_PER_EVENT == sum(np.dtype(dt).itemsize for _, dt in S.EVENT_COLUMNS) == 27
    buf = core.StreamBuffer()
    before = core.memory_in_use()
    for k in range(5):
        buf.append(S.KIND_STEP, k, k, k, False, False)
    assert core.memory_in_use() - before == 5 * S.BYTES_PER_EVENT
    assert buf.nbytes == 5 * S.BYTES_PER_EVENT
    cols = buf.columns()
    assert [(name, cols[name].dtype) for name in cols] == [(name, np.dtype(dt)) for name, dt in S.EVENT_COLUMNS]
    assert sum(cols[name].dtype.itemsize for name in cols) == S.BYTES_PER_EVENT
    buf.clear()


@pytest.mark.parametrize("reward_dtype", [np.float32, np.float64])
def test_members_are_deflated_as_schema_says(tmp_path, reward_dtype):
    env = LedgerEnv(gym.make("CartPole-v1"), tmp_path, index=0, reward_dtype=reward_dtype)
    env.reset(seed=0)
    for _ in range(20):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    env.close()
    levels = dict(S.COLUMN_LEVELS[DEFLATE], **dict.fromkeys(
        (S.META_MEMBER, S.STREAM_INDEX_MEMBER, S.STREAM_OFFSETS_MEMBER), S.MEMBER_LEVEL))
    if reward_dtype == np.float64:
        levels[S.FIELD_COLUMNS["reward"]] = S.FLOAT64_REWARD_LEVEL
    with zipfile.ZipFile(tmp_path / "env-0.npz") as z:
        methods = {info.filename[:-len(".npy")]: info.compress_type for info in z.infolist()}
    assert set(methods) == set(levels)
    for name, level in levels.items():
        assert methods[name] == (zipfile.ZIP_STORED if level == 0 else zipfile.ZIP_DEFLATED), name


def test_meta_keys_written_are_schema_keys(tmp_path):
    env = LedgerEnv(gym.make("CartPole-v1"), tmp_path, index=0)
    env.reset(seed=0)
    env.close()
    from stepledger import read
    with read(tmp_path) as ledger:
        meta = ledger.streams[0].meta
    assert set(meta) <= set(S.META)
    assert {k.name for k in S.META_KEYS if "env" in k.required} <= set(meta)
    assert set(S.SETTINGS) <= set(meta)
