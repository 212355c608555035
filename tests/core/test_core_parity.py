"""The compiled core and the pure-Python reference give the same digests, the
same reward bits and byte-identical ledger files."""

import os

import numpy as np
import pytest
from gymnasium import spaces as gs

import envs_for_tests as E
from ledger_bytes import same_ledger_bytes
from space_cases import SPACES, VARIABLE, odd_values
from stepledger import _fallback as F
from stepledger.format.spaces import LeafLayout

C = pytest.importorskip("stepledger._core")

def recorded_digests(core, space, values, keep):
    layout = LeafLayout(space)
    buf = core.StreamBuffer()
    rec = core.EventRecorder(buf, layout, layout, True, keep=(lambda o, a: False) if keep else None)
    for v in values:
        rec.reset(v)
        rec.step(v, v, 1.0, False, False)
    cols = buf.columns()
    return cols["h_obs"].tolist(), cols["h_act"].tolist()


@pytest.mark.parametrize("name", sorted(SPACES))
@pytest.mark.parametrize("keep", [False, True], ids=["digest", "keep"])
def test_event_recorder_digests_agree(name, keep):
    space = SPACES[name]
    space.seed(1)
    rng = np.random.default_rng(1)
    values = [v for _ in range(5) for v in odd_values(space, rng)]
    assert recorded_digests(C, space, values, keep) == recorded_digests(F, space, values, keep)


@pytest.mark.parametrize("name", sorted(SPACES))
def test_fast_and_kept_paths_agree(name):
    space = SPACES[name]
    space.seed(2)
    values = odd_values(space, np.random.default_rng(2))
    assert recorded_digests(C, space, values, False) == recorded_digests(C, space, values, True)


@pytest.mark.parametrize("name", sorted(set(SPACES) - set(VARIABLE)))
@pytest.mark.parametrize("n", [1, 4, 7])
def test_digest_leaves_and_rows_agree(name, n):
    space = SPACES[name]
    space.seed(3)
    layout = LeafLayout(space)
    rows = [layout.cast(space.sample()) for _ in range(n)]
    for leaves in rows:
        assert C.digest_leaves(leaves) == F.digest_leaves(leaves)
    batch = [np.stack([r[j] for r in rows]) for j in range(len(layout.leaves))]
    out_c, out_f = np.zeros(n, np.uint64), np.zeros(n, np.uint64)
    C.digest_rows(batch, out_c)
    F.digest_rows(batch, out_f)
    assert out_c.tolist() == out_f.tolist() == [F.digest_leaves(r) for r in rows]


REWARDS = [0.0, -0.0, 1.0, 0.1, -11.843963, 1e-40, 3.4e38, 1e39, float("inf"), float("-inf"), float("nan"),
           np.float32(0.1), np.float64(0.1), np.float16(0.1), np.float32(np.nan), 7, -3, True, 2 ** 60,
           np.int64(5), np.uint8(200), np.array(2.5), np.array(2.5, dtype=np.float32),
           "1.0", b"1.0", None, [1.0], 10 ** 400]


@pytest.mark.parametrize("is_f32", [True, False], ids=["float32", "float64"])
def test_reward_bits_agree(is_f32):
    for r in REWARDS:
        assert C.reward_bits(r, is_f32) == F.reward_bits(r, is_f32), repr(r)
    # a float64 rounds once to float32, to nearest even
    x = 1 + 2 ** -24 + 2 ** -30
    assert C.reward_bits(x, True) == int(np.array(np.float32(x)).view(np.uint32))
    arr = np.array([r for r in REWARDS if isinstance(r, float)])
    assert C.reward_bits_array(arr, is_f32).tolist() == F.reward_bits_array(arr, is_f32).tolist() \
        == [C.reward_bits(r, is_f32) for r in arr]


def test_recorded_rewards_and_flags_agree():
    layout = LeafLayout(gs.Discrete(2))
    out = []
    for core in (C, F):
        for is_f32 in (True, False):
            buf = core.StreamBuffer()
            rec = core.EventRecorder(buf, layout, layout, is_f32)
            rec.reset(0)
            for r in REWARDS:
                rec.step(1, 0, r, np.bool_(True), 1)
                rec.step(1, 0, r, 0, np.True_)
            out.append({k: v.tolist() for k, v in buf.columns().items()})
    assert out[0] == out[2] and out[1] == out[3]
    assert out[0]["truncated"][1:3] == [False, True]  # stored as truncated and not terminated


def test_first_difference_agrees():
    rng = np.random.default_rng(4)
    n = 1000
    a = {"kind": rng.integers(0, 2, n).astype(np.uint8), "h_obs": rng.integers(0, 2 ** 63, n, dtype=np.uint64),
         "h_act": rng.integers(0, 2 ** 63, n, dtype=np.uint64), "h_rew": rng.integers(0, 2 ** 63, n, dtype=np.uint64),
         "terminated": rng.random(n) < 0.1, "truncated": rng.random(n) < 0.1}
    assert C.first_difference(a, a) == F.first_difference(a, a) == -1
    for name in a:
        for i in (0, 1, 500, n - 1):
            b = {k: v.copy() for k, v in a.items()}
            b[name][i] = not b[name][i] if b[name].dtype == bool else (b[name][i] ^ 1)
            assert C.first_difference(a, b) == F.first_difference(a, b) == i
            assert C.first_difference(a, b, i + 1) == F.first_difference(a, b, i + 1) == -1


# ---------------------------------------------------------------- whole ledger files

RECORD = ("import envs_for_tests as E, numpy as np, stepledger\n"
          "assert stepledger.CORE == {core!r}, stepledger.CORE\n"
          "E.run_random_episodes({directory!r}, seed=7, keep_values={keep}, reward_dtype=np.{dtype}, steps=400)\n")


@pytest.mark.parametrize("keep", [False, True], ids=["digests", "keep_values"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ledger_files_byte_identical(tmp_path, run_python, keep, dtype):
    paths = {}
    for core in ("cython", "python"):
        directory = str(tmp_path / core)
        env = {"STEPLEDGER_PUREPYTHON": "1"} if core == "python" else {}
        run_python(RECORD.format(core=core, directory=directory, keep=keep, dtype=dtype), env)
        paths[core] = os.path.join(directory, "env-0.npz")
    assert os.path.getsize(paths["cython"]) > 1000
    assert same_ledger_bytes(paths["cython"], paths["python"])
    with np.load(paths["cython"], allow_pickle=False) as z:
        assert int(z["offsets"][-1]) > 400
        assert ("values_obs_0" in z.files) == keep


def test_in_process_ledger_matches_subprocess(tmp_path, run_python):
    """The compiled core in this process writes the same file as a pure-Python process."""
    import stepledger
    if stepledger.CORE != "cython":
        pytest.skip("this process runs the pure-Python core")
    here = E.run_random_episodes(str(tmp_path / "here"), seed=3, keep_values=True)
    run_python("import envs_for_tests as E\nE.run_random_episodes(%r, seed=3, keep_values=True)\n"
               % str(tmp_path / "there"), {"STEPLEDGER_PUREPYTHON": "1"})
    assert same_ledger_bytes(here, str(tmp_path / "there" / "env-0.npz"))


def test_core_is_python_under_env_var(run_python):
    out = run_python("import stepledger, stepledger.core as c; print(stepledger.CORE, c.blake2b64.__module__)",
                     {"STEPLEDGER_PUREPYTHON": "1"})
    assert out.split() == ["python", "stepledger._fallback"]
    out = run_python("import stepledger; print(stepledger.CORE)")
    assert out.strip() == "cython"


def _per_env_batches(space, n, rng):
    """Batches in SB3's layout (env i is sent batch[i]), some of them odd."""
    values = [space.sample() for _ in range(n)]
    objects = np.empty(n, dtype=object)
    for i, v in enumerate(values):
        objects[i] = v
    batches = [values, tuple(values), objects, values[:-1], values + values[:1], "bad", None, 7]
    try:
        stacked = np.stack([np.asarray(v) for v in values])
        batches += [stacked, stacked.astype(np.float64), np.asfortranarray(stacked), stacked[::-1]]
    except (TypeError, ValueError):  # values that do not stack into one array
        pass
    ragged = list(values)
    ragged[0] = odd_values(space, rng)[-1]  # one env's value cannot be cast; the others still can
    batches.append(ragged)
    return batches


@pytest.mark.parametrize("name", sorted(SPACES))
def test_actions_per_env_agree_and_digest_each_value_as_sent(name):
    space = SPACES[name]
    space.seed(5)
    rng = np.random.default_rng(5)
    layout = LeafLayout(space)
    n = 5
    for batch in _per_env_batches(space, n, rng):
        got = []
        for core in (C, F):
            rec = core.VectorRecorder([core.StreamBuffer() for _ in range(n)], layout, layout, True)
            rec.actions_per_env(batch)
            got.append(rec.last_act.tolist())
        expected = []
        for i in range(n):
            try:
                value = batch[i]
            except Exception:
                expected.append(F.INVALID_DIGEST)
                continue
            expected.append(recorded_digests(F, space, [value], False)[1][1])  # [0] is the reset
        assert got[0] == got[1] == expected, (name, type(batch))


@pytest.mark.parametrize("name", VARIABLE)
@pytest.mark.parametrize("n", [1, 5])
def test_vector_batches_of_variable_spaces_agree(name, n):
    """A vector env's batch of a variable space (a tuple of values, or a dict of them) is
    digested env by env, alike in both cores and alike to each value digested alone."""
    from gymnasium.vector.utils import batch_space, concatenate, create_empty_array
    space = SPACES[name]
    space.seed(6)
    layout = LeafLayout(space)
    values = [space.sample() for _ in range(n)]
    batch = concatenate(space, values, create_empty_array(space, n))
    assert batch_space(space, n).contains(batch) or name == "graph"
    got = []
    for core in (C, F):
        rec = core.VectorRecorder([core.StreamBuffer() for _ in range(n)], layout, layout, True)
        rec.reset(batch)
        got.append(rec.last_obs.tolist())
        rec.actions("not a batch")  # cannot be split: invalid for every env, no exception
        assert rec.last_act.tolist() == [F.INVALID_DIGEST] * n
    assert got[0] == got[1] == [F.digest_leaves(layout.cast(v)) for v in values]
    assert F.INVALID_DIGEST not in got[0]


def _withheld_columns(core):
    layout = LeafLayout(gs.Box(-1, 1, (3,), np.float32))
    acts = LeafLayout(gs.Box(-1, 1, (1,), np.float32))
    bufs = [core.StreamBuffer() for _ in range(2)]
    rec = core.VectorRecorder(bufs, layout, acts, True)
    rec.env_reset(0, np.zeros(3, np.float32))
    rec.env_steps(0, np.ones((2, 1), np.float32), np.ones((2, 3), np.float32), [1.0, 2.0], [False, False],
                  [False, False])
    rec.env_steps(0, np.ones((1, 1), np.float32), None, [3.0], [False], [True])  # the final obs withheld
    rec.env_reset(0, None)  # a reset whose obs no batch brought
    return bufs[0].columns()


def test_withheld_observations_agree_and_carry_the_marker():
    c, f = _withheld_columns(C), _withheld_columns(F)
    for name in c:
        assert c[name].tolist() == f[name].tolist(), name
    assert c["h_obs"].tolist()[3:] == [C.WITHHELD_DIGEST, C.WITHHELD_DIGEST] and C.WITHHELD_DIGEST == F.WITHHELD_DIGEST
    assert C.WITHHELD_DIGEST not in (C.MISSING_DIGEST, C.INVALID_DIGEST)
