"""The trainer side's hot path: batches kept laid out for their digests, and a vector env's step
recorded in one call (``VectorRecorder.step_next_results`` / ``step_same_results``).

Each is held to the general path and to the pure-Python core: the same digests, the same events and
the same ledger bytes; and a live check or kept values still take the general path.
"""

import testpaths  # where the suite and the repository are (tests/testpaths.py)
import os

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces as gs
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from ledger_bytes import same_ledger_bytes
from stepledger import LedgerVectorEnv, TrainerLedger
from stepledger import _fallback as F
from stepledger.format.spaces import LeafLayout

C = pytest.importorskip("stepledger._core")

# Leaves whose digest messages take one block, one block exactly (128 bytes), several blocks, and so
# many bytes that a batch is not kept laid out (digested per call, as before).
BOXES = {"f32_1": ((1,), np.float32), "f32_3": ((3,), np.float32), "f64_scalar": ((), np.float64),
         "i8_116": ((116,), np.int8), "u8_117": ((117,), np.uint8), "f32_40": ((40,), np.float32),
         "u8_image": ((6, 7, 3), np.uint8), "f64_600": ((600,), np.float64)}


def _reference(layout, batch):
    """Each row's digest by the pure-Python core's definition, row by row."""
    return [F.digest_leaves(layout.cast(row)) for row in batch]


@pytest.mark.parametrize("name", sorted(BOXES))
@pytest.mark.parametrize("n", [1, 3, 4, 5, 8, 12, 13, 17])
def test_laid_out_batches_digest_as_the_reference(name, n):
    shape, dtype = BOXES[name]
    space = gs.Box(0, 100, shape=shape, dtype=dtype)
    layout = LeafLayout(space)
    rng = np.random.default_rng(n)
    rec = C.VectorRecorder([C.StreamBuffer() for _ in range(n)], layout, layout, True)
    ref = F.VectorRecorder([F.StreamBuffer() for _ in range(n)], layout, layout, True)
    for call in range(6):  # the rows kept laid out are overwritten call after call
        batch = rng.uniform(0, 100, (n,) + shape).astype(dtype)
        if call == 3:
            batch = np.asfortranarray(batch) if batch.ndim > 1 else batch[::-1]  # not laid out: the general path
        for r in (rec, ref):
            r.actions(batch)
            r.actions_per_env(batch)  # SB3's layout, an array of rows: the same digests
        assert rec.last_act.tolist() == ref.last_act.tolist() == _reference(layout, batch), (name, n, call)
        rec.reset(batch)
        assert rec.last_obs.tolist() == _reference(layout, batch)


def sweep_message_lengths():
    """Rows of 1 to 299 bytes (messages of 13 to 311: every way a last block ends), n from 4 to 17,
    each digested twice into the same laid-out rows; returns how many digests differ from the reference."""
    rng = np.random.default_rng(2)
    bad = 0
    for length in range(1, 300):
        layout = LeafLayout(gs.Box(0, 255, (length,), np.uint8))
        for n in (4, 7, 8, 12, 17):
            rec = C.VectorRecorder([C.StreamBuffer() for _ in range(n)], layout, layout, True)
            for _ in range(2):
                batch = rng.integers(0, 256, (n, length), dtype=np.uint8)
                rec.actions(batch)
                ref = np.zeros(n, np.uint64)
                F.digest_rows([batch], ref)
                bad += int((rec.last_act != ref).sum())
    return bad


def test_laid_out_batches_of_every_message_length():
    assert sweep_message_lengths() == 0


def test_laid_out_batches_without_avx512(run_python):
    """Four lanes at a time (AVX2) read the laid-out rows in place as eight (AVX-512) do."""
    tests = os.path.dirname(os.path.abspath(__file__))  # this module's folder: the child imports it
    out = run_python("import sys\nsys.path.insert(0, %r)\nimport test_trainer_hot_path as T\n"
                     "print(T.sweep_message_lengths())\n" % tests, {"STEPLEDGER_NO_AVX512": "1"})
    assert out.strip() == "0"


SPACES = {"box": gs.Box(-1, 1, shape=(3,), dtype=np.float32), "discrete": gs.Discrete(5),
          "dict": gs.Dict({"a": gs.Box(-1, 1, shape=(2,), dtype=np.float32), "b": gs.Discrete(3)})}


def _steps(space, n, steps, seed):
    """Random vector steps of ``space``: (actions, (obs, rewards, terminated, truncated, info))."""
    from gymnasium.vector.utils import batch_space
    batch = batch_space(space, n)
    batch.seed(seed)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        ends = rng.random((2, n)) < 0.15
        yield batch.sample(), (batch.sample(), rng.normal(size=n), ends[0], ends[1], {})


def _events(rec):
    return [{k: v.tolist() for k, v in b.columns().items()} for b in rec.buffers]


@pytest.mark.parametrize("space", sorted(SPACES))
@pytest.mark.parametrize("same", [False, True], ids=["next_step", "same_step"])
def test_step_results_records_as_step(space, same):
    """One call with the step's results records what step_next / step_same record, in both cores."""
    sp = SPACES[space]
    layout = LeafLayout(sp)
    n = 5
    recs = {(core, fast): core.VectorRecorder([core.StreamBuffer() for _ in range(n)], layout, layout, True)
            for core in (C, F) for fast in (False, True)}
    first_obs = next(_steps(sp, n, 1, 9))[1][0]
    for r in recs.values():
        r.reset(first_obs)
    not_recorded = 0
    for actions, results in _steps(sp, n, 60, 3):
        obs, rewards, terminated, truncated, _ = results
        ended = [i for i in range(n) if terminated[i] or truncated[i]]
        finals = {i: (12345 + i, bool(terminated[i]), bool(truncated[i])) for i in ended}
        for (core, fast), r in recs.items():
            r.actions(actions)
            if not same:
                got = r.step_next_results(results) if fast else r.step_next(obs, rewards, terminated, truncated)
                assert got is False or got is True
            elif fast:
                got = r.step_same_results(results)
                if ended:
                    assert got is None  # nothing recorded: the caller records it with its finals
                    not_recorded += 1
                    r.step_same(obs, rewards, finals)
                else:
                    assert got is False or got is True
            else:
                r.step_same(obs, rewards, finals)
        first = recs[(C, False)]
        for r in recs.values():
            assert _events(r) == _events(first)
            assert [[r.event(i, j) for j in range(r.events_in_call(i))] for i in range(n)] == \
                   [[first.event(i, j) for j in range(first.events_in_call(i))] for i in range(n)]
            assert r.counts.tolist() == first.counts.tolist() and r.pending.tolist() == first.pending.tolist()
    assert not same or not_recorded > 10


def _scripted(space, seed):
    """A Gymnasium env of ``space`` whose episodes end after 1 to 4 steps, by termination or time limit."""
    class Env(gym.Env):
        observation_space, action_space = space, space

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t, self.length = 0, int(self.np_random.integers(1, 5))
            return self.observation_space.sample(), {}

        def step(self, action):
            self.t += 1
            end = self.t >= self.length
            return self.observation_space.sample(), float(self.np_random.normal()), end and self.t % 2 == 0, \
                end and self.t % 2 == 1, {}
    env = Env()
    env.observation_space.seed(seed)
    return env


RUN = """
import gymnasium as gym, numpy as np, sys
sys.path[:0] = [{tests!r}, {here!r}]
from gymnasium.vector import AutoresetMode, SyncVectorEnv
import stepledger
from stepledger import LedgerVectorEnv
import test_trainer_hot_path as T
assert stepledger.CORE == {core!r}
T.run_vector({space!r}, {mode!r}, {path!r}, {how!r})
"""


def run_vector(space, mode, path, how="plain"):
    """Four envs of ``space`` for 40 steps under ``mode`` into ``path``; ``how``: plain (the hot path), live
    (a live check, without tokens to check: the general path) or keep (kept values: the general path)."""
    sp = SPACES[space]
    n = 4
    envs = SyncVectorEnv([lambda i=i: _scripted(sp, i) for i in range(n)],
                         autoreset_mode=getattr(AutoresetMode, mode))
    envs = LedgerVectorEnv(envs, path, keep_values=how == "keep", live=how == "live", on_fault="record")
    assert (envs.ledger.step_results is None) == (how != "plain")
    general = [0]
    step = envs.ledger.step

    def counted(*args, **kwargs):
        general[0] += 1
        return step(*args, **kwargs)
    envs.ledger.step = counted
    envs.action_space.seed(1)
    envs.reset(seed=2)
    for _ in range(40):
        envs.step(envs.action_space.sample())
    envs.close()
    return general[0]


@pytest.mark.filterwarnings("ignore:LedgerVectorEnv.*without a live token")
@pytest.mark.parametrize("space", sorted(SPACES))
@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP"])
def test_hot_path_ledgers_are_the_general_paths_and_the_pure_python_cores(tmp_path, run_python, space, mode):
    tests = testpaths.TESTS_DIR
    plain = str(tmp_path / "plain.npz")
    calls = run_vector(space, mode, plain)
    # the general path only where an env's episode ended under same-step autoreset
    assert calls == 0 if mode == "NEXT_STEP" else 0 < calls < 40
    assert run_vector(space, mode, str(tmp_path / "live.npz"), "live") == 40
    assert same_ledger_bytes(plain, str(tmp_path / "live.npz"))
    assert run_vector(space, mode, str(tmp_path / "keep.npz"), "keep") == 40
    for core, env in (("cython", {}), ("python", {"STEPLEDGER_PUREPYTHON": "1"})):
        path = str(tmp_path / (core + ".npz"))
        run_python(RUN.format(tests=tests, here=os.path.dirname(os.path.abspath(__file__)), core=core, space=space, mode=mode, path=path, how="plain"), env)
        assert same_ledger_bytes(plain, path), core
    with np.load(plain) as z, np.load(str(tmp_path / "keep.npz")) as k:
        for column in ("kind", "h_obs", "h_act", "h_rew", "terminated", "truncated"):
            assert z[column].tolist() == k[column].tolist()


def test_step_results_is_off_with_live_kept_values_or_no_file(tmp_path):
    box = SPACES["box"]
    on = TrainerLedger(str(tmp_path / "a.npz"), 2, box, box, autoreset_mode="next_step")
    assert on.step_results is not None
    for kwargs in ({"live": True}, {"keep_values": True}):
        led = TrainerLedger(str(tmp_path / "b.npz"), 2, box, box, autoreset_mode="same_step", **kwargs)
        assert led.step_results is None
        led.close()
    live_only = TrainerLedger(None, 2, box, box, autoreset_mode="next_step", live=True)
    assert live_only.step_results is None
    assert TrainerLedger(str(tmp_path / "c.npz"), 2, box, box).step_results is None  # no autoreset mode
    on.close()
