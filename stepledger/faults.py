"""Boundary faults on purpose: an injector to prove that a stack's ledgers catch them.

The faults are those of the paper behind stepledger (Gou and Lu, 2026, Sec. III):

- ``obs:``, ``action:``, ``reward:``, ``final-obs:`` + ``zero`` (replaced by
  zeros), ``stale`` (the previous step's value), ``swap`` (another env's
  value; trainer side only) or ``f16`` (rounded through float16);
- ``action:clip`` (clipped to half the action range);
- ``terminated:spurious``, ``truncated:as-term``, ``truncated:drop``,
  ``terminated:drop``, ``terminated:as-trunc``;
- ``step:fill`` (the env is not stepped and the previous feedback is sent
  again; env side only).

Two places to put one: ``FaultyEnv`` wraps ``LedgerEnv`` in the worker (the
faults happen on the env's side of the wire), ``FaultyVectorEnv`` (Gymnasium)
and ``FaultyVecEnv`` (SB3, in ``stepledger.sb3``'s import-free form
``make_faulty_vec_env``) sit between the vector env and the trainer-side
ledger. A dose is ``"one"`` (the first opportunity at or after step ``at`` of
env ``env``), a fraction such as ``0.01`` (each opportunity drawn from a
generator seeded with ``seed``, so the same cells are hit at every training
seed) or ``"all"``. A fault that would change nothing at a cell (zeroing a
zero) waits for the next one. The injector records where it first changed a
value: ``injector.first`` (env, episode, step, field), also written as JSON to
``record`` if given, for injectors that live in worker processes.
"""

import json
import os

import gymnasium as gym
import numpy as np
from gymnasium import spaces as gs

VALUE_FIELDS = ("obs", "action", "reward", "final-obs")
VALUE_WAYS = ("zero", "stale", "swap", "f16")
FLAG_FAULTS = ("terminated:spurious", "truncated:as-term", "truncated:drop", "terminated:drop", "terminated:as-trunc")
FAULTS = tuple("%s:%s" % (f, w) for f in VALUE_FIELDS for w in VALUE_WAYS) + ("action:clip",) + FLAG_FAULTS + (
    "step:fill",)
ENV_SIDE_FAULTS = tuple(f for f in FAULTS if not f.endswith(":swap"))
TRAINER_SIDE_FAULTS = tuple(f for f in FAULTS if f != "step:fill")
# The field compare names first when the fault is caught.
REPORTED_FIELD = {"final-obs": "obs", "step": None}


def reported_fields(fault):
    """Fields compare may name at the faulty event (any one of them means located)."""
    field, way = fault.split(":")
    if field in ("obs", "final-obs"):
        return {"obs"}
    if field == "action":
        return {"action"}
    if field == "reward":
        return {"reward"}
    if field in ("terminated", "truncated"):
        return {"terminated", "truncated"}
    return {"kind", "action", "obs", "reward", "terminated", "truncated"}  # step:fill


def check_fault(fault, allowed=FAULTS, where="fault"):
    if fault not in allowed:
        raise ValueError("%s: unknown or unsupported fault %r; choose one of %s" % (where, fault, ", ".join(allowed)))
    return fault


class Dose:
    """Which opportunities a fault takes: one, a seeded fraction, or all."""

    def __init__(self, dose="one", at=10, env=0, seed=0):
        if dose == "one" or dose == "all":
            self.kind, self.p = dose, None
        else:
            try:
                p = float(dose)
            except (TypeError, ValueError):
                raise ValueError("dose must be 'one', 'all' or a fraction in (0, 1], got %r" % (dose,)) from None
            if not 0 < p <= 1:
                raise ValueError("dose must be 'one', 'all' or a fraction in (0, 1], got %r" % (dose,))
            self.kind, self.p = "fraction", p
        self.at, self.env, self.seed = int(at), int(env), int(seed)
        self._rngs = {}
        self.done = False

    def draw(self, env, cell):
        """Whether the fault may hit env ``env`` at its step counter ``cell``."""
        if self.kind == "all":
            return True
        if self.kind == "one":
            return not self.done and env == self.env and cell >= self.at
        rng = self._rngs.get(env)
        if rng is None:
            rng = self._rngs[env] = np.random.default_rng([self.seed, env])
        return bool(rng.random() < self.p)  # one draw per cell, so cells do not depend on the run

    def took(self):
        if self.kind == "one":
            self.done = True


def _changed(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape != b.shape or a.dtype != b.dtype or not np.array_equal(a, b, equal_nan=True)


def _map(value, fn):
    if isinstance(value, dict):
        return type(value)((k, _map(v, fn)) for k, v in value.items())
    if isinstance(value, tuple):
        return tuple(_map(v, fn) for v in value)
    return fn(value)


def _zero(value):
    return _map(value, lambda v: np.zeros_like(np.asarray(v))
                if isinstance(v, np.ndarray) else type(v)(0) if isinstance(v, (int, float, np.generic)) else v)


def _f16(value):
    def one(v):
        arr = np.asarray(v)
        if arr.dtype.kind != "f":
            return v
        out = arr.astype(np.float16).astype(arr.dtype)
        return out if isinstance(v, np.ndarray) else out[()]
    return _map(value, one)


def _clip_half(action, space):
    if not isinstance(space, gs.Box):
        return action
    low, high = space.low, space.high
    mid, half = (low + high) / 2.0, (high - low) / 4.0
    return np.clip(action, mid - half, mid + half).astype(space.dtype)


def _copy(value):
    return _map(value, lambda v: np.array(v, copy=True) if isinstance(v, np.ndarray) else v)


def changed_value(value, way, previous, space=None, other=None):
    """The faulty version of ``value``, or None when this fault cannot change it here."""
    if way == "zero":
        new = _zero(value)
    elif way == "f16":
        new = _f16(value)
    elif way == "stale":
        if previous is None:
            return None
        new = _copy(previous)
    elif way == "swap":
        if other is None:
            return None
        new = _copy(other)
    elif way == "clip":
        new = _clip_half(value, space)
    else:
        raise ValueError(way)
    flat_new = _flat(new)
    flat_old = _flat(value)
    if len(flat_new) != len(flat_old) or any(_changed(a, b) for a, b in zip(flat_new, flat_old)):
        return new
    return None


def _flat(value):
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in _flat(value[k])]
    if isinstance(value, tuple):
        return [x for v in value for x in _flat(v)]
    return [value]


def changed_reward(reward, way, previous, other=None):
    """The faulty reward, or None when the change would not survive a float32 cast.

    Ledgers keep rewards as float32 by default: a change that vanishes there
    (a reward within float16 precision of itself, say) is not a fault a
    trainer could have seen, so the injector waits for the next cell.
    """
    new = changed_value(np.float64(reward), way, None if previous is None else np.float64(previous),
                        other=None if other is None else np.float64(other))
    if new is None or np.float32(new) == np.float32(reward):
        return None
    return new


def changed_flags(fault, terminated, truncated):
    """Faulty (terminated, truncated), or None when the fault has no opportunity here."""
    terminated, truncated = bool(terminated), bool(truncated)
    if fault == "terminated:spurious":
        return (True, truncated) if not terminated and not truncated else None
    if fault == "truncated:as-term":
        return (True, False) if truncated and not terminated else None
    if fault == "truncated:drop":
        return (terminated, False) if truncated and not terminated else None
    if fault == "terminated:drop":
        return (False, truncated) if terminated else None
    if fault == "terminated:as-trunc":
        return (False, True) if terminated else None
    raise ValueError(fault)


class _Where:
    """Records the first change: env, episode, step, field; optionally to a JSON file."""

    def __init__(self, record):
        self.first = None
        self.by_env = {}  # env -> its first change
        self.count = 0
        self.record = os.fspath(record) if record is not None else None

    def hit(self, env, episode, step, fault):
        self.count += 1
        if int(env) not in self.by_env:
            field = fault.split(":")[0]
            self.by_env[int(env)] = {"env": int(env), "episode": int(episode), "step": int(step), "fault": fault,
                                     "field": {"final-obs": "obs"}.get(field, field)}
        if self.first is None:
            self.first = self.by_env[int(env)]
            if self.record:
                os.makedirs(os.path.dirname(os.path.abspath(self.record)) or ".", exist_ok=True)
                tmp = self.record + ".tmp-%d" % os.getpid()
                with open(tmp, "w") as f:
                    json.dump(self.first, f)
                os.replace(tmp, self.record)


def read_record(path):
    """The first change an injector in another process recorded, or None."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class FaultyEnv(gym.Wrapper):
    """Injects one boundary fault on the env side, outside LedgerEnv in the worker.

    Example: ``FaultyEnv(LedgerEnv(env, "ledger", index=i), "reward:f16", index=i)``.

    Args:
        env: the env, already wrapped in LedgerEnv.
        fault: one of ``ENV_SIDE_FAULTS``.
        index: the env's index in the vector env.
        dose: "one", "all" or a fraction.
        at: with dose "one", the first step counter (over the env's life) that may be hit.
        target: with dose "one", the env that is hit.
        seed: the fault generator's seed, for fractional doses.
        record: a JSON file to write where the fault first changed a value.
    """

    def __init__(self, env, fault, index, dose="one", at=10, target=0, seed=0, record=None):
        super().__init__(env)
        self.fault = check_fault(fault, ENV_SIDE_FAULTS, "FaultyEnv")
        self.field, self.way = fault.split(":")
        self.index = int(index)
        self.dose = Dose(dose, at, target, seed)
        self.where = _Where(record)
        self._cell = 0
        self._episode, self._step = -1, 0
        self._prev = None  # (obs, reward) of the previous step, for stale faults and fills
        self._prev_action = None

    @property
    def first(self):
        return self.where.first

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._episode, self._step = self._episode + 1, 0
        self._prev = (_copy(obs), 0.0)
        return obs, info

    def _try(self):
        return self.dose.draw(self.index, self._cell)

    def step(self, action):
        cell_ok = self._try()
        self._cell += 1
        pos = (self._episode, self._step + 1)
        if self.field == "step" and cell_ok and self._prev is not None:
            self.dose.took()
            self.where.hit(self.index, pos[0], pos[1], self.fault)
            obs, reward = self._prev
            return _copy(obs), reward, False, False, {}
        if self.field == "action" and cell_ok:
            new = changed_value(action, self.way, self._prev_action, self.action_space)
            if new is not None:
                self.dose.took()
                self.where.hit(self.index, pos[0], pos[1], self.fault)
                self._prev_action = _copy(action)
                action = new
                cell_ok = False
            else:
                self._prev_action = _copy(action)
        elif self.field == "action":
            self._prev_action = _copy(action)
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._step += 1
        ended = terminated or truncated
        true_obs, true_reward = obs, reward
        if cell_ok:
            new = None
            if self.field == "obs" and not ended or self.field == "final-obs" and ended:
                prev = self._prev[0] if self._prev is not None else None
                new = changed_value(obs, self.way, prev)
                if new is not None:
                    obs = new
            elif self.field == "reward":
                prev = self._prev[1] if self._prev is not None else None
                new = changed_reward(reward, self.way, prev)
                if new is not None:
                    reward = float(new)
            elif self.field in ("terminated", "truncated"):
                new = changed_flags(self.fault, terminated, truncated)
                if new is not None:
                    terminated, truncated = new
            if new is not None:
                self.dose.took()
                self.where.hit(self.index, pos[0], pos[1], self.fault)
        self._prev = (_copy(true_obs), true_reward)
        return obs, reward, terminated, truncated, info


class FaultyVectorEnv(gym.vector.VectorWrapper):
    """Injects one boundary fault on the trainer side of a Gymnasium vector env.

    It goes between the vector env and LedgerVectorEnv:
    ``LedgerVectorEnv(FaultyVectorEnv(envs, "obs:swap"), path)``. Under
    NEXT_STEP it leaves autoreset steps alone; under SAME_STEP, final-obs
    faults change ``info["final_obs"]``. Arguments as for FaultyEnv, and
    ``autoreset_mode`` as LedgerVectorEnv reads it.
    """

    def __init__(self, env, fault, dose="one", at=10, target=0, seed=0, record=None, autoreset_mode=None):
        super().__init__(env)
        from .vector import NEXT_STEP, resolve_autoreset_mode
        self.fault = check_fault(fault, TRAINER_SIDE_FAULTS, "FaultyVectorEnv")
        self.field, self.way = fault.split(":")
        self.mode = resolve_autoreset_mode(env, autoreset_mode, "FaultyVectorEnv")
        self.next_step = self.mode == NEXT_STEP
        self.dose = Dose(dose, at, target, seed)
        self.where = _Where(record)
        n = self.num_envs
        self._cells = np.zeros(n, dtype=np.int64)
        self._episode = np.full(n, -1, dtype=np.int64)
        self._step = np.zeros(n, dtype=np.int64)
        self._pending = np.zeros(n, dtype=bool)
        self._prev_obs = [None] * n
        self._prev_rew = [None] * n
        self._prev_act = [None] * n

    @property
    def first(self):
        return self.where.first

    def reset(self, *, seed=None, options=None):
        mask = None
        if options and options.get("reset_mask") is not None:
            mask = np.array(options["reset_mask"], dtype=bool)
        obs, info = self.env.reset(seed=seed, options=options)
        for i in range(self.num_envs):
            if mask is None or mask[i]:
                self._episode[i] += 1
                self._step[i] = 0
                self._pending[i] = False
                self._prev_obs[i] = _copy(_row(obs, i))
                self._prev_rew[i] = 0.0
        return obs, info

    def step(self, actions):
        n = self.num_envs
        hits = [self.dose.draw(i, int(self._cells[i])) for i in range(n)]
        self._cells += 1
        resetting = self._pending.copy() if self.next_step else np.zeros(n, bool)
        if self.field == "action":
            actions = _copy(actions)
            originals = [_copy(_row(actions, i)) for i in range(n)]
            for i in range(n):
                if hits[i] and not resetting[i]:
                    other = originals[(i + 1) % n] if n > 1 else None
                    new = changed_value(originals[i], self.way, self._prev_act[i], self.single_action_space, other)
                    if new is not None:
                        actions = _set_row(actions, i, new)
                        self._hit(i, int(self._episode[i]), int(self._step[i]) + 1)
                        hits[i] = False
            for i in range(n):
                if not resetting[i]:
                    self._prev_act[i] = originals[i]
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        true_obs = [_copy(_row(obs, i)) for i in range(n)]
        true_rew = [float(rewards[i]) for i in range(n)]
        ended = np.logical_or(terminated, truncated)
        finals = info.get("final_obs") if not self.next_step else None
        if self.field in ("obs", "final-obs", "reward", "terminated", "truncated"):
            rewards = np.array(rewards, copy=True)
            terminated = np.array(terminated, copy=True)
            truncated = np.array(truncated, copy=True)
            if self.field == "final-obs" and finals is not None:
                finals = finals.copy()
                info = dict(info)
                info["final_obs"] = finals
            for i in range(n):
                if not hits[i] or resetting[i]:
                    continue
                pos = (int(self._episode[i]), int(self._step[i]) + 1)
                other = (i + 1) % n if n > 1 else None
                if self.field == "obs" and not ended[i] or self.field == "final-obs" and ended[i] and self.next_step:
                    new = changed_value(_row(obs, i), self.way, self._prev_obs[i],
                                        other=None if other is None else true_obs[other])
                    if new is not None:
                        obs = _set_row(_copy(obs), i, new)
                        self._hit(i, *pos)
                elif self.field == "final-obs" and ended[i] and finals is not None:
                    other_final = finals[other] if other is not None and ended[other] else (
                        None if other is None else true_obs[other])
                    new = changed_value(finals[i], self.way, self._prev_obs[i], other=other_final)
                    if new is not None:
                        finals[i] = new
                        self._hit(i, *pos)
                elif self.field == "reward":
                    new = changed_reward(rewards[i], self.way, self._prev_rew[i],
                                         other=None if other is None else true_rew[other])
                    if new is not None:
                        rewards[i] = new
                        self._hit(i, *pos)
                elif self.field in ("terminated", "truncated"):
                    new = changed_flags(self.fault, terminated[i], truncated[i])
                    if new is not None:
                        terminated[i], truncated[i] = new
                        self._hit(i, *pos)
        # positions as the env side counts them, from the true flags
        for i in range(n):
            if resetting[i]:
                self._episode[i] += 1
                self._step[i] = 0
                self._pending[i] = False
            else:
                self._step[i] += 1
                if self.next_step:
                    self._pending[i] = bool(ended[i])
                elif ended[i]:
                    self._episode[i] += 1
                    self._step[i] = 0
            self._prev_obs[i] = true_obs[i] if self.next_step or not ended[i] else _copy(
                finals[i] if finals is not None else true_obs[i])
            self._prev_rew[i] = true_rew[i]
        return obs, rewards, terminated, truncated, info

    def _hit(self, env, episode, step):
        self.dose.took()
        self.where.hit(env, episode, step, self.fault)


def _row(batch, i):
    if isinstance(batch, dict):
        return {k: _row(v, i) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_row(v, i) for v in batch)
    return batch[i]


def _set_row(batch, i, value):
    if isinstance(batch, dict):
        for k in batch:
            _set_row(batch[k], i, value[k])
        return batch
    if isinstance(batch, tuple):
        for b, v in zip(batch, value):
            _set_row(b, i, v)
        return batch
    batch[i] = value
    return batch


try:  # the SB3 injector exists only where SB3 is installed
    from stable_baselines3.common.vec_env import VecEnvWrapper as _VecEnvWrapper
except ImportError:  # pragma: no cover
    _VecEnvWrapper = None

if _VecEnvWrapper is not None:

    class FaultyVecEnv(_VecEnvWrapper):
        """Injects one boundary fault on the trainer side of an SB3 VecEnv.

        It goes between the VecEnv and LedgerVecEnv:
        ``LedgerVecEnv(FaultyVecEnv(venv, "reward:swap"), path)``. Arguments as
        for FaultyEnv.
        """

        def __init__(self, venv, fault, dose="one", at=10, target=0, seed=0, record=None):
            super().__init__(venv)
            self.fault = check_fault(fault, TRAINER_SIDE_FAULTS, "FaultyVecEnv")
            self.field, self.way = fault.split(":")
            self.dose = Dose(dose, at, target, seed)
            self.where = _Where(record)
            n = self.num_envs
            self._cells = np.zeros(n, dtype=np.int64)
            self._episode = np.full(n, -1, dtype=np.int64)
            self._step = np.zeros(n, dtype=np.int64)
            self._prev_obs = [None] * n
            self._prev_rew = [None] * n
            self._prev_act = [None] * n
            self._hits = [False] * n

        @property
        def first(self):
            return self.where.first

        def reset(self):
            obs = self.venv.reset()
            self._episode += 1
            self._step[:] = 0
            self._prev_obs = [_copy(_row(obs, i)) for i in range(self.num_envs)]
            self._prev_rew = [0.0] * self.num_envs
            return obs

        def step_async(self, actions):
            n = self.num_envs
            self._hits = [self.dose.draw(i, int(self._cells[i])) for i in range(n)]
            self._cells += 1
            if self.field == "action":
                actions = np.array(actions, copy=True)
                originals = [np.array(actions[i], copy=True) for i in range(n)]
                for i in range(n):
                    if self._hits[i]:
                        other = originals[(i + 1) % n] if n > 1 else None
                        new = changed_value(originals[i], self.way, self._prev_act[i], self.action_space, other)
                        if new is not None:
                            actions[i] = new
                            self._hit(i, int(self._episode[i]), int(self._step[i]) + 1)
                            self._hits[i] = False
                self._prev_act = originals
            self.venv.step_async(actions)

        def step_wait(self):
            obs, rewards, dones, infos = self.venv.step_wait()
            n = self.num_envs
            true_dones = np.array(dones, dtype=bool)
            true_obs = [_copy(_row(obs, i)) for i in range(n)]
            true_rew = [float(rewards[i]) for i in range(n)]
            finals = [infos[i].get("terminal_observation") if dones[i] else None for i in range(n)]
            if self.field != "action":
                rewards = np.array(rewards, copy=True)
                dones = np.array(dones, copy=True)
                infos = list(infos)
                for i in range(n):
                    if not self._hits[i]:
                        continue
                    pos = (int(self._episode[i]), int(self._step[i]) + 1)
                    other = (i + 1) % n if n > 1 else None
                    new = None
                    if self.field == "obs" and not dones[i]:
                        new = changed_value(true_obs[i], self.way, self._prev_obs[i],
                                            other=None if other is None else true_obs[other])
                        if new is not None:
                            obs = _set_row(_copy(obs), i, new)
                    elif self.field == "final-obs" and dones[i] and finals[i] is not None:
                        other_val = None
                        if other is not None:
                            other_val = finals[other] if dones[other] and finals[other] is not None else true_obs[other]
                        new = changed_value(finals[i], self.way, self._prev_obs[i], other=other_val)
                        if new is not None:
                            infos[i] = dict(infos[i], terminal_observation=new)
                    elif self.field == "reward":
                        new = changed_reward(rewards[i], self.way, self._prev_rew[i],
                                             other=None if other is None else true_rew[other])
                        if new is not None:
                            rewards[i] = new
                    elif self.field in ("terminated", "truncated"):
                        trunc = bool(infos[i].get("TimeLimit.truncated", False)) if dones[i] else False
                        term = bool(dones[i]) and not trunc
                        new = changed_flags(self.fault, term, trunc)
                        if new is not None:
                            te, tr = new
                            info = dict(infos[i])
                            info["TimeLimit.truncated"] = tr and not te
                            if (te or tr) and not dones[i]:
                                info["terminal_observation"] = true_obs[i]
                            dones[i] = te or tr
                            infos[i] = info
                    if new is not None:
                        self._hit(i, *pos)
            for i in range(n):
                self._step[i] += 1
                self._prev_rew[i] = true_rew[i]
                self._prev_obs[i] = true_obs[i] if finals[i] is None else _copy(finals[i])
                if true_dones[i]:
                    self._episode[i] += 1
                    self._step[i] = 0
            return obs, rewards, dones, infos

        def _hit(self, env, episode, step):
            self.dose.took()
            self.where.hit(env, episode, step, self.fault)
