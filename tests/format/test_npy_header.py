"""The reader's own parser of a member's .npy header (ledgerfile._parse_npy_header).

numpy's reader of that header runs ast.literal_eval, which CPython 3.11 can fail with "AST
constructor recursion depth mismatch" when two threads parse at once. The idle spiller and a
recording thread merging segments do just that, and in one CI run a merge failed that way. So the
reader parses the header itself: it must read every header numpy writes as numpy reads it, refuse
what numpy refuses, and never run Python's parser.
"""

import ast
import io
import random
import struct

import gymnasium as gym
import numpy as np
import pytest

import envs_for_tests as E
from stepledger import LedgerEnv, LedgerVectorEnv, compare, read
from stepledger.format.ledgerfile import _parse_npy_header

ARRAYS = [np.zeros(()), np.zeros(5, np.uint8), np.zeros((3, 4), np.float32), np.zeros((0,), np.int64),
          np.zeros((2, 0, 3), "<U7"), np.zeros(3, ">f8"), np.zeros(2, bool), np.zeros((1,), "V8"),
          np.zeros((7, 1, 1, 2), np.uint64), np.zeros(4, np.float16)]
SYMBOLS = b"{}():,[]'\" 0123456789TrueFalsdcp<>|u8f4\x00\xff\n"


def header(arr, version=None):
    b = io.BytesIO()
    np.lib.format.write_array(b, arr, version=version)
    return b.getvalue()[:1024]


def numpys_reading(data):
    """(shape, fortran order, dtype) as numpy reads the header, or None where numpy refuses it."""
    b = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(b)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read_header is None:
            return None
        shape, fortran, dtype = read_header(b, max_header_size=1 << 20)
    except Exception:
        return None
    return tuple(int(d) for d in shape), bool(fortran), dtype


def ours(data):
    try:
        return _parse_npy_header(data)[:3]
    except ValueError:
        return None


@pytest.mark.parametrize("version", [None, (1, 0), (2, 0), (3, 0)])
def test_every_header_numpy_writes_is_read_as_numpy_reads_it(version):
    for arr in ARRAYS:
        data = header(arr, version)
        shape, fortran, dtype, length = _parse_npy_header(data)
        assert (shape, fortran, dtype) == (arr.shape, False, arr.dtype)
        assert data[length - 1:length] == b"\n"  # the header's whole length: the data starts after it
        if version != (3, 0):
            assert numpys_reading(data) == (shape, fortran, dtype)


def test_a_mutated_header_is_read_as_numpy_reads_it_or_refused():
    rng = random.Random(0)
    bases = [header(a) for a in ARRAYS]
    accepted = refused_by_both = 0
    for _ in range(6000):
        data = bytearray(rng.choice(bases))
        length = struct.unpack_from("<H", data, 8)[0]
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(10, 10 + length)] = rng.choice(SYMBOLS)
        data = bytes(data)
        got, expected = ours(data), numpys_reading(data)
        if got is not None:
            assert got == expected, (data, got, expected)  # never another answer than numpy's
            accepted += 1
        elif expected is None:
            refused_by_both += 1
        else:  # stricter than numpy only in what no writer of .npy puts there (u'' and r'' strings)
            text = data[10:10 + length]
            assert b"u'" in text or b"r'" in text or b'u"' in text or b'r"' in text, data
    assert accepted > 20 and refused_by_both > 1000


@pytest.mark.parametrize("text, why", [
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), 'shape': (3, 4), }", "twice"),
    ("{'descr': '<f4', 'fortran_order': False, }", "keys"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), 'x': True}", "keys"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (5), }", "comma"),
    ("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (5,), }", "structured"),
    ("{'descr': '<f4', 'fortran_order': 0, 'shape': (5,), }", "where a value belongs"),
    ("{'descr': True, 'fortran_order': False, 'shape': (5,), }", "wrong type"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), } x", "unexpected"),
    ("{'descr': 'not a dtype', 'fortran_order': False, 'shape': (5,), }", "dtype"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (-5,), }", "unexpected"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (05,), }", "unexpected"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (__import__('os'),), }", "unexpected"),
])
def test_a_bad_header_is_refused_saying_what_is_wrong(text, why):
    raw = text.encode("latin1") + b"\n"
    data = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(raw)) + raw
    with pytest.raises(ValueError, match="bad .npy header") as caught:
        _parse_npy_header(data)
    assert why in str(caught.value)


def test_reading_and_comparing_never_run_pythons_parser(tmp_path, monkeypatch):
    d = str(tmp_path)
    envs = LedgerVectorEnv(gym.vector.SyncVectorEnv(
        [lambda i=i: LedgerEnv(E.CountEnv(length=4 + i), d, index=i, keep_values=True) for i in range(2)]),
        str(tmp_path / "trainer.npz"), keep_values=True)
    envs.reset(seed=0)
    for t in range(20):
        envs.step(np.array([t % 3, 1]))
    envs.close()

    def refused(*args, **kwargs):
        raise AssertionError("the reader ran Python's parser")

    import numpy.ma  # noqa: F401 (imported by the reader on demand; its import evaluates literals itself)
    monkeypatch.setattr(ast, "literal_eval", refused)
    with read(str(tmp_path / "env-1.npz")) as led:
        assert len(led.streams[1]) == 21 and led.streams[1].value_rows("obs", 20) is not None
    report = compare(d, str(tmp_path / "trainer.npz"))
    assert report.ok and report.envs == [0, 1], report
