"""Boundary faults on purpose: an injector to prove that a stack's ledgers catch them.

The faults are those of the paper behind stepledger (Gou and Lu, 2026, Sec. III):

- ``obs:``, ``action:``, ``reward:``, ``final-obs:`` + ``zero`` (replaced by
  zeros), ``stale`` (the previous step's value), ``swap`` (another env's
  value; trainer side only) or ``f16`` (rounded through float16);
- ``action:clip`` (clipped to half the action range);
- ``terminated:spurious``, ``truncated:as-term``, ``truncated:drop``,
  ``terminated:drop``, ``terminated:as-trunc``;
- ``step:fill`` (the env is not stepped and the previous feedback is sent
  again; env side only);
- on one agent of a PettingZoo parallel env (``MULTIAGENT_FAULTS``): most of
  the above, and ``reward:drop``, ``final-obs:reset``, ``agent:pad`` and
  ``agent:swap`` (``AGENT_FAULTS``).

One engine, ``FaultEngine``, decides per env (or per agent) where a fault
strikes and how it changes a value, and records where it struck. It knows no
library. Each library's folder has an injector that puts it in a stack and only
translates the library's conventions into the engine's calls (``Injector`` is
what they share): ``stepledger.gymnasium.faults`` has ``FaultyEnv``, which
wraps ``LedgerEnv`` in the worker (the faults happen on the env's side of the
wire), and ``FaultyVectorEnv`` (NEXT_STEP or SAME_STEP), between the vector env
and the trainer-side ledger; ``stepledger.sb3.faults`` has ``FaultyVecEnv``;
``stepledger.pettingzoo.faults`` has ``FaultyParallelEnv``, which wraps
``LedgerParallelEnv`` inside SuperSuit's wrappers. A dose is ``"one"`` (the
first opportunity at or after step ``at`` of env ``target``), a fraction such
as ``0.01`` (each opportunity drawn from a generator seeded with ``seed`` and
the env, so the same cells are hit at every training seed) or ``"all"``. A
fault that would change nothing at a cell (zeroing a zero) waits for the next
one. The injector records where it first changed a value: ``injector.first``
(env, episode, step, field), also written as JSON to ``record`` if given, for
injectors that live in worker processes. docs/FAULTS.md has the whole story.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any, Callable, Sequence

import numpy as np
from gymnasium import spaces as gs

from stepledger.recording.batches import copy_value as _copy
from stepledger.recording.batches import map_leaves as _map

VALUE_FIELDS = ("obs", "action", "reward", "final-obs")
VALUE_WAYS = ("zero", "stale", "swap", "f16")
FLAG_FAULTS = ("terminated:spurious", "truncated:as-term", "truncated:drop", "terminated:drop", "terminated:as-trunc")
FAULTS = tuple("%s:%s" % (f, w) for f in VALUE_FIELDS for w in VALUE_WAYS) + ("action:clip",) + FLAG_FAULTS + (
    "step:fill",)
ENV_SIDE_FAULTS = tuple(f for f in FAULTS if not f.endswith(":swap"))
TRAINER_SIDE_FAULTS = tuple(f for f in FAULTS if f != "step:fill")

#: where a fault first changed a value: env, episode, step, fault, field (and agent, stream, fields)
Record = dict[str, Any]
#: what a step of an env gives: (obs, reward, terminated, truncated)
Outcome = tuple[Any, Any, Any, Any]


def reported_fields(fault: str) -> set[str]:
    """The fields compare names at the event a fault first changed, exactly (a fault filed under
    another field is not located). ``step:fill`` is the exception: its extra event is compared with
    the env's next one, where any of these may happen to agree, so it names some of them."""
    field, way = fault.split(":")
    if field in ("obs", "final-obs"):
        return {"obs"}
    if field in ("action", "reward"):
        return {field}
    if fault in ("truncated:as-term", "terminated:as-trunc"):
        return {"terminated", "truncated"}
    if field in ("terminated", "truncated"):
        return {field}
    if field == "agent":  # an agent's whole event: the fields it changed are in its record's "fields"
        return set(EVENT_FIELDS)
    return {"kind", "action", "obs", "reward"}  # step:fill


# What a step of the env must be for each fault to have an opportunity there: the engine strikes only
# at such a step, and check_boundary says which kind of step a rollout lacked when a fault found none.
_NEEDS = {"obs": "step", "action": "any", "reward": "any", "step": "any", "final-obs": "end",
          "agent:pad": "end", "agent:swap": "any", "agent:no-last": "end", "reward:ender": "end",
          "terminated:spurious": "step", "truncated:as-term": "truncation", "truncated:drop": "truncation",
          "terminated:drop": "termination", "terminated:as-trunc": "termination"}
_MEETS: dict[str, Callable[[bool, bool], bool]] = {
    "any": lambda te, tr: True, "step": lambda te, tr: not (te or tr), "end": lambda te, tr: te or tr,
    "termination": lambda te, tr: te, "truncation": lambda te, tr: tr and not te}


def needs(fault: str) -> str:
    """The step a fault needs: "any", "step" (one that does not end its episode), "end", "termination" or
    "truncation" (a time limit, not also a termination)."""
    return _NEEDS.get(fault) or _NEEDS[fault.split(":")[0]]


def check_fault(fault: str, allowed: Sequence[str] = FAULTS, where: str = "fault") -> str:
    """``fault``, if it is one of ``allowed``; else a one-line ValueError that names ``where`` and the choices."""
    if fault not in allowed:
        raise ValueError("%s: unknown or unsupported fault %r; choose one of %s" % (where, fault, ", ".join(allowed)))
    return fault


class Dose:
    """Which opportunities a fault takes: one, a seeded fraction, or all.

    With ``"one"``, the first opportunity at or after step counter ``at`` of
    env ``env`` (and, for per-agent streams, of agent ``agent`` if given).
    A fraction draws once per cell from a generator of its own per stream,
    seeded with ``seed``, the env and the agent, so the cells a dose hits do
    not depend on the run.
    """

    def __init__(self, dose: str | float = "one", at: int = 10, env: int = 0, seed: int = 0,
                 agent: str | None = None) -> None:
        self.p: float | None
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
        self.at, self.env, self.seed, self.agent = int(at), int(env), int(seed), agent
        self._rngs: dict[tuple[int, Any], np.random.Generator] = {}
        self.done = False

    def draw(self, env: int, cell: int, agent: Any = None) -> bool:
        """Whether the fault may hit env ``env`` (agent ``agent``) at its step counter ``cell``."""
        if self.kind == "all":
            return True
        if self.kind == "one":
            return (not self.done and env == self.env and cell >= self.at
                    and (self.agent is None or agent == self.agent))
        rng = self._rngs.get((env, agent))
        if rng is None:
            key = [self.seed, env] if agent is None else [self.seed, env, zlib.crc32(str(agent).encode())]
            rng = self._rngs[(env, agent)] = np.random.default_rng(key)
        # one draw per cell, so cells do not depend on the run (a fraction's p, never None here)
        return bool(rng.random() < self.p)  # type: ignore[operator]

    def took(self) -> None:
        """The fault struck at a drawn cell: a dose "one" is used up."""
        if self.kind == "one":
            self.done = True


def _changed(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape != b.shape or a.dtype != b.dtype or not np.array_equal(a, b, equal_nan=True)




def zeros_like(value: Any) -> Any:
    """``value`` with every number and array leaf set to zero."""
    return _map(value, lambda v: np.zeros_like(np.asarray(v))
                if isinstance(v, np.ndarray) else type(v)(0) if isinstance(v, (int, float, np.generic)) else v)


def _f16(value: Any) -> Any:
    def one(v: Any) -> Any:
        arr = np.asarray(v)
        if arr.dtype.kind != "f":
            return v
        out = arr.astype(np.float16).astype(arr.dtype)
        return out if isinstance(v, np.ndarray) else out[()]
    return _map(value, one)


def _clip_half(action: Any, space: Any) -> Any:
    if not isinstance(space, gs.Box):
        return action
    low, high = space.low, space.high
    mid, half = (low + high) / 2.0, (high - low) / 4.0
    return np.clip(action, mid - half, mid + half).astype(space.dtype)




def changed_value(value: Any, way: str, previous: Any, space: gs.Space[Any] | None = None,
                  other: Any = None) -> Any:
    """The faulty version of ``value``, or None when this fault cannot change it here."""
    if way in ("zero", "drop"):  # a dropped reward reaches the trainer as 0 (SuperSuit's rewards.get(agent, 0))
        new = zeros_like(value)
    elif way == "f16":
        new = _f16(value)
    elif way == "stale":
        if previous is None:
            return None
        new = _copy(previous)
    elif way in ("swap", "reset", "others", "ender"):  # another env's (agent's) value, the reset obs that follows an
        # end, or (turn-based) the reward an agent's own move gave, or 0 for the agent whose move ended the game
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


def _flat(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in _flat(value[k])]
    if isinstance(value, tuple):
        return [x for v in value for x in _flat(v)]
    return [value]


def changed_reward(reward: Any, way: str, previous: Any, other: Any = None) -> Any:
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


EVENT_FIELDS = ("obs", "reward", "terminated", "truncated")


def _event_changes(event: Outcome, other: Sequence[Any]) -> list[str]:
    """The fields in which ``other`` (obs, reward, terminated, truncated) differs from ``event``, as a ledger
    sees them (a reward as float32)."""
    (obs, reward, te, tr), (o_obs, o_reward, o_te, o_tr) = event, other
    flat_a, flat_b = _flat(obs), _flat(o_obs)
    changes = (len(flat_a) != len(flat_b) or any(_changed(a, b) for a, b in zip(flat_a, flat_b)),
               np.float32(reward) != np.float32(o_reward), bool(te) != bool(o_te), bool(tr) != bool(o_tr))
    return [name for name, c in zip(EVENT_FIELDS, changes) if c]


def changed_flags(fault: str, terminated: Any, truncated: Any) -> tuple[bool, bool] | None:
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
    """Records the first change: env, episode, step, field (and agent); optionally to a JSON file."""

    def __init__(self, record: str | os.PathLike[str] | None) -> None:
        self.first: Record | None = None
        self.by_env: dict[int, Record] = {}  # env (or, per agent, the agent's stream) -> its first change
        self.count = 0
        self.record = os.fspath(record) if record is not None else None
        # possible_agents, set by a multi-agent adapter: a record then names the agent's stream
        self.agents: list[Any] | None = None

    def hit(self, env: int, episode: int, step: int, fault: str, agent: Any = None,
            fields: Sequence[str] | None = None) -> None:
        self.count += 1
        key = int(env)
        if agent is not None and self.agents is not None:  # the agent's stream: SuperSuit's vector slot
            key = key * len(self.agents) + self.agents.index(agent)
        if key not in self.by_env:
            field = fault.split(":")[0] if not fields else fields[0]
            self.by_env[key] = rec = {"env": int(env), "episode": int(episode), "step": int(step), "fault": fault,
                                      "field": {"final-obs": "obs"}.get(field, field)}
            if agent is not None:
                rec["agent"] = agent
                if self.agents is not None:
                    rec["stream"] = key
            if fields:
                rec["fields"] = list(fields)
        if self.first is None:
            self.first = self.by_env[key]
            if self.record:
                os.makedirs(os.path.dirname(os.path.abspath(self.record)) or ".", exist_ok=True)
                tmp = self.record + ".tmp-%d" % os.getpid()
                with open(tmp, "w") as f:
                    json.dump(self.first, f)
                os.replace(tmp, self.record)


def read_record(path: str | os.PathLike[str]) -> Any:
    """The first change an injector in another process recorded, or None."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class _Stream:
    """One env's (or one agent's) life as the engine follows it."""

    __slots__ = ("cells", "episode", "step", "ended", "open", "drawn", "prev_obs", "prev_reward", "prev_action")

    prev_obs: Any
    prev_action: Any
    prev_reward: Any

    def __init__(self) -> None:
        self.cells = 0  # steps opened over the stream's life: the dose's cell counter
        self.episode, self.step = -1, 0  # as the env-side ledger counts them
        self.ended = False  # the last step ended its episode (by the true flags) and no reset followed yet
        self.open = self.drawn = False  # a step is open; the dose drew it
        self.prev_obs = self.prev_action = None  # for stale faults and fills
        self.prev_reward = 0.0


class FaultEngine:
    """One boundary fault, decided per env: where it strikes, how it changes a value, where it struck.

    An adapter tells the engine what each env lived, in order, and hands on
    what the engine returns; it never decides anything about the fault::

        engine.reset(env, obs)                # env was reset and returned obs
        filled = engine.fill(env)             # step:fill: (obs, reward) to send instead of stepping, else None
        action = engine.action(env, action)   # a step of env opens: the action to send
        obs, reward, terminated, truncated = engine.step(env, obs, reward, terminated, truncated)

    ``step`` takes the observation the step ended on: the final observation
    when the step ended the episode, whatever the library's autoreset
    convention (under SAME_STEP and in SB3 the adapter passes
    ``final_obs``/``terminal_observation``, or None when there is none, then
    calls ``reset`` with the reset obs). ``fill`` and ``action`` are optional:
    ``step`` opens the step itself when they were not called, so a trainer
    component that only sees the feedback (an env-to-module connector)
    calls ``reset`` and ``step`` alone. ``awaiting_reset(env)`` says whether
    env's last step ended its episode with no reset since: the step a NEXT_STEP
    vector env spends on the reset, which the adapter reports as ``reset``.

    Where: the dose draws once per step of each env (``at`` counts an env's
    steps over its life, resets not included); a drawn step is an opportunity
    if the fault can change something there: ``obs`` on a step that does not
    end the episode, ``final-obs`` on one that does, ``action`` and
    ``reward`` on any step, the flag faults where their flags allow
    (``truncated:drop`` needs a truncation), ``step:fill`` after a reset.
    A value the fault would leave equal waits for the next drawn step.
    Positions follow the true flags and the resets, as the env-side ledger
    counts them: a reset starts episode k+1 at step 0, each step advances the
    step by one, and a fault strikes at the step it changes.

    How: ``zero``, ``f16`` and ``clip`` change the value itself; ``stale``
    sends the previous value of this env (the previous step's, the reset obs
    after a reset, reward 0 after a reset); ``swap`` sends another env's
    value, which the adapter passes as ``other`` (for ``action``: its action;
    for ``step``: its (obs, reward)). ``actions`` and ``steps`` do that for a
    batch of envs, each swapping with the next one.

    Per agent: every call takes ``agent=`` as well (a stream per (env,
    agent)); ``target_agent`` narrows the dose ``"one"`` to one agent, and the
    record then names the agent.

    Args:
        fault: one of ``allowed``.
        dose: "one", "all" or a fraction.
        at: with dose "one", the first step counter (over the env's life) that may be hit.
        target: with dose "one", the env that is hit.
        seed: the fault generator's seed, for fractional doses.
        record: a JSON file to write where the fault first changed a value.
        action_space: the single env's action space (``action:clip`` clips to half its range).
        target_agent: with dose "one", the agent that is hit (None: any agent of ``target``).
        allowed: the faults this engine's adapter can inject.
        owner: the name that errors give.
    """

    def __init__(self, fault: str, dose: str | float = "one", at: int = 10, target: int = 0, seed: int = 0,
                 record: str | os.PathLike[str] | None = None, action_space: gs.Space[Any] | None = None,
                 target_agent: str | None = None, allowed: Sequence[str] = FAULTS,
                 owner: str = "FaultEngine") -> None:
        self.fault = check_fault(fault, allowed, owner)
        self.field, self.way = fault.split(":")
        self._meets = _MEETS[needs(fault)]
        self.dose = Dose(dose, at, target, seed, target_agent)
        self.where = _Where(record)
        self.action_space = action_space
        self._streams: dict[tuple[int, Any], _Stream] = {}

    @property
    def first(self) -> Record | None:
        """Where the fault first changed a value, or None."""
        return self.where.first

    def _open(self, env: int, agent: Any) -> _Stream:
        s = self._streams.get((env, agent))
        if s is None:
            s = self._streams[(env, agent)] = _Stream()
        if not s.open:
            s.open, s.drawn = True, self.dose.draw(env, s.cells, agent)
            s.cells += 1
        return s

    def _hit(self, s: _Stream, env: int, agent: Any, fields: Sequence[str] | None = None) -> None:
        s.drawn = False
        self.dose.took()
        self.where.hit(env, s.episode, s.step + 1, self.fault, agent, fields)

    def reset(self, env: int, obs: Any, agent: Any = None) -> None:
        """Env ``env`` was reset and returned ``obs``: a new episode starts."""
        s = self._streams.get((env, agent))
        if s is None:
            s = self._streams[(env, agent)] = _Stream()
        s.episode, s.step, s.ended, s.open = s.episode + 1, 0, False, False
        s.prev_obs, s.prev_reward = _copy(obs), 0.0

    def awaiting_reset(self, env: int, agent: Any = None) -> bool:
        """Whether env's last step ended its episode with no reset since."""
        s = self._streams.get((env, agent))
        return s is not None and s.ended

    def position(self, env: int, agent: Any = None) -> tuple[int, int]:
        """(episode, step) of env's last event, as the env-side ledger counts them."""
        s = self._streams[(env, agent)]
        return s.episode, s.step

    def fill(self, env: int, agent: Any = None) -> tuple[Any, Any] | None:
        """For ``step:fill``: the (obs, reward) to send instead of stepping env, or None to step it."""
        s = self._open(env, agent)
        if self.field != "step" or not s.drawn or s.prev_obs is None:
            return None
        self._hit(s, env, agent)
        s.open = False  # the env does not step: its position stays
        return _copy(s.prev_obs), s.prev_reward

    def action(self, env: int, action: Any, other: Any = None, agent: Any = None) -> Any:
        """A step of env opens; returns the action to send (``other``: the action of the env to swap with)."""
        s = self._open(env, agent)
        if self.field != "action":
            return action
        sent = action
        if s.drawn:
            new = changed_value(action, self.way, s.prev_action, self.action_space, other)
            if new is not None:
                self._hit(s, env, agent)
                sent = new
        s.prev_action = _copy(action)
        return sent

    def step(self, env: int, obs: Any, reward: Any, terminated: Any, truncated: Any, other: Any = None,
             agent: Any = None) -> Outcome:
        """The step of env closes; returns (obs, reward, terminated, truncated) to send on.

        ``obs`` is the one the step ended on (None: the library gave none);
        ``other`` the (obs, reward) of the env to swap with.
        """
        return self._close(env, obs, reward, terminated, truncated, other, agent)[0]

    def _close(self, env: int, obs: Any, reward: Any, terminated: Any, truncated: Any, other: Any,
               agent: Any) -> tuple[Outcome, bool]:
        s = self._open(env, agent)
        s.open = False
        ended = bool(terminated) or bool(truncated)
        out: tuple[Any, ...] | None = None
        fields: list[str] | None = None
        if s.drawn and self._meets(bool(terminated), bool(truncated)):
            field, way = self.field, self.way
            if field == "agent":  # the whole event replaced by the one the adapter passes (None: no opportunity)
                fields = None if other is None else _event_changes((obs, reward, terminated, truncated), other)
                out = tuple(other) if fields else None
            elif field in ("obs", "final-obs") and obs is not None:
                new = changed_value(obs, way, s.prev_obs, other=None if other is None else other[0])
                out = None if new is None else (new, reward, terminated, truncated)
            elif field == "reward":
                new = changed_reward(reward, way, s.prev_reward, other=None if other is None else other[1])
                out = None if new is None else (obs, float(new), terminated, truncated)
            elif field in ("terminated", "truncated"):
                new = changed_flags(self.fault, terminated, truncated)
                out = None if new is None else (obs, reward) + new
            if out is not None:
                self._hit(s, env, agent, fields)
        s.step, s.ended = s.step + 1, ended
        if obs is not None:
            s.prev_obs = _copy(obs)
        s.prev_reward = reward
        return (obs, reward, terminated, truncated) if out is None else out, out is not None

    def actions(self, actions: Sequence[Any], stepping: Sequence[Any]) -> dict[int, Any]:
        """A vector step opens: ``actions[i]`` is env i's, ``stepping[i]`` whether env i steps (not a reset step).

        Returns {env: the action to send} for the envs whose action changed; each env swaps with the next.
        """
        n = len(actions)
        changed: dict[int, Any] = {}
        for i, a in enumerate(actions):
            if stepping[i]:
                sent = self.action(i, a, other=actions[(i + 1) % n] if n > 1 else None)
                if sent is not a:
                    changed[i] = sent
        return changed

    def steps(self, outcomes: Sequence[Outcome], stepping: Sequence[Any]) -> dict[int, Outcome]:
        """A vector step closes: ``outcomes[i]`` is env i's (obs it ended on, reward, terminated, truncated).

        Returns {env: (obs, reward, terminated, truncated)} for the envs the fault struck.
        """
        n = len(outcomes)
        changed: dict[int, Outcome] = {}
        for i, (obs, reward, terminated, truncated) in enumerate(outcomes):
            if stepping[i]:
                other = outcomes[(i + 1) % n][:2] if n > 1 else None
                out, struck = self._close(i, obs, reward, terminated, truncated, other, None)
                if struck:
                    changed[i] = out
        return changed


# Multi-agent faults, for any library's multi-agent injector.
# The paper's multi-agent classes, on one agent of one env copy: the single-agent value and flag faults (not the
# swaps between envs, not step:fill: a parallel env steps every agent at once; not the dropped ends, which
# SuperSuit's vectorisation cannot carry, an agent out of step with the others: agent:pad is their form here), and
AGENT_FAULTS = ("reward:drop",      # the agent's reward missing from the step's rewards (the trainer gets 0)
                "final-obs:reset",  # its final obs replaced by the obs of the reset that follows
                "agent:pad",        # it left, the trainer is not told, and gets padded steps until the env ends
                "agent:swap")       # its event (obs, reward, flags) is the next agent's
MULTIAGENT_FAULTS = tuple(f for f in ENV_SIDE_FAULTS
                          if f not in ("step:fill", "truncated:drop", "terminated:drop")) + AGENT_FAULTS
# On one agent of a turn-based (AEC) env, between the env side and a trainer that reads last(): the value and
# flag faults (not the swaps between envs, not step:fill; not the flag faults that make the trainer step a live
# agent with None or a dead one with an action, which PettingZoo refuses with an error), and the turn-based
# classes of the paper's Table I
TURN_FAULTS = tuple(f for f in ENV_SIDE_FAULTS if f not in (
    "step:fill", "terminated:spurious", "terminated:drop", "truncated:drop")) + (
    "reward:others",  # the reward other agents' moves gave the agent since its action is dropped (Tianshou 399)
    "reward:ender",   # the agent whose move ended the game gets reward 0 at its last turn (RLlib PR 31156)
    "agent:no-last")  # a leaving agent's last turn (its end, before its None step) never reaches the trainer


class Injector:
    """What every library's injector shows of its engine (``self.engine``, a FaultEngine)."""

    engine: FaultEngine

    @property
    def fault(self) -> str:
        return self.engine.fault

    @property
    def field(self) -> str:
        return self.engine.field

    @property
    def way(self) -> str:
        return self.engine.way

    @property
    def dose(self) -> Dose:
        return self.engine.dose

    @property
    def where(self) -> _Where:
        return self.engine.where

    @property
    def first(self) -> Record | None:
        """Where the fault first changed a value, or None."""
        return self.engine.where.first

