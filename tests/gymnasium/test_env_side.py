"""LedgerEnv: transparent, records what the env gave when it gave it, writes when it should."""

import os
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces as gs

import envs_for_tests as E
import stepledger
from stepledger import LedgerEnv, LedgerError, UnsupportedSpaceError, read
from stepledger import core
from stepledger.recording import hooks
from stepledger.format import schema as S
from stepledger.format.spaces import LeafLayout

BOX3 = gs.Box(-1e6, 1e6, shape=(3,), dtype=np.float32)


def digest(space, value):
    return core.digest_leaves(LeafLayout(space).cast(value))


def f32_bits(x):
    return int(np.array(x, dtype=np.float32).view(np.uint32))


pytestmark = pytest.mark.usefixtures("core_impl")  # every test on both cores


# ---------------------------------------------------------------- transparency

def test_returns_exactly_what_the_env_returned(tmp_path):
    obs0, obs1 = np.zeros(3, np.float32), np.ones(3, np.float32)
    reward, term, trunc = np.float64(2.5), np.bool_(False), False
    inner = E.ScriptedEnv(BOX3, gs.Discrete(2), obs0, [(obs1, reward, term, trunc)])
    info_reset, info_step = {"a": 1}, {"b": [2]}
    inner.reset = lambda seed=None, options=None: (obs0, info_reset)
    inner.step = lambda action: (obs1, reward, term, trunc, info_step)
    env = LedgerEnv(inner, str(tmp_path), index=0)
    o, i = env.reset(seed=3)
    assert o is obs0 and i is info_reset and i == {"a": 1}
    out = env.step(1)
    assert out[0] is obs1 and out[1] is reward and out[2] is term and out[3] is trunc and out[4] is info_step
    assert info_step == {"b": [2]}
    assert obs0.tolist() == [0, 0, 0] and obs1.tolist() == [1, 1, 1]
    env.close()


def test_wraps_like_a_gymnasium_wrapper(tmp_path):
    env = LedgerEnv(gym.make("CartPole-v1"), str(tmp_path), index=2)
    assert env.observation_space == env.env.observation_space and env.action_space == env.env.action_space
    assert env.ledger_path == os.path.join(str(tmp_path), "env-2.npz")
    obs, _ = env.reset(seed=0)
    env.step(0)
    env.close()
    assert os.path.exists(env.ledger_path)


# ---------------------------------------------------------------- what is recorded

def test_records_reset_and_step_events(tmp_path):
    env = LedgerEnv(E.CountEnv(length=2, terminate=False), str(tmp_path), index=0)
    env.reset()
    env.step(1)
    env.step(2)
    env.reset()
    env.step(0)
    env.close()
    cols = read(env.ledger_path).streams[0].columns
    assert cols["kind"].tolist() == [0, 1, 1, 0, 1]
    expected_obs = [E.obs_value(0, 0), E.obs_value(0, 1), E.obs_value(0, 2), E.obs_value(1, 0), E.obs_value(1, 1)]
    assert cols["h_obs"].tolist() == [digest(BOX3, o) for o in expected_obs]
    act = gs.Discrete(3)
    assert cols["h_act"].tolist() == [S.NO_DIGEST, digest(act, 1), digest(act, 2), S.NO_DIGEST, digest(act, 0)]
    assert cols["h_rew"].tolist() == [0, f32_bits(1.5), f32_bits(2.5), 0, f32_bits(1.5)]
    assert cols["terminated"].tolist() == [False] * 5
    assert cols["truncated"].tolist() == [False, False, True, False, False]


def test_truncated_stored_as_truncated_and_not_terminated(tmp_path):
    obs = np.zeros(3, np.float32)
    flags = [(True, True), (False, True), (True, False), (False, False), (np.True_, np.True_), (1, 1), (0, 1)]
    env = LedgerEnv(E.ScriptedEnv(BOX3, gs.Discrete(2), obs, [(obs, 0.0, te, tr) for te, tr in flags]),
                    str(tmp_path), index=0)
    env.reset()
    for _ in flags:
        env.step(0)
    env.close()
    cols = read(env.ledger_path).streams[0].columns
    assert cols["terminated"][1:].tolist() == [bool(te) for te, _ in flags]
    assert cols["truncated"][1:].tolist() == [bool(tr and not te) for te, tr in flags]


@pytest.mark.parametrize("reward_dtype", [np.float32, np.float64])
def test_reward_bits_recorded(tmp_path, reward_dtype):
    obs = np.zeros(3, np.float32)
    rewards = [0.1, np.float32(0.1), np.float64(-7.25), 3, np.array(1e-3)]
    env = LedgerEnv(E.ScriptedEnv(BOX3, gs.Discrete(2), obs, [(obs, r, False, False) for r in rewards]),
                    str(tmp_path), index=0, reward_dtype=reward_dtype)
    env.reset()
    for _ in rewards:
        env.step(0)
    env.close()
    led = read(env.ledger_path)
    assert led.meta["reward_dtype"] == np.dtype(reward_dtype).name
    bits = led.streams[0].columns["h_rew"]
    if reward_dtype is np.float32:
        assert bits.tolist() == [0] + [f32_bits(float(r)) for r in rewards]
        assert (bits >> 32 == 0).all()
    else:
        assert bits.view(np.float64).tolist() == [0.0] + [float(r) for r in rewards]


# ---------------------------------------------------------------- snapshots

@pytest.mark.parametrize("keep_values", [False, True])
def test_reused_obs_array_is_snapshotted(tmp_path, keep_values):
    """An env that mutates one obs array (also in reset): the ledger holds each value as given."""
    env = LedgerEnv(E.CountEnv(length=3, reuse=True), str(tmp_path), index=0, keep_values=keep_values)
    seen = []
    o, _ = env.reset()
    seen.append(o)
    for _ in range(2):
        for a in range(3):
            o, *_ = env.step(a)
            seen.append(o)
        o, _ = env.reset()
        seen.append(o)
    assert all(s is seen[0] for s in seen)  # really one array
    env.close()
    truth = [E.obs_value(e, t) for e in range(2) for t in range(4)] + [E.obs_value(2, 0)]
    stream = read(env.ledger_path).streams[0]
    assert stream.columns["h_obs"].tolist() == [digest(BOX3, v) for v in truth]
    if keep_values:
        assert stream.values["values_obs_0"].tolist() == [v.tolist() for v in truth]


def test_action_mutated_after_step_is_snapshotted(tmp_path):
    space = gs.Box(-5, 5, shape=(2,), dtype=np.float32)
    env = LedgerEnv(E.CountEnv(length=10, action_space=space), str(tmp_path), index=0, keep_values=True)
    env.reset()
    action = np.array([1.0, 2.0], np.float32)
    env.step(action)
    action[:] = 4.0  # the trainer reuses its action buffer
    env.step(action)
    env.close()
    stream = read(env.ledger_path).streams[0]
    assert stream.values["values_act_0"][1:].tolist() == [[1.0, 2.0], [4.0, 4.0]]
    assert stream.columns["h_act"][1:].tolist() == [digest(space, [1.0, 2.0]), digest(space, [4.0, 4.0])]


# ---------------------------------------------------------------- when files are written

def test_no_file_when_no_events(tmp_path):
    env = LedgerEnv(E.CountEnv(), str(tmp_path / "d"), index=0)
    env.flush()
    env.close()
    assert not os.path.exists(env.ledger_path)


def test_empty_ledger_env_never_replaces_a_ledger(tmp_path):
    path = E.run_random_episodes(str(tmp_path), steps=50)
    before = open(path, "rb").read()
    env = E.make_random_env(0, str(tmp_path))
    env.close()
    assert open(path, "rb").read() == before


def test_flush_writes_and_recording_continues(tmp_path):
    env = LedgerEnv(E.CountEnv(length=3), str(tmp_path), index=0)
    env.reset()
    env.step(0)
    env.flush()
    assert len(read(env.ledger_path).streams[0]) == 2
    env.step(1)
    env.step(2)
    env.flush()
    assert len(read(env.ledger_path).streams[0]) == 4
    env.reset()
    env.close()
    env.close()  # twice is fine
    cols = read(env.ledger_path).streams[0].columns
    assert cols["kind"].tolist() == [0, 1, 1, 1, 0]
    assert not [f for f in os.listdir(str(tmp_path)) if ".tmp-" in f]


def test_written_at_interpreter_exit_if_never_closed(tmp_path, run_python):
    run_python("import envs_for_tests as E\n"
               "env = E.make_count_env(4, %r)\n"
               "env.reset()\n"
               "for a in range(7): env.step(a %% 3)\n" % str(tmp_path))
    assert len(read(str(tmp_path / "env-4.npz")).streams[4]) == 8


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_does_not_write_parents_ledger(tmp_path):
    env = LedgerEnv(E.CountEnv(), str(tmp_path), index=0)
    env.reset()
    env.step(0)
    pid = os.fork()
    if pid == 0:  # the child records on, then runs stepledger's exit handler
        code = 1
        try:
            env.step(1)
            hooks._close_all_at_exit()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert not os.path.exists(env.ledger_path)
    env.step(2)
    env.close()
    assert len(read(env.ledger_path).streams[0]) == 3


# ---------------------------------------------------------------- bad arguments

@pytest.mark.parametrize("kwargs,exc", [
    ({"index": -1}, ValueError),
    ({"index": "a"}, ValueError),
    ({"index": 1.0}, ValueError),
    ({"index": True}, ValueError),
    ({"index": 0, "reward_dtype": np.int32}, ValueError),
    ({"index": 0, "reward_dtype": np.float16}, ValueError),
    ({"index": 0, "reward_dtype": "nonsense"}, ValueError),
    ({"index": 0, "directory": None}, TypeError),
])
def test_bad_arguments(tmp_path, kwargs, exc):
    kwargs = dict(kwargs)
    directory = kwargs.pop("directory", str(tmp_path))
    with pytest.raises(exc) as info:
        LedgerEnv(E.CountEnv(), directory, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message.startswith("LedgerEnv")
    assert not os.listdir(str(tmp_path))


class CustomSpace(gs.Space):
    """A Space of the user's own: stepledger cannot know how its values flatten."""

    def __init__(self):
        super().__init__((), np.float32)

    def sample(self, mask=None, probability=None):
        return np.float32(0)

    def contains(self, x):
        return True


@pytest.mark.parametrize("obs_space,act_space,where", [
    (CustomSpace(), gs.Discrete(2), "observation_space is a CustomSpace, a space of its own"),
    (BOX3, CustomSpace(), "action_space is a CustomSpace, a space of its own"),
    (gs.Dict({"a": BOX3, "t": CustomSpace()}), gs.Discrete(2), "['t'] is a CustomSpace"),
    (gs.Tuple((BOX3, gs.Sequence(CustomSpace()))), gs.Discrete(2), "[1]['feature_space'] is a CustomSpace"),
    (gs.OneOf((BOX3, CustomSpace())), gs.Discrete(2), "[1] is a CustomSpace"),
    (gs.Graph(gs.MultiBinary(2), None), gs.Discrete(2), ".node_space is a MultiBinary"),
])
def test_unsupported_space(tmp_path, obs_space, act_space, where):
    inner = E.ScriptedEnv(obs_space, act_space, None, [(None, 0.0, False, False)])
    with pytest.raises(UnsupportedSpaceError) as info:
        LedgerEnv(inner, str(tmp_path), index=0)
    assert isinstance(info.value, LedgerError) and isinstance(info.value, TypeError)
    message = str(info.value)
    assert "\n" not in message and where in message and "LedgerEnv" in message


# ---------------------------------------------------------------- the env's step never raises

def test_step_never_raises_because_of_the_ledger(tmp_path):
    good = np.zeros(3, np.float32)
    steps = [
        (np.zeros(4, np.float32), 1.0, False, False),  # wrong shape
        ("not an obs", 1.0, False, False),  # a string
        (None, 1.0, False, False),
        ({"a": 1}, 1.0, False, False),
        (good, "one", False, False),  # a reward that is no number
        (good, None, False, False),
        (good, 10 ** 400, False, False),
        (good, 1.0, np.array([True, False]), False),  # flags with no truth value
        (good, 1.0, False, "maybe"),
        (good, 1.0, False, False),
    ]
    for keep_values in (False, True):
        directory = str(tmp_path / str(keep_values))
        env = LedgerEnv(E.ScriptedEnv(BOX3, gs.Discrete(2), good, steps), directory, index=0,
                        keep_values=keep_values)
        env.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing to warn about either: all of these are recorded
            for obs, *_ in steps:
                assert env.step("not an action")[0] is obs
        env.close()
        stream = read(env.ledger_path).streams[0]
        cols = stream.columns
        assert len(cols["kind"]) == 1 + len(steps)
        h = cols["h_obs"][1:].tolist()
        assert h[0] == digest(gs.Box(-1, 1, (4,), np.float32), np.zeros(4)) != digest(BOX3, good)
        assert h[1] == h[3] == core.INVALID_DIGEST
        assert h[2] != digest(BOX3, good)  # numpy casts None to a float NaN of shape (): digested as such
        assert (cols["h_act"][1:] == core.INVALID_DIGEST).all()
        assert cols["h_rew"][5:8].tolist() == [core.INVALID_DIGEST] * 3
        assert cols["terminated"][8] and cols["truncated"][9] and not cols["truncated"][10]
        if keep_values:
            vals = stream.values
            assert vals["values_obs_0"].shape == (1 + len(steps), 3)
            assert not vals["values_obs_0"][1:5].any()  # absent or misshapen values are kept as zeros


def test_reset_never_raises_because_of_the_ledger(tmp_path):
    env = LedgerEnv(E.ScriptedEnv(BOX3, gs.Discrete(2), "bad", []), str(tmp_path), index=0)
    assert env.reset()[0] == "bad"
    env.close()
    assert read(env.ledger_path).streams[0].columns["h_obs"].tolist() == [core.INVALID_DIGEST]


# ---------------------------------------------------------------- spilling

def test_spills_and_assembles_the_whole_stream(tmp_path, small_memory):
    env = LedgerEnv(E.CountEnv(length=4, reuse=True), str(tmp_path), index=0, keep_values=True)
    truth = []
    for e in range(200):
        env.reset()
        truth.append(E.obs_value(e, 0))
        for t in range(1, 5):
            env.step(t % 3)
            truth.append(E.obs_value(e, t))
    spill = env.ledger_path + ".spill"
    segs = sorted(os.listdir(spill))
    # spilled many times; every 8 segments of one size are merged into one, which keeps the first's name
    assert env._recording.spills > 5 and segs[0] == "seg-000000.npz"
    assert len(segs) < env._recording.spills
    partial = read(env.ledger_path)
    assert partial.partial and 0 < len(partial.streams[0]) <= len(truth)
    env.close()
    assert not os.path.exists(spill)
    led = read(env.ledger_path)
    assert not led.partial
    stream = led.streams[0]
    assert stream.values["values_obs_0"].tolist() == [v.tolist() for v in truth]
    cols = stream.columns
    assert cols["h_obs"].tolist() == [digest(BOX3, v) for v in truth]
    assert cols["episode"].tolist() == [e for e in range(200) for _ in range(5)]
    assert cols["step"].tolist() == list(range(5)) * 200


def test_stale_segments_do_not_shadow_a_new_ledger(tmp_path, small_memory):
    """A killed run's segments (more events) must not be read in place of a later run's file."""
    old = LedgerEnv(E.CountEnv(), str(tmp_path), index=0)
    old.reset()
    for _ in range(1000):
        old.step(0)
    assert os.listdir(old.ledger_path + ".spill")
    old._recording.closed = True  # as if killed: no final file, its segments stay behind
    new = LedgerEnv(E.CountEnv(), str(tmp_path), index=0)
    new.reset()
    new.step(1)
    new.close()
    led = read(new.ledger_path)
    assert not led.partial and len(led.streams[0]) == 2


def test_stale_ledger_does_not_shadow_new_segments(tmp_path, run_python):
    """A new run killed after spilling: read() gives its segments, not the older, longer file."""
    E.run_random_episodes(str(tmp_path), steps=3000)
    assert len(read(str(tmp_path)).streams[0]) > 3000
    run_python("import os, envs_for_tests as E\n"
               "from stepledger import core\n"
               "core.set_memory_limit(4096)\n"
               "env = E.make_count_env(0, %r)\n"
               "env.reset()\n"
               "for a in range(500): env.step(a %% 3)\n"
               "os._exit(0)\n" % str(tmp_path))
    led = read(str(tmp_path))
    assert led.partial
    n = len(led.streams[0])
    assert 0 < n <= 501
    assert led.streams[0].columns["h_obs"][0] == digest(BOX3, E.obs_value(0, 0))


def test_runs_on_the_chosen_core(tmp_path, core_impl):
    env = LedgerEnv(E.CountEnv(), str(tmp_path), index=0)
    assert type(env._rec).__module__ == ("stepledger._fallback" if core_impl == "python" else "stepledger._core")
    env.close()


class _ClipsInPlace(gym.Env):
    """Clips the action array it is given in place, as some envs do."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Box(-2, 2, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        np.clip(action, -0.5, 0.5, out=action)
        return np.asarray(action, np.float32).copy(), float(action.sum()), False, False, {}


@pytest.mark.parametrize("keep_values", [False, True])
def test_action_is_recorded_as_received_before_the_env_changes_it(tmp_path, core_impl, keep_values):
    """An env that edits its action array in place is inside LedgerEnv: no difference."""
    d = str(tmp_path)
    envs = stepledger.LedgerVectorEnv(
        gym.vector.SyncVectorEnv([lambda: stepledger.LedgerEnv(_ClipsInPlace(), d, index=0, keep_values=keep_values)]),
        os.path.join(d, "trainer.npz"), keep_values=keep_values)
    envs.reset(seed=0)
    for t in range(5):
        envs.step(np.full((1, 2), 1.5 + t, np.float32))
    envs.close()
    report = stepledger.compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, str(report)


def test_values_are_not_kept_by_default_on_either_side(tmp_path):
    # issue 24: the default and the docs agree: both sides keep digests of observations and actions (rewards
    # and flags exactly) unless keep_values=True; the report then says "obs differs" and how to see the values
    from stepledger import LedgerVectorEnv, compare
    from stepledger.faults import FaultyEnv
    d = str(tmp_path)

    def make(i):
        env = LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=10), d, index=i)
        return FaultyEnv(env, "obs:f16", index=i, at=2, target=1) if i == 1 else env
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FaultyEnv around LedgerEnv: the placement warning
        envs = LedgerVectorEnv(gym.vector.SyncVectorEnv([lambda i=i: make(i) for i in range(2)]),
                               os.path.join(d, "trainer.npz"))
    envs.reset(seed=0)
    for _ in range(5):
        envs.step(np.zeros((2, 1), np.float32))
    envs.close()
    for name in ("env-0.npz", "env-1.npz", "trainer.npz"):
        led = read(os.path.join(d, name))
        assert led.meta[S.META_KEEP_VALUES] is False, name
        assert not [m for m in np.load(os.path.join(d, name)).files if m.startswith("values_")], name
    lines = str(compare(d, os.path.join(d, "trainer.npz"))).splitlines()
    assert lines[0] == "env 1, episode 0, step 3: obs differs", lines  # at=2 counts from step 0
    assert "hint: record with keep_values=True on both sides to see the observations and actions that differ" in lines
