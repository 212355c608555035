"""The digest: BLAKE2b-64 of both cores against hashlib, and digests of values
against an independent encoder written here from docs/FORMAT.md."""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import hashlib
import os
import struct

import numpy as np
import pytest
from gymnasium import spaces as gs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepledger import _fallback
from stepledger.format import schema as S
from stepledger.format.spaces import LeafLayout

try:
    from stepledger import _core
except ImportError:  # pragma: no cover - the compiled core is required in CI
    _core = None

CORES = [pytest.param(_fallback, id="python"),
         pytest.param(_core, id="cython", marks=pytest.mark.skipif(_core is None, reason="core not built"))]
FORMAT_MD = os.path.join(testpaths.ROOT, "docs", "FORMAT.md")


def hashlib64(data):
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


# ---------------------------------------------------------------- BLAKE2b-64

SIZES = [0, 1, 2, 63, 64, 127, 128, 129, 255, 256, 257, 1000, 84 * 84 * 3, 224 * 224 * 3]


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("size", SIZES)
def test_blake2b64_matches_hashlib(core, size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    assert core.blake2b64(data) == hashlib64(data)


@pytest.mark.parametrize("core", CORES)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(min_size=0, max_size=2000))
def test_blake2b64_matches_hashlib_random(core, data):
    assert core.blake2b64(data) == hashlib64(data)


@pytest.mark.parametrize("core", CORES)
def test_blake2b64_every_size_around_blocks(core):
    data = bytes(range(256)) * 5
    for n in range(0, 700):
        assert core.blake2b64(data[:n]) == hashlib64(data[:n]), n


# ---------------------------------------------------------------- an independent encoder

def enc_leaf(tag, dims, data):
    """One leaf as docs/FORMAT.md defines it, written from the text, not from stepledger."""
    return bytes([len(tag)]) + tag + bytes([len(dims)]) + b"".join(struct.pack("<Q", d) for d in dims) + data


def ref_digest(message):
    return hashlib64(message)


# (name, space, value, message): the test vectors of docs/FORMAT.md
VECTORS = [
    ("box_f32", gs.Box(-5, 5, shape=(3,), dtype=np.float32), np.array([1, 2, 3], dtype=np.float32),
     enc_leaf(b"f4", [3], struct.pack("<3f", 1.0, 2.0, 3.0))),
    ("discrete", gs.Discrete(10), 5,
     enc_leaf(b"i8", [], struct.pack("<q", 5))),
    ("uint8_zeros", gs.Box(0, 255, shape=(2, 2), dtype=np.uint8), np.zeros((2, 2), dtype=np.uint8),
     enc_leaf(b"u1", [2, 2], bytes(4))),
    ("dict", gs.Dict({"b": gs.Discrete(3), "a": gs.Box(-1, 1, shape=(1,), dtype=np.float32)}),
     {"b": 2, "a": np.array([1.0], dtype=np.float32)},
     enc_leaf(b"f4", [1], struct.pack("<f", 1.0)) + enc_leaf(b"i8", [], struct.pack("<q", 2))),
    ("tuple", gs.Tuple((gs.Discrete(3), gs.MultiBinary(3), gs.Box(-1, 1, shape=(), dtype=np.float64))),
     (1, np.array([1, 0, 1], dtype=np.int8), np.float64(-0.5)),
     enc_leaf(b"i8", [], struct.pack("<q", 1)) + enc_leaf(b"i1", [3], bytes([1, 0, 1]))
     + enc_leaf(b"f8", [], struct.pack("<d", -0.5))),
]
# Spaces whose values vary in size (FORMAT.md, section 1).
_I8 = lambda x: enc_leaf(b"i8", [], struct.pack("<q", x))  # noqa: E731
VECTORS += [
    ("text", gs.Text(8), "hé", enc_leaf(b"u1", [3], "hé".encode("utf-8"))),
    ("sequence", gs.Sequence(gs.Box(-5, 5, shape=(2,), dtype=np.float32)),
     (np.array([1, 2], np.float32), np.array([3, 4], np.float32)),
     _I8(2) + enc_leaf(b"f4", [2], struct.pack("<2f", 1, 2)) + enc_leaf(b"f4", [2], struct.pack("<2f", 3, 4))),
    ("sequence_stacked", gs.Sequence(gs.Box(-5, 5, shape=(2,), dtype=np.float32), stack=True),
     np.array([[1, 2], [3, 4]], np.float32),
     _I8(2) + enc_leaf(b"f4", [2, 2], struct.pack("<4f", 1, 2, 3, 4))),
    ("graph", gs.Graph(gs.Box(-5, 5, shape=(1,), dtype=np.float32), gs.Discrete(3)),
     gs.GraphInstance(np.array([[0.5], [1.5]], np.float32), np.array([2]), np.array([[0, 1]])),
     enc_leaf(b"f4", [2, 1], struct.pack("<2f", 0.5, 1.5)) + enc_leaf(b"b1", [], b"\x01")
     + enc_leaf(b"i8", [1], struct.pack("<q", 2)) + enc_leaf(b"i8", [1, 2], struct.pack("<2q", 0, 1))),
    ("graph_no_edges", gs.Graph(gs.Box(-5, 5, shape=(1,), dtype=np.float32), gs.Discrete(3)),
     gs.GraphInstance(np.array([[0.5], [1.5]], np.float32), None, None),
     enc_leaf(b"f4", [2, 1], struct.pack("<2f", 0.5, 1.5)) + enc_leaf(b"b1", [], b"\x00")),
    ("oneof", gs.OneOf((gs.Discrete(3), gs.Text(4))), (1, "ok"), _I8(1) + enc_leaf(b"u1", [2], b"ok")),
]
# The same digests, as written in docs/FORMAT.md: 8 digest bytes (hashlib's hexdigest).
EXPECTED_HEX = {
    "box_f32": "b1f2b2298a47f448",
    "discrete": "7b04f8d122992367",
    "uint8_zeros": "6c1f26cdbefb27cc",
    "dict": "267ace36d62914f0",
    "tuple": "07facb84f909cfcc",
    "text": "8ae6fafaf65533d4",
    "sequence": "365a4aa0f6b34273",
    "sequence_stacked": "a00829be3832a6ba",
    "graph": "e95cc999de604318",
    "graph_no_edges": "51f736bc26568111",
    "oneof": "165bb2e72855872b",
    "missing": "0b712453d2d994a7",
    "invalid": "e867f17f103c5c9b",
}


def core_digest(core, space, value):
    """The digest a LedgerEnv of ``core`` records for ``value`` as an observation."""
    layout = LeafLayout(space)
    buf = core.StreamBuffer()
    core.EventRecorder(buf, layout, layout, True).reset(value)
    return int(buf.columns()["h_obs"][0])


def core_digest_kept(core, space, value):
    """The same through the keep_values path (cast leaves, then digest_leaves)."""
    layout = LeafLayout(space)
    buf = core.StreamBuffer()
    kept = []
    core.EventRecorder(buf, layout, layout, True, keep=lambda o, a: kept.append(o) or False).reset(value)
    return int(buf.columns()["h_obs"][0])


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("name,space,value,message", VECTORS, ids=[v[0] for v in VECTORS])
def test_digest_vectors(core, name, space, value, message):
    expected = ref_digest(message)
    assert hashlib.blake2b(message, digest_size=8).hexdigest() == EXPECTED_HEX[name]
    assert core_digest(core, space, value) == expected
    assert core_digest_kept(core, space, value) == expected
    assert core.digest_leaves(LeafLayout(space).cast(value)) == expected


@pytest.mark.parametrize("name,space,value,message", VECTORS, ids=[v[0] for v in VECTORS])
def test_encoded_values_are_the_digest_message(name, space, value, message):
    # keep_values keeps a value of another shape as this encoding; it decodes to the same leaves
    leaves = LeafLayout(space).cast(value)
    assert _fallback.encode_leaves(leaves) == message
    back = _fallback.decode_leaves(message)
    assert [(a.dtype, a.shape, a.tobytes()) for a in back] == [(np.asarray(b).dtype, np.shape(b), np.asarray(b).tobytes())
                                                              for b in leaves]


def test_decode_refuses_a_damaged_encoding():
    message = VECTORS[0][3]
    for bad in (message[:-1], b"\x02z9\x00" + bytes(8), message[:3]):
        with pytest.raises(ValueError):
            _fallback.decode_leaves(bad)


@pytest.mark.parametrize("core", CORES)
def test_marker_digests(core):
    assert core.MISSING_DIGEST == ref_digest(b"\x00missing") == int.from_bytes(bytes.fromhex(EXPECTED_HEX["missing"]), "little")
    assert core.INVALID_DIGEST == ref_digest(b"\x00invalid") == int.from_bytes(bytes.fromhex(EXPECTED_HEX["invalid"]), "little")
    assert S.MISSING_MESSAGE == b"\x00missing" and S.INVALID_MESSAGE == b"\x00invalid"


def test_vectors_are_in_format_md():
    with open(FORMAT_MD, encoding="utf-8") as f:
        text = f.read()
    for name, hexdigest in EXPECTED_HEX.items():
        assert hexdigest in text, name
        assert "0x%016x" % int.from_bytes(bytes.fromhex(hexdigest), "little") in text, name
    for name, _, _, message in VECTORS:
        assert message.hex() in text, name


# ---------------------------------------------------------------- what the digest does not depend on

BOX = gs.Box(-10, 10, shape=(4, 5), dtype=np.float32)


@pytest.mark.parametrize("core", CORES)
def test_digest_independent_of_memory_layout(core):
    value = np.arange(20, dtype=np.float32).reshape(4, 5) / 7
    expected = core_digest(core, BOX, value)
    fortran = np.asfortranarray(value)
    assert not fortran.flags.c_contiguous
    strided = np.zeros((8, 10), dtype=np.float32)
    strided[::2, ::2] = value
    strided = strided[::2, ::2]
    assert not strided.flags.c_contiguous
    unaligned = np.frombuffer(b"\x00" + value.tobytes(), dtype=np.float32, offset=1).reshape(4, 5)
    for other in (fortran, strided, unaligned, value.T.copy().T):
        assert core_digest(core, BOX, other) == expected
        assert core_digest_kept(core, BOX, other) == expected


@pytest.mark.parametrize("core", CORES)
def test_digest_big_endian_input(core):
    value = np.linspace(-3, 3, 20, dtype=np.float32).reshape(4, 5)
    big = value.astype(">f4")
    assert big.tobytes() != value.tobytes()
    assert core_digest(core, BOX, big) == core_digest(core, BOX, value)
    space = gs.Box(0, 1000, shape=(3,), dtype=np.int64)
    assert core_digest(core, space, np.array([1, 2, 300], dtype=">i8")) == core_digest(core, space, np.array([1, 2, 300]))


@pytest.mark.parametrize("core", CORES)
def test_float64_obs_digests_as_float32(core):
    value = np.random.default_rng(0).normal(size=(4, 5))
    assert core_digest(core, BOX, value) == core_digest(core, BOX, value.astype(np.float32))
    assert core_digest(core, BOX, value.tolist()) == core_digest(core, BOX, value.astype(np.float32))
    # a float16 rounding on the way is not hidden by the cast
    assert core_digest(core, BOX, value.astype(np.float16)) != core_digest(core, BOX, value.astype(np.float32))


@pytest.mark.parametrize("core", CORES)
def test_discrete_forms_digest_alike(core):
    space = gs.Discrete(10)
    expected = ref_digest(enc_leaf(b"i8", [], struct.pack("<q", 7)))
    for value in (7, np.int64(7), np.int32(7), np.uint8(7), np.array(7), np.array(7, dtype=np.int16)):
        assert core_digest(core, space, value) == expected, repr(value)
        assert core_digest_kept(core, space, value) == expected, repr(value)
    # a shape-(1,) array is not a scalar
    assert core_digest(core, space, np.array([7])) == ref_digest(enc_leaf(b"i8", [1], struct.pack("<q", 7)))


@pytest.mark.parametrize("core", CORES)
def test_wrong_shape_digests_differently(core):
    value = np.arange(20, dtype=np.float32).reshape(4, 5)
    right = core_digest(core, BOX, value)
    for wrong in (value.reshape(5, 4), value.reshape(20), value[:3], value[None]):
        d = core_digest(core, BOX, wrong)
        assert d != right
        assert d != core.INVALID_DIGEST
        # digested with its own shape
        assert d == ref_digest(enc_leaf(b"f4", wrong.shape, wrong.astype("<f4").tobytes()))
    space = gs.Box(-1, 1, shape=(), dtype=np.float32)
    assert core_digest(core, space, np.float32(0.5)) == ref_digest(enc_leaf(b"f4", [], struct.pack("<f", 0.5)))
    assert core_digest(core, space, np.array([0.5], np.float32)) != core_digest(core, space, np.float32(0.5))


@pytest.mark.parametrize("core", CORES)
def test_uncastable_value_is_invalid(core):
    cases = [
        (BOX, "not an array"),
        (gs.Discrete(3), None),
        (BOX, {"a": 1}),
        (gs.Discrete(3), "x"),
        (gs.Discrete(3), 2 ** 70),
        (gs.Dict({"a": gs.Discrete(3)}), [1]),
        (gs.Dict({"a": gs.Discrete(3)}), {"b": 1}),
        (gs.Tuple((gs.Discrete(3), gs.Discrete(3))), (1,)),
    ]
    for space, value in cases:
        assert core_digest(core, space, value) == core.INVALID_DIGEST, (space, value)
        assert core_digest_kept(core, space, value) == core.INVALID_DIGEST, (space, value)


# ---------------------------------------------------------------- batches

@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("n", [1, 3, 4, 5, 8, 9, 12, 13, 16, 23])  # eight at a time, four, one: each path
@pytest.mark.parametrize("row_bytes", [0, 1, 7, 100, 115, 116, 117, 128, 243, 244, 245, 500])
def test_digest_rows_equals_each_row(core, n, row_bytes):
    rng = np.random.default_rng(n * 1000 + row_bytes)
    batch = rng.integers(0, 256, (n, row_bytes), dtype=np.uint8)
    out = np.zeros(n, dtype=np.uint64)
    core.digest_rows([batch], out)
    for i in range(n):
        assert int(out[i]) == ref_digest(enc_leaf(b"u1", [row_bytes], batch[i].tobytes()))


@pytest.mark.skipif(_core is None, reason="core not built")
def test_digest_rows_without_avx512_are_the_same(tmp_path):
    """With the eight-lane path turned off ($STEPLEDGER_NO_AVX512) the four-lane one gives the same digests."""
    import subprocess
    import sys
    code = ("import numpy as np, sys\n"
            "from stepledger import _core\n"
            "rng = np.random.default_rng(5)\n"
            "for n in (8, 16, 21):\n"
            "    for width in (3, 40, 300):\n"
            "        batch = rng.integers(0, 256, (n, width), dtype=np.uint8)\n"
            "        out = np.zeros(n, dtype=np.uint64)\n"
            "        _core.digest_rows([batch], out)\n"
            "        print(','.join(str(int(x)) for x in out))\n")
    root = testpaths.ROOT
    runs = []
    for flag in (None, "1"):
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("STEPLEDGER_NO_AVX512", None)
        if flag:
            env["STEPLEDGER_NO_AVX512"] = flag
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        runs.append(proc.stdout)
    assert runs[0] == runs[1]
    rng = np.random.default_rng(5)
    expected = []
    for n in (8, 16, 21):
        for width in (3, 40, 300):
            batch = rng.integers(0, 256, (n, width), dtype=np.uint8)
            expected.append(",".join(str(ref_digest(enc_leaf(b"u1", [width], row.tobytes()))) for row in batch))
    assert runs[0].split() == expected


@pytest.mark.parametrize("core", CORES)
def test_digest_rows_several_leaves(core):
    rng = np.random.default_rng(1)
    n = 9
    leaves = [rng.normal(size=(n, 3)).astype(np.float32), rng.integers(-5, 5, n), rng.integers(0, 2, (n, 2, 2)).astype(np.int8)]
    out = np.zeros(n, dtype=np.uint64)
    core.digest_rows(leaves, out)
    for i in range(n):
        message = (enc_leaf(b"f4", [3], leaves[0][i].tobytes()) + enc_leaf(b"i8", [], leaves[1][i].tobytes())
                   + enc_leaf(b"i1", [2, 2], leaves[2][i].tobytes()))
        assert int(out[i]) == ref_digest(message)
        assert int(out[i]) == core.digest_leaves([leaf[i] for leaf in leaves])


# ---------------------------------------------------------------- reward bits

@pytest.mark.parametrize("core", CORES)
def test_reward_bits(core):
    assert core.reward_bits(1.5, True) == 0x3FC00000
    assert core.reward_bits(1.5, False) == 0x3FF8000000000000
    assert core.reward_bits(-0.0, True) == 0x80000000
    assert core.reward_bits(0.1, True) == struct.unpack("<I", struct.pack("<f", 0.1))[0]
    assert core.reward_bits(0.1, False) == struct.unpack("<Q", struct.pack("<d", 0.1))[0]
    assert core.reward_bits(0.0, True) == 0 and core.reward_bits(0.0, False) == 0
    for bad in ("1.0", None, b"1", [1.0], 10 ** 400):
        assert core.reward_bits(bad, True) == core.INVALID_DIGEST, repr(bad)
