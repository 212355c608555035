"""Small scripted envs and helpers for the trainer-side tests.

Importable by spawn and forkserver workers: everything a worker builds is a
module-level function of this module, called with picklable arguments.
"""

import functools
import os

import gymnasium as gym
import numpy as np
from gymnasium import spaces as gs

from stepledger import LedgerEnv, read
from stepledger.format import schema as S

# ---------------------------------------------------------------- spaces

SPACE_NAMES = ("box32", "box64", "image", "discrete", "multidiscrete", "multibinary", "dict", "tuple",
               "dict_tuple")
ACTION_NAMES = ("box", "discrete", "multidiscrete", "dict")
# SB3 VecEnvs support no nested observation spaces. Any action space goes: env i is sent actions[i].
SB3_SPACE_NAMES = ("box32", "box64", "image", "discrete", "multidiscrete", "multibinary", "dict", "tuple")
SB3_ACTION_NAMES = ("box", "discrete", "multidiscrete", "dict", "tuple", "dict_tuple")


def make_space(name):
    if name == "box32":
        return gs.Box(-10, 10, shape=(3,), dtype=np.float32)
    if name == "box64":
        return gs.Box(-10, 10, shape=(2, 2), dtype=np.float64)
    if name == "image":
        return gs.Box(0, 255, shape=(6, 5, 3), dtype=np.uint8)
    if name == "discrete":
        return gs.Discrete(7, start=-2)
    if name == "multidiscrete":
        return gs.MultiDiscrete([3, 5, 2])
    if name == "multibinary":
        return gs.MultiBinary(5)
    if name == "dict":
        return gs.Dict({"pos": gs.Box(-1, 1, shape=(2,), dtype=np.float32), "id": gs.Discrete(4),
                        "bits": gs.MultiBinary(3)})
    if name == "tuple":
        return gs.Tuple((gs.Box(-1, 1, shape=(2,), dtype=np.float32), gs.Discrete(3)))
    if name == "dict_tuple":
        return gs.Dict({"z": gs.Tuple((gs.Discrete(5), gs.Box(-1, 1, shape=(2,), dtype=np.float64))),
                        "a": gs.Box(-1, 1, shape=(1,), dtype=np.float32)})
    if name == "box":
        return gs.Box(-1, 1, shape=(2,), dtype=np.float32)
    if name == "action_dict":
        return gs.Dict({"move": gs.Box(-1, 1, shape=(2,), dtype=np.float32), "fire": gs.Discrete(2)})
    raise ValueError(name)


def make_action_space(name):
    return make_space("action_dict" if name == "dict" else name)


# ---------------------------------------------------------------- envs

ENDS = {"term": (True, False), "trunc": (False, True), "both": (True, True)}


class ScriptedEnv(gym.Env):
    """An env whose episodes end on a script.

    Episode k lasts ``lengths[k % len(lengths)]`` steps (or a random length in
    [1, max_len] when ``lengths`` is None) and ends as ``ends[k % len(ends)]``:
    "term", "trunc" or "both". Observations are drawn from the space with the
    env's own generator; rewards are float64 that do not round-trip through
    float32. ``float64_obs`` returns float64 arrays for float32 Box leaves.
    ``reuse_obs`` (Box obs only) returns one array, mutated in place on every
    step and reset (Gymnasium issue 1132).
    """

    metadata = {"render_modes": []}

    def __init__(self, obs="box32", act="box", lengths=(3,), ends=("term",), seed=0, float64_obs=False,
                 reuse_obs=False, max_len=6, obs_space=None, act_space=None):
        # obs_space and act_space, when given, replace the named spaces
        self.observation_space = make_space(obs) if obs_space is None else obs_space
        self.action_space = make_action_space(act) if act_space is None else act_space
        self.lengths = lengths
        self.ends = ends
        self.max_len = max_len
        self.float64_obs = float64_obs
        self.reuse_obs = reuse_obs
        self._rng = np.random.default_rng(seed)
        self.observation_space.seed(int(self._rng.integers(2 ** 31)))
        self._episode = -1
        self._t = 0
        self._len = 1
        self._buf = None

    def _obs(self):
        value = self.observation_space.sample()
        if self.float64_obs:
            value = _widen(self.observation_space, value, self._rng)
        if self.reuse_obs:
            if self._buf is None:
                self._buf = np.zeros(self.observation_space.shape, self.observation_space.dtype)
            self._buf[...] = value
            return self._buf
        return value

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
            self.observation_space.seed(int(self._rng.integers(2 ** 31)))
        self._episode += 1
        self._t = 0
        if self.lengths is None:
            self._len = int(self._rng.integers(1, self.max_len + 1))
        else:
            self._len = int(self.lengths[self._episode % len(self.lengths)])
        return self._obs(), {"episode": self._episode}

    def step(self, action):
        self._t += 1
        reward = float(self._rng.standard_normal())
        if self._t >= self._len:
            terminated, truncated = ENDS[self.ends[self._episode % len(self.ends)]]
        else:
            terminated, truncated = False, False
        return self._obs(), reward, terminated, truncated, {"t": self._t}


class ScalarObsEnv(gym.Env):
    """A Box(3,) env that returns a scalar observation (a shape fault of the env).

    The vector envs broadcast it into the batch, so the trainer receives
    [x, x, x]: a value the env never gave."""

    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = gs.Box(-10, 10, shape=(3,), dtype=np.float32)
        self.action_space = gs.Discrete(2)
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self._t += 1
        obs = np.float32(1.5) if self._t == 2 else np.full(3, self._t, np.float32)
        return obs, 1.0, self._t >= 4, False, {}


def make_scalar_obs_env(directory, index):
    return LedgerEnv(ScalarObsEnv(), directory, index=index)


def _widen(space, value, rng):
    """The value with every float32 Box leaf replaced by float64 values that round."""
    if isinstance(space, gs.Box) and space.dtype == np.float32:
        return np.asarray(value, np.float64) + rng.uniform(-1e-4, 1e-4, size=space.shape)
    if isinstance(space, gs.Dict):
        return {k: _widen(space.spaces[k], value[k], rng) for k in space.spaces}
    if isinstance(space, gs.Tuple):
        return tuple(_widen(s, v, rng) for s, v in zip(space.spaces, value))
    return value


def make_ledger_env(directory, index, reward_dtype=np.float32, keep_values=False, live=False, **kwargs):
    """A ScriptedEnv with LedgerEnv outermost, as an env factory builds it."""
    kwargs.setdefault("seed", 1000 + index)
    return LedgerEnv(ScriptedEnv(**kwargs), directory, index=index, reward_dtype=reward_dtype,
                     keep_values=keep_values, live=live)


def make_ledger_gym(env_id, directory, index, **kwargs):
    return LedgerEnv(gym.make(env_id, **kwargs), directory, index=index)


def factories(directory, n, **kwargs):
    return [functools.partial(make_ledger_env, directory, i, **kwargs) for i in range(n)]


# ---------------------------------------------------------------- vector wrappers with faults


class DropFinalObs(gym.vector.VectorWrapper):
    """Deletes info['final_obs'] (a vector env that does not report it)."""

    def step(self, actions):
        obs, rew, term, trunc, info = self.env.step(actions)
        info = dict(info)
        info.pop("final_obs", None)
        info.pop("_final_obs", None)
        return obs, rew, term, trunc, info


# ---------------------------------------------------------------- comparing


def _compare_module():
    try:
        from stepledger.report.compare import compare
    except ImportError:
        return None
    return compare


def streams(path):
    ledger = read(path)
    try:
        settings = {k: v for k, v in ledger.meta.items() if k not in S.PER_FILE_META}  # not writer, times, pid
        return settings, {i: s.columns for i, s in ledger.streams.items()}
    finally:
        ledger.close()


def differences(env_dir, trainer_file):
    """env index -> (first differing event, [columns that differ there]) or a str for length/presence.

    An empty dict means the two sides agree exactly.
    """
    _, env = streams(env_dir)
    _, tr = streams(trainer_file)
    out = {}
    for i in sorted(set(env) | set(tr)):
        if i not in env or i not in tr:
            out[i] = "only on the %s side" % ("trainer" if i in tr else "env")
            continue
        a, b = env[i], tr[i]
        n = min(len(a["kind"]), len(b["kind"]))
        first = None
        for name in S.FILE_COLUMN_NAMES:
            d = np.flatnonzero(a[name][:n] != b[name][:n])
            if d.size and (first is None or d[0] < first):
                first = int(d[0])
        if first is not None:
            cols = [name for name in S.EVENT_COLUMN_NAMES if a[name][first] != b[name][first]]
            out[i] = (first, cols)
        elif len(a["kind"]) != len(b["kind"]):
            out[i] = "length %d on the env side, %d on the trainer side" % (len(a["kind"]), len(b["kind"]))
    return out


def assert_clean(env_dir, trainer_file, n_envs=None):
    """The two sides agree exactly: same envs, every column equal."""
    _, env = streams(env_dir)
    _, tr = streams(trainer_file)
    assert sorted(env) == sorted(tr), (sorted(env), sorted(tr))
    if n_envs is not None:
        assert sorted(tr) == list(range(n_envs))
    for i in env:
        assert set(env[i]) == set(tr[i])
        for name in env[i]:
            assert np.array_equal(env[i][name], tr[i][name]), (i, name, differences(env_dir, trainer_file))
        assert len(env[i]["kind"]) > 0
    if os.environ.get("STEPLEDGER_COUNT_CLEAN"):  # counts the clean runs of a test session
        with open(os.environ["STEPLEDGER_COUNT_CLEAN"], "a") as f:
            f.write("%s\n" % trainer_file)
    compare = _compare_module()
    if compare is not None:
        report = compare(env_dir, trainer_file)
        assert report.ok, str(report)
        assert report
    return sum(len(c["kind"]) for c in env.values())


_COLUMN_FIELD = {column: field for field, column in S.FIELD_COLUMNS.items()}


def assert_differs(env_dir, trainer_file, expected):
    """The first difference of each env is exactly as ``expected``: {env: (event, [columns])}.

    Envs not in ``expected`` must agree. With stepledger.compare present, its
    report must name the same event and fields.
    """
    found = differences(env_dir, trainer_file)
    assert found == expected, (found, expected)
    compare = _compare_module()
    if compare is not None:
        report = compare(env_dir, trainer_file)
        assert not report.ok
        by_env = report.by_env()
        assert sorted(by_env) == sorted(expected), str(report)
        for env, (event, columns) in expected.items():
            d = by_env[env]
            assert d.event == event, (env, d.event, event, str(report))
            if "kind" in columns:
                assert d.what == "kind", str(report)
            else:
                assert d.what == "fields", str(report)
                assert set(d.fields) == {_COLUMN_FIELD[c] for c in columns}, str(report)
    return found


def event_at(env_dir, env_index, episode, step):
    """Index of the event at (episode, step) in an env's stream on the env side."""
    _, env = streams(env_dir)
    c = env[env_index]
    hits = np.flatnonzero((c["episode"] == episode) & (c["step"] == step))
    assert hits.size == 1, (episode, step)
    return int(hits[0])


def pure_python_env():
    env = dict(os.environ)
    env[S.ENV_PUREPYTHON] = "1"
    return env


# ---------------------------------------------------------------- scenarios

VECTOR_KINDS = ("sync", "async_shm", "async")


def make_vector(kind, fns, mode, context=None):
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
    mode = AutoresetMode(mode) if isinstance(mode, str) else mode
    if kind == "sync":
        return SyncVectorEnv(fns, autoreset_mode=mode)
    return AsyncVectorEnv(fns, autoreset_mode=mode, shared_memory=(kind == "async_shm"), context=context)


def run_gym(directory, kind="sync", mode="NextStep", n=3, steps=24, obs="box32", act="box",
            lengths=(3,), ends=("term",), resets=None, seed=0, keep_values=False, inner=None, context=None,
            reward_dtype=np.float32, avoid_pending=False, float64_actions=False, **env_kwargs):
    """Drive a LedgerVectorEnv around a Gymnasium vector env of ScriptedEnvs; returns the trainer file.

    Env i plays ``lengths`` and ``ends`` rotated by i, so that envs end their
    episodes at different steps. ``resets`` maps a step number to what to do
    after that step: "all", ("seed", s), ("mask", [bool]...) or "ended" (reset
    the envs whose episode ended at that step, if any). With ``avoid_pending``
    an explicit reset never touches an env whose episode has just ended: it
    waits a step, and "ended" resets are skipped. ``float64_actions`` sends
    Box actions as float64 values that round to the float32 space.
    """
    from stepledger import LedgerVectorEnv
    fns = []
    for i in range(n):
        lens = None if lengths is None else tuple(np.roll(lengths, -i))
        fns.append(functools.partial(make_ledger_env, directory, i, obs=obs, act=act, lengths=lens,
                                     ends=tuple(np.roll(ends, -i)), keep_values=keep_values,
                                     reward_dtype=reward_dtype, **env_kwargs))
    venv = make_vector(kind, fns, mode, context)
    if inner is not None:
        venv = inner(venv)
    path = os.path.join(directory, "trainer.npz")
    envs = LedgerVectorEnv(venv, path, keep_values=keep_values, reward_dtype=reward_dtype)
    envs.action_space.seed(seed)
    actions = [envs.action_space.sample() for _ in range(steps)]
    if float64_actions:
        rng = np.random.default_rng(seed)
        actions = [_widen(envs.action_space, a, rng) for a in actions]
    resets = resets or {}
    try:
        envs.reset(seed=seed)
        deferred = None
        for t in range(steps):
            _, _, term, trunc, _ = envs.step(actions[t])
            what = deferred if deferred is not None else resets.get(t)
            deferred = None
            if what is None:
                continue
            if avoid_pending:
                if what == "ended":
                    continue
                touched = np.ones(n, bool) if what == "all" or what[0] == "seed" else np.array(what[1], bool)
                if np.any(np.logical_or(term, trunc) & touched):
                    deferred = what
                    continue
            if what == "all":
                envs.reset()
            elif what == "ended":
                mask = np.logical_or(term, trunc)
                if mask.any():
                    envs.reset(options={"reset_mask": mask})
            elif what[0] == "seed":
                envs.reset(seed=what[1])
            elif what[0] == "mask":
                envs.reset(options={"reset_mask": np.array(what[1], dtype=np.bool_)})
    finally:
        envs.close()
    return path


def sb3_action_batch(values, layout):
    """One vector step's actions, one value per env, in a batch layout SB3's VecEnvs accept
    (they send env i ``batch[i]``): "stack" (one array; array-like spaces only), "list",
    "tuple" or "object" (an object array holding the values)."""
    if layout == "stack":
        return np.stack(values)
    if layout == "list":
        return list(values)
    if layout == "tuple":
        return tuple(values)
    if layout == "object":
        batch = np.empty(len(values), dtype=object)
        for i, v in enumerate(values):
            batch[i] = v
        return batch
    raise ValueError(layout)


def run_sb3(directory, kind="dummy", n=3, steps=24, obs="box32", act="box", lengths=(3,), ends=("term",),
            resets=None, seed=0, keep_values=False, inner=None, start_method="fork", reward_dtype=np.float32,
            action_batch=None, live=False, **env_kwargs):
    """Drive stepledger.sb3.LedgerVecEnv around DummyVecEnv or SubprocVecEnv; returns the trainer file.

    ``resets`` maps a step number to what to do after that step: "all",
    ("seed", s) or ("options", {...}), the last two through the VecEnv's
    seed() and set_options(), which apply to the next reset only.
    ``action_batch`` is the layout of each step's actions (see
    sb3_action_batch; by default "stack" where the space allows it, else
    "list"). ``live`` checks tokens as they arrive (a fault raises).
    """
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from stepledger.sb3 import LedgerVecEnv
    fns = []
    for i in range(n):
        lens = None if lengths is None else tuple(np.roll(lengths, -i))
        fns.append(functools.partial(make_ledger_env, directory, i, obs=obs, act=act, lengths=lens,
                                     ends=tuple(np.roll(ends, -i)), keep_values=keep_values,
                                     reward_dtype=reward_dtype, live=live, **env_kwargs))
    venv = DummyVecEnv(fns) if kind == "dummy" else SubprocVecEnv(fns, start_method=start_method)
    if inner is not None:
        venv = inner(venv)
    path = os.path.join(directory, "trainer.npz")
    envs = LedgerVecEnv(venv, path, keep_values=keep_values, reward_dtype=reward_dtype, live=live)
    space = env_kwargs.get("act_space") or make_action_space(act)
    space.seed(seed)
    if action_batch is None:
        action_batch = "stack" if isinstance(space, (gs.Box, gs.Discrete, gs.MultiDiscrete, gs.MultiBinary)) else "list"
    actions = [sb3_action_batch([space.sample() for _ in range(n)], action_batch) for _ in range(steps)]
    resets = resets or {}
    try:
        envs.seed(seed)
        envs.reset()
        for t in range(steps):
            envs.step(actions[t])
            what = resets.get(t)
            if what is None:
                continue
            if what != "all":
                if what[0] == "seed":
                    envs.seed(what[1])
                else:
                    envs.set_options(what[1])
            envs.reset()
    finally:
        envs.close()
    return path


def main(argv):
    """``python trainer_envs.py DIRECTORY JSON``: run_gym in a fresh process (for the pure-Python core)."""
    import json
    import stepledger
    kwargs = json.loads(argv[1])
    for key in ("lengths", "ends"):
        if key in kwargs and kwargs[key] is not None:
            kwargs[key] = tuple(kwargs[key])
    if "resets" in kwargs:
        kwargs["resets"] = {int(k): (v if isinstance(v, str) else tuple(v)) for k, v in kwargs["resets"].items()}
    if kwargs.pop("sb3", False):
        run_sb3(argv[0], **kwargs)
    else:
        run_gym(argv[0], **kwargs)
    print(stepledger.CORE)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
