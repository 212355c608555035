"""The env side's step path: the action's and the observation's messages digested together in one
compression (the compiled core's fast path) give the digests each field has alone, on every space and
on both cores; an action the env edits in place, an env whose step raises after the action was noted,
and a run compared with the trainer side all come out as before."""

import copy
import os

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces as gs

import stepledger
from stepledger import LedgerEnv, read
from stepledger import _fallback as F
from stepledger.format import schema as S
from stepledger.format.spaces import LeafLayout
from space_cases import SPACES, VARIABLE, odd_values

C = pytest.importorskip("stepledger._core")

# Edges of the one-block fast path: a message of header (12 bytes for a 1-d leaf) and data.
EDGES = {
    "box_f32_fits_one_block": gs.Box(-1, 1, shape=(29,), dtype=np.float32),   # 12 + 116 = 128
    "box_f32_one_byte_over": gs.Box(-1, 1, shape=(30,), dtype=np.float32),    # 12 + 120 = 132
    "box_f64": gs.Box(-1, 1, shape=(2,), dtype=np.float64),
    "box_int64_scalar": gs.Box(-5, 5, shape=(), dtype=np.int64),
    "box_int8": gs.Box(-5, 5, shape=(4,), dtype=np.int8),
    "box_uint16": gs.Box(0, 9, shape=(3,), dtype=np.uint16),
    "box_f16": gs.Box(-1, 1, shape=(3,), dtype=np.float16),
    "box_bool": gs.Box(0, 1, shape=(3,), dtype=np.bool_),
    "box_many_dims": gs.Box(-1, 1, shape=(1,) * 14, dtype=np.float32),         # 116 + 4 = 120
    "box_15_dims": gs.Box(-1, 1, shape=(1,) * 15, dtype=np.float32),           # 124 + 4 = 128
    "box_16_dims": gs.Box(-1, 1, shape=(1,) * 16, dtype=np.float32),           # 132 + 4
    "box_large": gs.Box(0, 255, shape=(84, 84, 3), dtype=np.uint8),
}
ALL = {**SPACES, **EDGES}
# observation space x action space: each kind against a small Box (the fast path's partner) and against
# itself; large and not-fitting actions with small observations and the other way round
PAIRS = sorted({(o, "box_f32") for o in ALL} | {("box_f32", a) for a in ALL} | {(n, n) for n in ALL}
               | {("box_large", "discrete"), ("discrete", "box_large"), ("box_f32_one_byte_over", "box_many_dims")})


def per_field(space, value):
    """The digest of one field alone, from its cast leaves (the pure-Python core's definition)."""
    try:
        leaves = LeafLayout(space).cast(value)
    except Exception:
        return F.INVALID_DIGEST
    return F.digest_leaves(leaves)


def scramble(value):
    """Change an array (or the arrays inside a dict/tuple) in place, as an env may change its action."""
    if isinstance(value, np.ndarray) and value.flags.writeable and value.size:
        value.reshape(-1).view(np.uint8)[:] ^= 0x5A
    elif isinstance(value, dict):
        for v in value.values():
            scramble(v)
    elif isinstance(value, tuple):
        for v in value:
            scramble(v)


def steps_recorded(core, obs_space, act_space, pairs, keep):
    """(h_obs, h_act) of each step: the action noted, then changed in place by 'the env', then the step."""
    buf = core.StreamBuffer()
    rec = core.EventRecorder(buf, LeafLayout(obs_space), LeafLayout(act_space), True,
                             keep=(lambda o, a: False) if keep else None)
    rec.reset(pairs[0][0])
    for obs, act in pairs:
        rec.take_action(act)
        scramble(act)
        rec.step_taken(obs, 0.5, False, False)
    cols = buf.columns()
    return list(zip(cols["h_obs"][1:].tolist(), cols["h_act"][1:].tolist()))


@pytest.mark.parametrize("obs_name,act_name", PAIRS, ids=["%s-%s" % p for p in PAIRS])
def test_one_compression_gives_each_fields_own_digest(obs_name, act_name):
    obs_space, act_space = ALL[obs_name], ALL[act_name]
    obs_space.seed(3)
    act_space.seed(4)
    rng = np.random.default_rng(5)
    obs_values, act_values = odd_values(obs_space, rng), odd_values(act_space, rng)
    n = max(len(obs_values), len(act_values))
    pairs = [(obs_values[i % len(obs_values)], act_values[(3 * i) % len(act_values)]) for i in range(2 * n)]
    expected = [(per_field(obs_space, o), per_field(act_space, a)) for o, a in pairs]
    runs = {}
    for core in (C, F):
        for keep in (False, True):
            if keep and (obs_name in VARIABLE or act_name in VARIABLE):
                continue  # kept values of variable spaces are encoded, not columns: test_every_space
            runs[core.IMPLEMENTATION, keep] = steps_recorded(core, obs_space, act_space,
                                                             [(o, copy.deepcopy(a)) for o, a in pairs], keep)
    for name, got in runs.items():
        assert got == expected, name


def test_every_message_length_of_one_block_in_either_lane():
    """Messages of 12 to 128 bytes (a 12-byte header, 0 to 116 bytes of data), as the observation and as
    the action of one step, and a zero-length leaf: each digest is the field's own."""
    rng = np.random.default_rng(7)
    for k in range(0, 117):
        obs_space, act_space = gs.Box(0, 255, (k,), np.uint8), gs.Box(0, 255, (116 - k,), np.uint8)
        pairs = [(obs_space.sample(), act_space.sample()) for _ in range(2)]
        pairs.append((rng.integers(0, 256, k, dtype=np.uint8), rng.integers(0, 256, 116 - k, dtype=np.uint8)))
        expected = [(per_field(obs_space, o), per_field(act_space, a)) for o, a in pairs]
        for core in (C, F):
            assert steps_recorded(core, obs_space, act_space, copy.deepcopy(pairs), False) == expected, (core, k)


class _Failing(gym.Env):
    """Steps with observation t; the step of ``fail_at`` (counted over the env's life) raises after
    editing its action array in place."""

    observation_space = gs.Box(-1e6, 1e6, (3,), np.float32)
    action_space = gs.Box(-10, 10, (2,), np.float32)

    def __init__(self, fail_at):
        self.fail_at, self.t = fail_at, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(3, -1, np.float32), {}

    def step(self, action):
        self.t += 1
        action[:] = 99  # the ledger must still have what was sent
        if self.t == self.fail_at:
            raise RuntimeError("the env broke")
        return np.full(3, self.t, np.float32), float(self.t), False, False, {}


@pytest.mark.parametrize("then", ["reset", "step"])
def test_a_step_that_raises_records_nothing_and_the_next_events_are_right(tmp_path, core_impl, then):
    env = LedgerEnv(_Failing(fail_at=2), str(tmp_path), index=0)
    env.reset(seed=0)
    sent = [np.array([0.5, -0.5], np.float32), np.array([1.5, 2.5], np.float32),
            np.array([3.5, 4.5], np.float32), np.array([5.5, 6.5], np.float32)]
    env.step(sent[0].copy())
    with pytest.raises(RuntimeError, match="the env broke"):
        env.step(sent[1].copy())
    if then == "reset":
        env.reset()
    env.step(sent[2].copy())
    env.step(sent[3].copy())
    env.close()
    ledger = read(env.ledger_path)
    assert ledger.meta[S.META_STATE] == S.STATE_INTERRUPTED
    cols = ledger.streams[0].columns
    kinds = [S.KIND_RESET, S.KIND_STEP] + ([S.KIND_RESET] if then == "reset" else []) + [S.KIND_STEP] * 2
    assert cols["kind"].tolist() == kinds
    obs_space, act_space = _Failing.observation_space, _Failing.action_space
    steps = np.flatnonzero(cols["kind"] == S.KIND_STEP)
    assert cols["h_act"][steps].tolist() == [per_field(act_space, a) for a in (sent[0], sent[2], sent[3])]
    assert cols["h_obs"][steps].tolist() == [per_field(obs_space, np.full(3, t, np.float32)) for t in (1, 3, 4)]
    if then == "reset":
        assert cols["h_act"][2] == S.NO_DIGEST
        assert cols["h_obs"][2] == per_field(obs_space, np.full(3, -1, np.float32))


def test_step_returns_the_inner_envs_own_result(tmp_path, core_impl):
    inner = _Failing(fail_at=0)
    result = (np.zeros(3, np.float32), 1.0, False, False, {"k": 1})
    inner.step = lambda action: result
    env = LedgerEnv(inner, str(tmp_path), index=0)
    env.reset()
    assert env.step(np.zeros(2, np.float32)) is result
    live = LedgerEnv(inner, None, index=0, live=True)
    live.reset()
    out = live.step(np.zeros(2, np.float32))
    assert out[:4] == result[:4] and out[4] is not result[4] and S.TOKEN_KEY in out[4] and result[4] == {"k": 1}
    env.close()
    live.close()


def test_a_result_of_the_wrong_arity_raises_as_the_env_did(tmp_path, core_impl):
    inner = _Failing(fail_at=0)
    inner.step = lambda action: (np.zeros(3, np.float32), 1.0, False, {})
    env = LedgerEnv(inner, str(tmp_path), index=0)
    env.reset()
    with pytest.raises(ValueError):
        env.step(np.zeros(2, np.float32))
    env.close()
    ledger = read(env.ledger_path)
    assert ledger.meta[S.META_STATE] == S.STATE_INTERRUPTED and len(ledger.streams[0].columns["kind"]) == 1


def test_a_pendulum_run_compares_clean_with_the_trainer_side(tmp_path, core_impl):
    """The benchmark's configuration, both ledgers: no difference (the env side's new path against the
    trainer side's)."""
    d = str(tmp_path)
    n = 4
    envs = stepledger.LedgerVectorEnv(
        gym.vector.SyncVectorEnv([lambda i=i: LedgerEnv(gym.make("Pendulum-v1"), d, index=i) for i in range(n)]),
        os.path.join(d, "trainer.npz"))
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(450):  # past Pendulum's 200-step limit twice: autoresets on both sides
        envs.step(rng.uniform(-2, 2, (n, 1)).astype(np.float32))
    envs.close()
    report = stepledger.compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, str(report)
    for i in range(n):
        kinds = read(os.path.join(d, "env-%d.npz" % i)).streams[i].columns["kind"]
        assert (kinds == S.KIND_RESET).sum() == 3 and len(kinds) > 450


@pytest.mark.parametrize("core", [C, F], ids=["cython", "python"])
def test_the_recorders_step_calls_take_positional_arguments_only(core):
    """As the compiled core's take_action is METH_O (called with no argument parsing): both cores alike."""
    layout = LeafLayout(gs.Discrete(2))
    rec = core.EventRecorder(core.StreamBuffer(), layout, layout, True)
    with pytest.raises(TypeError):
        rec.take_action(action=1)
    rec.take_action(1)
    with pytest.raises(TypeError):
        rec.step_taken(0, 0.0, False, truncated=False)
    assert rec.step_taken(0, 0.0, False, False) is False and rec.counter == 1
