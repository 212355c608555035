"""The core's sub-batch calls (``actions_ids``, ``reset_ids``, ``step_next_ids``: EnvPool's rows by env id)
give the same events in both cores, and the same events as the whole-batch calls where the rows are every
env's in order."""

import numpy as np
import pytest
from gymnasium import spaces as gs

from stepledger import _fallback as F
from stepledger.format.spaces import LeafLayout

C = pytest.importorskip("stepledger._core")

OBS = gs.Box(-1, 1, (3,), np.float32)
ACT = gs.Discrete(2)


def _recorder(core, n):
    buffers = [core.StreamBuffer() for _ in range(n)]
    return core.VectorRecorder(buffers, LeafLayout(OBS), LeafLayout(ACT), True), buffers


def _columns(buffers):
    return [{k: v.tolist() for k, v in b.columns().items()} for b in buffers]


def _run_sub(core, n, seed):
    """An async pool's run: each call steps a random half of the envs, some of which end."""
    rng = np.random.default_rng(seed)
    rec, buffers = _recorder(core, n)
    ids = np.arange(n)
    rec.reset_ids(rng.random((n, 3), dtype=np.float32), ids[::-1])
    for _ in range(60):
        sub = np.sort(rng.choice(n, n // 2, replace=False))
        rec.actions_ids(rng.integers(0, 2, len(sub)), sub)
        done = rng.random(len(sub)) < 0.2
        rec.step_next_ids(rng.random((len(sub), 3), dtype=np.float32), rng.normal(size=len(sub)),
                          done & (rng.random(len(sub)) < 0.5), done, sub[::-1][::-1])
    return _columns(buffers)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sub_batches_agree_across_cores(seed):
    assert _run_sub(C, 6, seed) == _run_sub(F, 6, seed)


@pytest.mark.parametrize("core", [C, F], ids=["cython", "fallback"])
def test_sub_batches_of_every_env_in_order_are_whole_batches(core):
    n, rng = 5, np.random.default_rng(4)
    a, ba = _recorder(core, n)
    b, bb = _recorder(core, n)
    ids = np.arange(n)
    obs = rng.random((n, 3), dtype=np.float32)
    a.reset(obs)
    b.reset_ids(obs, ids)
    for _ in range(40):
        act = rng.integers(0, 2, n)
        obs = rng.random((n, 3), dtype=np.float32)
        rew, te, tr = rng.normal(size=n), rng.random(n) < 0.15, rng.random(n) < 0.1
        a.actions(act)
        b.actions_ids(act, ids)
        a.step_next(obs, rew, te, tr)
        b.step_next_ids(obs, rew, te, tr, ids)
    assert _columns(ba) == _columns(bb)


@pytest.mark.parametrize("core", [C, F], ids=["cython", "fallback"])
def test_rows_go_to_their_env(core):
    rec, buffers = _recorder(core, 3)
    obs = np.arange(9, dtype=np.float32).reshape(3, 3)
    rec.reset_ids(obs[:2], [2, 0])
    rec.actions_ids(np.array([1]), [2])
    rec.step_next_ids(obs[2:], [1.5], [True], [False], [2])
    cols = _columns(buffers)
    assert [len(c["kind"]) for c in cols] == [1, 0, 2]
    assert cols[2]["kind"] == [0, 1] and cols[2]["terminated"] == [False, True]
    assert cols[0]["h_obs"][0] == F.digest_leaves([obs[1]])
    assert cols[2]["h_obs"][0] == F.digest_leaves([obs[0]])
    # env 2 ended: its next row is its reset, its action not recorded
    rec.actions_ids(np.array([0]), [2])
    rec.step_next_ids(obs[:1], [0.0], [False], [False], [2])
    assert _columns(buffers)[2]["kind"][-1] == 0 and _columns(buffers)[2]["h_act"][-1] == 0


@pytest.mark.parametrize("core", [C, F], ids=["cython", "fallback"])
@pytest.mark.parametrize("bad", [[3], [-1]])
def test_env_ids_out_of_range_are_refused(core, bad):
    rec, _ = _recorder(core, 3)
    with pytest.raises(IndexError, match="each must be one of the 3 envs"):
        rec.step_next_ids(np.zeros((1, 3), np.float32), [0.0], [False], [False], bad)


@pytest.mark.parametrize("core", [C, F], ids=["cython", "fallback"])
def test_rows_and_ids_of_other_lengths_are_refused(core):
    rec, _ = _recorder(core, 3)
    with pytest.raises(ValueError, match="expected 2 rewards"):
        rec.step_next_ids(np.zeros((2, 3), np.float32), [0.0], [False, False], [False, False], [0, 1])


# ---------------------------------------------------------------- Discrete actions by a table (compiled core)

@pytest.mark.parametrize("space", [gs.Discrete(2), gs.Discrete(7, start=-3), gs.Discrete(4096), gs.Discrete(5000)],
                         ids=["2", "start-3", "4096", "5000"])
def test_discrete_actions_digest_as_in_the_reference(space):
    rng = np.random.default_rng(5)
    lo, hi = int(space.start) - 2, int(space.start + space.n) + 2  # values outside the space too
    for batch in (rng.integers(lo, hi, 64), rng.integers(lo, hi, 64)[::2], rng.integers(lo, hi, 9).astype(np.int32),
                  rng.integers(lo, hi, 9).astype(">i8"), list(rng.integers(lo, hi, 9).tolist())):
        m = len(batch)
        got = []
        for core in (C, F):
            rec = core.VectorRecorder([core.StreamBuffer() for _ in range(m)], LeafLayout(OBS), LeafLayout(space), True)
            rec.actions(batch)
            got.append(np.asarray(rec.last_act).tolist())
            rec.actions_ids(batch, np.arange(m)[::-1])
            got.append(np.asarray(rec.last_act).tolist())
        assert got[0] == got[2] and got[1] == got[3]
        assert got[0] == [F.digest_leaves([np.asarray(v, dtype=np.int64)]) for v in batch]


# ---------------------------------------------------------------- strided batches (CartPoleVectorEnv's: transposed)

@pytest.mark.parametrize("make", [lambda x: np.asfortranarray(x), lambda x: x[::-1], lambda x: x[:, ::-1],
                                  lambda x: np.asfortranarray(x)[::2]],
                         ids=["fortran", "rows-reversed", "columns-reversed", "fortran-every-other"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8])
def test_strided_observation_batches_digest_as_in_the_reference(make, dtype):
    rng = np.random.default_rng(6)
    space = gs.Box(-1, 1, (5,), dtype) if dtype != np.int8 else gs.Box(-100, 100, (5,), dtype)
    base = (rng.random((24, 5)) * 100).astype(dtype)
    batch = make(base)
    m = batch.shape[0]
    got = []
    for core in (C, F):
        rec = core.VectorRecorder([core.StreamBuffer() for _ in range(m)], LeafLayout(space), LeafLayout(ACT), True)
        for _ in range(2):  # the second call digests into the layout the first built
            rec.reset(batch)
        got.append([b.columns()["h_obs"].tolist() for b in rec.buffers])
    assert got[0] == got[1]
    assert [g[0] for g in got[0]] == [F.digest_leaves([np.ascontiguousarray(r)]) for r in batch]
