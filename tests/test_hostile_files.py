"""Files that cannot hurt the reader (issue 14): the meta schema, paths that are not regular files,
one way out for every failure of reading, and a reader that never sees a torn file (issue 12, rule 4)."""

import os
import subprocess
import sys

import numpy as np
import pytest

import hostile_ledgers as H
from stepledger import LedgerError, compare, read
from stepledger import _schema as S
from stepledger.cli import main

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


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
