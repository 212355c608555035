"""Files that cannot hurt the reader (issue 14): the meta schema, paths that are not regular files,
one way out for every failure of reading, and a reader that never sees a torn file (issue 12, rule 4)."""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import os
import subprocess
import sys

import numpy as np
import pytest

import hostile_ledgers as H
from stepledger import LedgerError, compare, read
from stepledger.format import schema as S
from stepledger.cli.main import main

TESTS_DIR = testpaths.TESTS_DIR


def cli(*args, timeout=60):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(TESTS_DIR), TESTS_DIR]))
    return subprocess.run([sys.executable, "-m", "stepledger", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def assert_refused(proc, *words):
    """Exit 2 with one line on stderr naming the words, nothing on stdout, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def differing(tmp_path_factory):
    """Pairs whose rewards differ and whose observations differ, with kept values."""
    base = tmp_path_factory.mktemp("differing")
    pairs = {}
    for fault in ("reward:zero", "obs:zero"):
        pairs[fault] = H.record_pair(base / fault.replace(":", "-"), keep_values=True, fault=fault)
        assert not compare(*pairs[fault])
    return pairs


def copy_pair(pair, dst):
    import shutil
    shutil.copytree(pair[0], str(dst))
    return str(dst), os.path.join(str(dst), "trainer.npz")


# ---------------------------------------------------------------- the meta schema

@pytest.mark.parametrize("key,fault", [("reward_dtype", "reward:zero"), ("observation_space", "obs:zero"),
                                       ("action_space", "obs:zero"), ("side", "obs:zero"),
                                       ("keep_values", "obs:zero"), ("format_version", "obs:zero")])
def test_key_missing_on_both_sides_is_refused_naming_file_and_key(differing, tmp_path, key, fault):
    env_dir, trainer = copy_pair(differing[fault], tmp_path / "pair")
    for path in H.ledger_files(env_dir, trainer):
        H.edit_meta(path, drop=(key,))
    with pytest.raises(LedgerError) as info:
        compare(env_dir, trainer)
    assert key in str(info.value) and "env-0.npz" in str(info.value)
    line = assert_refused(cli("compare", env_dir, trainer), key, "env-0.npz")
    assert "is missing" in line
    assert_refused(cli("show", trainer), key, "trainer.npz")


@pytest.mark.parametrize("value", [None, [], {}, True, "Box", {"type": "Box"}, {"type": "Nope"},
                                   {"type": "Box", "shape": [3], "dtype": "object"},
                                   {"type": "Box", "shape": [-3], "dtype": "float32"},
                                   {"type": "Dict", "spaces": []}, {"type": "Tuple", "spaces": [None]},
                                   {"type": "Discrete", "n": 0}, {"type": "Discrete", "n": 2.5}])
def test_bad_observation_space_on_both_sides(differing, tmp_path, value):
    env_dir, trainer = copy_pair(differing["obs:zero"], tmp_path / "pair")
    for path in H.ledger_files(env_dir, trainer):
        H.edit_meta(path, observation_space=value)
    with pytest.raises(LedgerError) as info:
        compare(env_dir, trainer)
    assert "observation_space" in str(info.value) and "env-0.npz" in str(info.value)
    assert_refused(cli("compare", env_dir, trainer), "observation_space")


@pytest.mark.parametrize("key,value,words", [
    ("reward_dtype", "float16", ("reward_dtype", "float16")),
    ("reward_dtype", 32, ("reward_dtype", "a string")),
    ("side", "both", ("side",)),
    ("keep_values", "yes", ("keep_values",)),
    ("segment", -1, ("segment", "at least 0")),
    ("version", None, ("version",)),
    ("format_version", True, ("format_version", "an integer")),
    ("format_version", 0, ("format_version", "at least 1")),
])
def test_wrong_type_or_out_of_range(differing, tmp_path, key, value, words):
    env_dir, trainer = copy_pair(differing["reward:zero"], tmp_path / "pair")
    H.edit_meta(trainer, **{key: value})
    with pytest.raises(LedgerError) as info:
        read(trainer)
    message = str(info.value)
    assert "trainer.npz" in message and "\n" not in message
    for w in words:
        assert w in message, message


def test_meta_that_is_not_an_object_or_too_deep(differing, tmp_path):
    env_dir, trainer = copy_pair(differing["reward:zero"], tmp_path / "pair")
    good = H.meta_of(trainer)
    for value in ([1, 2], "text", 3, None):
        H.set_meta(trainer, value)
        assert_refused(cli("show", trainer), "trainer.npz", "not a ledger")
    deep = {"type": "Box", "shape": [1], "dtype": "float32"}
    for _ in range(200):
        deep = {"type": "Tuple", "spaces": [deep]}
    H.set_meta(trainer, dict(good, observation_space=deep))
    assert_refused(cli("show", trainer), "observation_space", "nested deeper")
    H.write_members(trainer, [(n, c, H.npy_bytes(np.array("[" * 100000 + "]" * 100000)) if n == "meta.npy" else d)
                              for n, c, d in H.members(trainer)])  # JSON nested too deep for the parser
    assert_refused(cli("show", trainer), "trainer.npz", "JSON")


def test_older_file_without_optional_keys_still_reads(differing, tmp_path):
    env_dir, trainer = copy_pair(differing["reward:zero"], tmp_path / "pair")
    optional = [k.name for k in S.META_KEYS if not k.required]
    assert "autoreset_mode" in optional and "segment" in optional
    H.edit_meta(trainer, drop=optional)
    H.edit_meta(trainer, written_by_a_newer_writer={"any": [1, 2]})  # unknown keys are kept, not refused
    with read(trainer) as led:
        assert led.meta["written_by_a_newer_writer"] == {"any": [1, 2]}
    assert not compare(env_dir, trainer)


def test_schema_is_one_line_a_key():
    names = [k.name for k in S.META_KEYS]
    assert len(names) == len(set(names)) and set(S.META) == set(names)
    for key in S.META_KEYS:
        assert key.type in S.META_TYPES
        assert set(key.required) <= set(S.SIDES)


# ---------------------------------------------------------------- a file replaced while it is read (issue 12, rule 4)

_FLUSHING_WRITER = r"""
import functools, os, sys, time
import gymnasium as gym, numpy as np
import envs_for_tests as E
from stepledger import LedgerEnv, LedgerVectorEnv
directory, seconds = sys.argv[1], float(sys.argv[2])
stop = os.path.join(directory, "stop")
def make(i):
    return LedgerEnv(E.CountEnv(length=50), directory, index=i, keep_values=True)
sync = gym.vector.SyncVectorEnv([functools.partial(make, i) for i in range(4)])
envs = LedgerVectorEnv(sync, os.path.join(directory, "trainer.npz"), keep_values=True)
envs.reset(seed=0)
actions = np.zeros(4, dtype=np.int64)
flushes, end = 0, time.time() + seconds
# for the seconds given at the least, and on until the reader has read enough, five flushes or more (two minutes
# on, with no reader, it gives up)
while (time.time() < end or flushes < 5 or not os.path.exists(stop)) and time.time() < end + 120:
    for _ in range(300 if flushes else 5000):
        envs.step(actions)
    sync.call("flush")
    envs.flush()
    flushes += 1
    if flushes == 1:
        open(os.path.join(directory, "ready"), "w").close()
print(flushes)
envs.close()
"""


def test_reader_never_sees_a_torn_file_while_a_writer_flushes(tmp_path):
    """A writer process flushes both sides in a loop (each flush publishes new files by os.replace) while
    this process reads and compares them over and over: every read must succeed. Before every member was
    read through the descriptor opened first, most of these reads failed ("CRC-32 mismatch", "damaged
    local header", "deflate stream ends early")."""
    import time
    directory = str(tmp_path)
    writer = subprocess.Popen([sys.executable, "-c", _FLUSHING_WRITER, directory, "6"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(TESTS_DIR), TESTS_DIR])))
    try:
        deadline = time.time() + 60
        while not os.path.exists(os.path.join(directory, "ready")):
            assert writer.poll() is None and time.time() < deadline, writer.communicate()
            time.sleep(0.05)
        trainer = os.path.join(directory, "trainer.npz")
        reads = compares = 0
        failures = []
        while writer.poll() is None:
            if min(reads, compares) + len(failures) >= 5:
                open(os.path.join(directory, "stop"), "w").close()  # enough: the writer ends at its next flush
            try:
                with read(trainer) as led:
                    for stream in led.streams.values():
                        stream.columns, stream.values
                reads += 1
                report = compare(directory, trainer)
                compares += 1
                # both sides are flushed at different moments: a stream may stop early, nothing else
                assert all(d.what == "length" for d in report.differences), str(report)
            except LedgerError as exc:
                failures.append(str(exc))
        out, err = writer.communicate(timeout=60)
        assert writer.returncode == 0, err
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    flushes = int(out.strip().splitlines()[-1])
    assert flushes >= 5 and reads >= 5 and compares >= 5, (flushes, reads, compares)
    assert not failures, "%d of %d reads failed, e.g. %s" % (len(failures), reads + len(failures), failures[0])


# ---------------------------------------------------------------- only regular files

@pytest.fixture(scope="module")
def clean_pair(tmp_path_factory):
    return H.record_pair(tmp_path_factory.mktemp("clean"))


def test_device_fifo_and_directory_are_refused_at_once(clean_pair, tmp_path):
    env_dir, trainer = clean_pair
    fifo = str(tmp_path / "fifo.npz")
    os.mkfifo(fifo)
    link = str(tmp_path / "zero.npz")
    os.symlink("/dev/zero", link)
    cases = [("/dev/zero", "a character device"), (link, "a character device"), (fifo, "a FIFO"),
             (str(tmp_path), "no env ledgers"), (env_dir + "/env-0.npz.spill", "no such file")]
    for path, words in cases:
        with pytest.raises(LedgerError) as info:
            read(path)
        assert words in str(info.value) and "\n" not in str(info.value)
        assert_refused(cli("show", path, timeout=20), words)
        # a directory in the trainer file's place is a directory of trainer files (several learners):
        # here the special files in it are each refused, and none is read
        assert_refused(cli("compare", env_dir, path, timeout=20),
                       *(("no trainer ledger there can be read", "a FIFO", "a character device")
                         if path == str(tmp_path) else (words,)))
    os.mkdir(str(tmp_path / "dir.npz"))
    assert_refused(cli("compare", env_dir, str(tmp_path / "dir.npz"), timeout=20), "no trainer ledgers")


def assert_not_read(proc, name, *words):
    """Exit 3: the rest compared and agreeing, one note naming the file that was not read, nothing on stderr."""
    assert proc.returncode == 3 and proc.stderr == "", (proc.returncode, proc.stdout, proc.stderr)
    notes = [line for line in proc.stdout.splitlines() if line.startswith(name + ": not read")]
    assert len(notes) == 1 and all(w in notes[0] for w in words), proc.stdout
    return notes[0]


def test_special_files_inside_an_env_directory(clean_pair, tmp_path):
    import shutil
    env_dir, trainer = copy_pair(clean_pair, tmp_path / "pair")
    # named like env 1's ledger, not one: env 1 is not compared, the others are (exit 3); show still refuses
    os.unlink(os.path.join(env_dir, "env-1.npz"))
    os.mkfifo(os.path.join(env_dir, "env-1.npz"))
    assert_not_read(cli("compare", env_dir, trainer, timeout=20), "env-1.npz", "env 1 is not compared", "a FIFO")
    assert_refused(cli("show", env_dir, timeout=20), "env-1.npz", "a FIFO")
    os.unlink(os.path.join(env_dir, "env-1.npz"))
    os.symlink("/dev/zero", os.path.join(env_dir, "env-1.npz"))
    assert_not_read(cli("compare", env_dir, trainer, timeout=20), "env-1.npz", "character device")
    os.unlink(os.path.join(env_dir, "env-1.npz"))
    os.mkdir(os.path.join(env_dir, "env-1.npz"))
    assert_refused(cli("episodes", env_dir, trainer, timeout=20), "env-1.npz", "is a directory")
    shutil.rmtree(os.path.join(env_dir, "env-1.npz"))
    os.mkdir(os.path.join(env_dir, "env-1.npz.spill"))
    os.mkfifo(os.path.join(env_dir, "env-1.npz.spill", "seg-000000.npz"))
    assert_refused(cli("show", env_dir, timeout=20), "seg-000000.npz", "a FIFO")


def test_unreadable_file_and_directory(clean_pair, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their permissions")
    env_dir, trainer = copy_pair(clean_pair, tmp_path / "pair")
    os.chmod(trainer, 0)
    assert_refused(cli("show", trainer, timeout=20), "trainer.npz", "Permission denied")


def test_damaged_digest_is_not_reported_as_a_difference(tmp_path):
    """compare stops reading at the first difference, before the end of a member where its CRC-32 is
    checked: a flipped byte in a stored digest column must be refused as damage, not reported as a fault."""
    import zipfile
    env_dir, trainer = H.record_pair(tmp_path / "pair", steps=1500)  # members larger than one read
    assert compare(env_dir, trainer)
    with zipfile.ZipFile(trainer) as zf:
        info = zf.getinfo("h_obs.npy")
        assert info.compress_type == zipfile.ZIP_STORED
    data = bytearray(open(trainer, "rb").read())
    n_name, n_extra = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + n_name + n_extra
    header = 10 + int.from_bytes(data[start + 8:start + 10], "little")
    data[start + header + 8 * 3] ^= 0x40  # the obs digest of env 0's fourth event
    open(trainer, "wb").write(bytes(data))
    with pytest.raises(LedgerError) as info:
        compare(env_dir, trainer)
    assert "trainer.npz" in str(info.value) and "h_obs" in str(info.value) and "CRC" in str(info.value)
    assert_refused(cli("compare", env_dir, trainer), "h_obs", "CRC-32")
