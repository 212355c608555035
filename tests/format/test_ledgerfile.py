"""The ledger file: what read() returns, and LedgerError for every kind of bad input."""

import glob
import json
import os
import zipfile

import numpy as np
import pytest

import envs_for_tests as E
import stepledger
from stepledger import LedgerError, read
from stepledger.format import schema as S
from stepledger.format.ledgerfile import LedgerFile


def record(directory, index=0, episodes=3, length=3, last=1, keep_values=False, reward_dtype=np.float32):
    """CountEnv: ``episodes`` full episodes of ``length`` steps, then a reset and ``last`` steps."""
    env = stepledger.LedgerEnv(E.CountEnv(length=length), str(directory), index=index, keep_values=keep_values,
                               reward_dtype=reward_dtype)
    for _ in range(episodes):
        env.reset()
        for a in range(length):
            env.step(a % 3)
    env.reset()
    for a in range(last):
        env.step(a % 3)
    env.close()
    return env.ledger_path


def members(path):
    with np.load(path, allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


def rewrite(path, **changes):
    """Write ``path`` again with some members replaced (None removes one), as np.savez does."""
    m = members(path)
    for k, v in changes.items():
        if v is None:
            m.pop(k)
        else:
            m[k] = v
    os.unlink(path)
    np.savez(path, **m)


def meta_of(path, **changes):
    meta = json.loads(str(members(path)["meta"][()]))
    meta.update(changes)
    return np.array(json.dumps(meta))


def assert_ledger_error(path, fn=None, words=()):
    """``fn`` (default: reading every column of ``path``) raises a one-line LedgerError naming the file."""
    def default():
        led = read(path)
        for stream in led.streams.values():
            stream.columns
            stream.values
    with pytest.raises(LedgerError) as info:
        (fn or default)()
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    for w in words:
        assert w in message, message
    assert info.value.__cause__ is None or isinstance(info.value.__cause__, LedgerError)
    return message


# ---------------------------------------------------------------- reading what was written

def test_read_columns_and_counters(tmp_path):
    path = record(tmp_path, index=3, episodes=2, length=3, last=1)
    assert path == str(tmp_path / "env-3.npz")
    led = read(path)
    assert not led.partial
    assert list(led.streams) == [3]
    cols = led.streams[3].columns
    assert cols["kind"].tolist() == [0, 1, 1, 1, 0, 1, 1, 1, 0, 1]
    assert cols["episode"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert cols["step"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert cols["terminated"].tolist() == [False, False, False, True] * 2 + [False, False]
    assert not cols["truncated"].any()
    assert cols["h_act"][cols["kind"] == 0].tolist() == [S.NO_DIGEST] * 3
    rewards = cols["h_rew"].astype(np.uint32).view(np.float32)
    assert rewards.tolist() == [0.0, 1.5, 2.5, 3.5] * 2 + [0.0, 1.5]
    for name, dt in S.FILE_COLUMNS:
        assert cols[name].dtype == np.dtype(dt)
    m = led.meta
    assert m["format"] == "stepledger" and m["format_version"] == S.FORMAT_VERSION
    assert m["side"] == "env" and m["reward_dtype"] == "float32" and m["keep_values"] is False
    assert m["version"] == stepledger.__version__
    assert m["observation_space"]["type"] == "Box" and m["action_space"] == {"type": "Discrete", "n": 3, "start": 0}
    # the file's own position columns agree with what read() derives
    raw = members(path)
    assert raw["episode"].tolist() == cols["episode"].tolist()
    assert raw["step"].tolist() == cols["step"].tolist()
    assert raw["env_index"].tolist() == [3] and raw["offsets"].tolist() == [0, 10]


def test_read_env_directory(tmp_path):
    for i, n in ((0, 1), (1, 2), (2, 0)):
        record(tmp_path, index=i, episodes=n)
    led = read(tmp_path)
    assert list(led.streams) == [0, 1, 2]
    assert [len(s) for s in led.streams.values()] == [6, 10, 2]
    assert led.streams[1].columns["episode"].max() == 2


def test_read_directory_with_other_settings(tmp_path):
    record(tmp_path, index=0)
    record(tmp_path, index=1, reward_dtype=np.float64)
    assert_ledger_error(tmp_path, words=("env-1.npz", "settings"))


def test_float64_reward_bits(tmp_path):
    path = record(tmp_path, reward_dtype=np.float64)
    led = read(path)
    assert led.meta["reward_dtype"] == "float64"
    assert led.streams[0].columns["h_rew"].view(np.float64)[:4].tolist() == [0.0, 1.5, 2.5, 3.5]


def test_keep_values_members(tmp_path):
    path = record(tmp_path, keep_values=True, episodes=1, length=2, last=0)
    raw = members(path)
    assert raw["values_obs_0"].dtype == np.float32 and raw["values_obs_0"].shape == (4, 3)
    assert raw["values_obs_0"].tolist() == [E.obs_value(e, t).tolist() for e, t in ((0, 0), (0, 1), (0, 2), (1, 0))]
    assert raw["values_act_0"].dtype == np.int64 and raw["values_act_0"].tolist() == [0, 0, 1, 0]
    led = read(path)
    assert led.meta["keep_values"] is True
    assert led.streams[0].value_rows("obs", 2)[0].tolist() == E.obs_value(0, 2).tolist()
    assert set(led.streams[0].values) == {"values_obs_0", "values_act_0"}


def test_np_load_reads_every_ledger_without_pickles(tmp_path):
    record(tmp_path / "a")
    record(tmp_path / "b", keep_values=True)
    E.run_random_episodes(str(tmp_path / "c"), keep_values=True)
    E.run_random_episodes(str(tmp_path / "d"), reward_dtype=np.float64)
    paths = glob.glob(str(tmp_path / "*" / "*.npz"))
    assert len(paths) == 4
    for p in paths:
        with np.load(p, allow_pickle=False) as z:
            for name in z.files:
                assert z[name].dtype != object
        with zipfile.ZipFile(p) as zf:
            assert zf.testzip() is None


def test_member_compression(tmp_path):
    """Digests are stored (they do not compress); flags and counters are deflated."""
    path = record(tmp_path, episodes=50)
    with zipfile.ZipFile(path) as zf:
        kinds = {i.filename[:-4]: i.compress_type for i in zf.infolist()}
    assert kinds["h_obs"] == kinds["h_act"] == zipfile.ZIP_STORED
    for name in ("kind", "terminated", "truncated", "episode", "step", "h_rew", "meta"):
        assert kinds[name] == zipfile.ZIP_DEFLATED, name
    path64 = record(tmp_path / "f64", reward_dtype=np.float64)
    with zipfile.ZipFile(path64) as zf:
        assert zf.getinfo("h_rew.npy").compress_type == zipfile.ZIP_STORED


def test_events_before_first_reset(tmp_path):
    env = stepledger.LedgerEnv(E.CountEnv(length=9), str(tmp_path), index=0)
    env.unwrapped.reset()
    env.step(0)
    env.step(1)
    env.reset()
    env.step(2)
    env.close()
    cols = read(env.ledger_path).streams[0].columns
    assert cols["episode"].tolist() == [-1, -1, 0, 0]
    assert cols["step"].tolist() == [1, 2, 0, 1]


# ---------------------------------------------------------------- bad input

def test_missing_file(tmp_path):
    assert_ledger_error(str(tmp_path / "nope.npz"), words=("no such file",))


def test_directory_without_ledgers(tmp_path):
    (tmp_path / "other.npz").write_bytes(b"")
    assert_ledger_error(str(tmp_path), words=("no env ledgers",))


def test_truncated_file(tmp_path):
    path = record(tmp_path, episodes=20)
    data = open(path, "rb").read()
    for cut in (len(data) // 2, len(data) - 10, 100, 0):
        with open(path, "wb") as f:
            f.write(data[:cut])
        assert_ledger_error(path)


def test_not_a_zip(tmp_path):
    path = tmp_path / "env-0.npz"
    path.write_text("hello\n" * 100)
    assert_ledger_error(str(path))


def compressed_data_span(path, member):
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member + ".npy")
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
    start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
    assert info.compress_type == zipfile.ZIP_DEFLATED
    return start, start + info.compress_size


@pytest.mark.parametrize("member", ["kind", "step", "h_rew", "meta", "values_obs_0"])
def test_corrupted_compressed_member(tmp_path, member):
    path = record(tmp_path, episodes=300, length=7, keep_values=True)
    start, stop = compressed_data_span(path, member)
    data = bytearray(open(path, "rb").read())
    for k in range(start + (stop - start) // 2, min(stop, start + (stop - start) // 2 + 8)):
        data[k] ^= 0x5A
    with open(path, "wb") as f:
        f.write(bytes(data))
    assert_ledger_error(path)


@pytest.mark.parametrize("member", ["h_obs", "h_act"])
def test_corrupted_stored_member(tmp_path, member):
    path = record(tmp_path, episodes=300, length=7)
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member + ".npy")
    assert info.compress_type == zipfile.ZIP_STORED
    data = bytearray(open(path, "rb").read())
    data[info.header_offset + info.compress_size // 2 + 100] ^= 0x01  # one bit in the digests
    with open(path, "wb") as f:
        f.write(bytes(data))
    assert_ledger_error(path, words=(member, "corrupted"))


def test_npz_that_is_no_ledger(tmp_path):
    path = str(tmp_path / "env-0.npz")
    rng = np.random.default_rng(0)
    np.savez(path, a=rng.normal(size=10), b=rng.integers(0, 5, 3))
    assert_ledger_error(path, words=("not a ledger",))
    np.savez(path, meta=np.array("{}"), a=np.zeros(3))
    assert_ledger_error(path, words=("not a ledger",))


class _Trap:
    """Unpickling it would create a directory: proof that something was unpickled."""

    def __init__(self, where):
        self.where = where

    def __reduce__(self):
        return (os.mkdir, (self.where,))


@pytest.mark.parametrize("member", ["h_obs", "kind", "values_obs_0", "extra", "meta"])
def test_member_holding_pickles(tmp_path, member):
    path = record(tmp_path, keep_values=True)
    trap = str(tmp_path / "unpickled")
    n = int(members(path)["offsets"][-1])
    obj = np.empty(n, dtype=object)
    obj[:] = [_Trap(trap)] * n
    if member == "meta":
        obj = np.array(_Trap(trap), dtype=object)
    rewrite(path, **{member: obj})
    try:
        read(path).streams[0].values  # a stray extra member is never opened, so may not raise
    except LedgerError as exc:
        assert "\n" not in str(exc) and path in str(exc)
    if member != "extra":
        assert_ledger_error(path, words=("pickle",) if member != "meta" else ())
    assert not os.path.exists(trap)
    with np.load(path, allow_pickle=True) as z:  # the control: unpickling springs the trap
        z[member]
    assert os.path.isdir(trap)


def test_newer_format_version(tmp_path):
    path = record(tmp_path)
    rewrite(path, meta=meta_of(path, format_version=S.FORMAT_VERSION + 1))
    message = assert_ledger_error(path, words=("newer",))
    assert str(S.FORMAT_VERSION + 1) in message


@pytest.mark.parametrize("bad", [{"format": "other"}, {"format_version": "1"}])
def test_meta_that_is_not_ours(tmp_path, bad):
    path = record(tmp_path)
    rewrite(path, meta=meta_of(path, **bad))
    assert_ledger_error(path)


def test_meta_not_json(tmp_path):
    path = record(tmp_path)
    rewrite(path, meta=np.array("{not json"))
    assert_ledger_error(path, words=("JSON",))
    rewrite(path, meta=np.array([1, 2]))
    assert_ledger_error(path)


@pytest.mark.parametrize("member,dtype", [("h_obs", np.float64), ("kind", np.int64), ("terminated", np.uint8),
                                          ("step", np.int32), ("h_rew", np.int64)])
def test_wrong_column_dtype(tmp_path, member, dtype):
    path = record(tmp_path)
    rewrite(path, **{member: members(path)[member].astype(dtype)})
    assert_ledger_error(path, words=(member,))


def test_wrong_column_length_and_offsets(tmp_path):
    path = record(tmp_path)
    rewrite(path, h_act=members(path)["h_act"][:-1])
    assert_ledger_error(path, words=("h_act",))
    path = record(tmp_path / "b")
    rewrite(path, offsets=np.array([0, 5], dtype=np.int64))
    assert_ledger_error(path)
    path = record(tmp_path / "c")
    rewrite(path, offsets=None)
    assert_ledger_error(path, words=("offsets",))
    for bad in (np.array([[0]]), np.array([0.0]), np.array([-1]), np.array(["a"])):
        path = record(tmp_path / "d")
        rewrite(path, env_index=bad)
        assert_ledger_error(path)


def test_fortran_ordered_member(tmp_path):
    path = record(tmp_path, keep_values=True)
    n = int(members(path)["offsets"][-1])
    rewrite(path, values_obs_0=np.asfortranarray(np.zeros((n, 3), np.float32)))
    assert_ledger_error(path, fn=lambda: LedgerFile(path), words=("Fortran",))


def test_directory_with_an_env_killed_before_its_first_segment(tmp_path):
    record(tmp_path, index=0)
    os.makedirs(str(tmp_path / "env-1.npz.spill"))
    (tmp_path / "env-1.npz.spill" / "seg-000000.npz.tmp-123").write_bytes(b"PK\x03\x04 cut short")
    led = read(str(tmp_path))
    assert list(led.streams) == [0] and not led.partial
