"""The env side for PettingZoo parallel envs: ``LedgerParallelEnv``, one stream an agent.

Needs the ``[pettingzoo]`` extra: ``pip install "plugrl-stepledger[pettingzoo]"``.

``LedgerParallelEnv(par_env, directory, index)`` wraps the raw parallel env,
innermost, before any SuperSuit wrapper, in the env's own process. It records
each agent's events as ``LedgerEnv`` records an env's: the reset observation,
then per step the action the agent was sent, its observation, reward and end
flags. Agent ``k`` of ``possible_agents`` in env copy ``index`` is stream
``index * len(possible_agents) + k``: the vector slot SuperSuit gives it
(``pettingzoo_env_to_vec_env_v1`` + ``concat_vec_envs_v1``), so that the
trainer side (``stepledger.sb3.LedgerVecEnv`` around SuperSuit's VecEnv) and
compare pair each agent's two records. An agent that leaves has its last
event with its end flag and no events after it; one that joins later starts
with its first observation, recorded as a reset. The ledger file is
``directory/env-{index}.npz``, with ``possible_agents`` in its meta.
"""

from __future__ import annotations

import importlib.metadata
import os
from typing import Any, Hashable, Sequence

import numpy as np

from stepledger.format import schema as S
from stepledger import wording
from stepledger.errors import LedgerError
from stepledger.recording.adapters import TrainerAdapter
from stepledger.recording.hooks import attend
from stepledger.recording.placement import check_placement, own_attr, slot_infos
from stepledger.recording.trainer import SAME_STEP, OnFault

# The oldest PettingZoo this module works with: the [pettingzoo] extra's (pyproject.toml says the same; a test
# holds the two together). PettingZoo 1.22 spells the base class BaseParallelWraper, and its parallel_to_aec
# casts continuous actions to int.
PETTINGZOO_NEEDS = "1.24"


try:
    from pettingzoo.utils import BaseParallelWrapper
except ImportError as exc:  # exercised in a venv without PettingZoo, and in one with pettingzoo 1.22.3
    try:
        _have: str | None = importlib.metadata.version("pettingzoo")
    except Exception:  # PackageNotFoundError: not installed
        _have = None
    if _have is not None and [int(x) for x in _have.split(".")[:2] if x.isdigit()] >= [
            int(x) for x in PETTINGZOO_NEEDS.split(".")]:
        raise  # a version new enough that fails to import for another reason: its own error says which
    if _have is None:
        raise ImportError("stepledger.pettingzoo needs PettingZoo %s or newer, and it is not installed: pip install "
                          "\"plugrl-stepledger[pettingzoo]\" (or pip install \"pettingzoo>=%s\")"
                          % (PETTINGZOO_NEEDS, PETTINGZOO_NEEDS)) from exc
    raise ImportError("stepledger.pettingzoo needs PettingZoo %s or newer, and pettingzoo %s is installed: pip "
                      "install -U \"pettingzoo>=%s\" (or pip install \"plugrl-stepledger[pettingzoo]\")"
                      % (PETTINGZOO_NEEDS, _have, PETTINGZOO_NEEDS)) from exc

from stepledger.pettingzoo.streams import LOADED_COPIES, AgentLedger, agent_streams  # noqa: E402  (after the version check)

__all__ = ["AgentLedger", "LedgerParallelEnv", "LedgerSuperSuitVecEnv", "agent_streams", "index_supersuit_copies", "slot_map"]


def slot_map(possible_agents: Sequence[Hashable], slots: Sequence[tuple[int, Hashable]]) -> list[int]:
    """The env stream each vector slot carries, for a vectoriser that orders (env copy, agent) pairs its own way.

    ``slots`` lists, slot by slot, the (env copy, agent) pair the slot
    carries; the result (stream ``copy * len(possible_agents) + k`` for agent
    ``k``) goes to the trainer side as ``streams=`` (``LedgerVecEnv``,
    ``LedgerSuperSuitVecEnv``, ``TrainerLedger``). SuperSuit's own order,
    slot i = (i // n_agents, possible_agents[i % n_agents]), is the default
    and needs no map. A list that is not a permutation of the slots (an
    agent twice, one missing, an unknown agent) is refused with a one-line
    ValueError.
    """
    agents = list(possible_agents)
    n = len(agents)

    def refuse(text):
        raise ValueError(wording.not_a_slot_map("slot_map", slots, text))

    if not n:
        refuse("possible_agents is empty")
    try:
        pairs: list[tuple[Any, ...]] = [tuple(p) for p in slots]
    except TypeError:
        refuse("give one (env copy, agent) pair per slot")
    streams: list[int] = []
    where: dict[int, int] = {}
    for i, pair in enumerate(pairs):
        if len(pair) != 2:
            refuse("slot %d is %r, not an (env copy, agent) pair" % (i, pair))
        copy, agent = pair
        if isinstance(copy, bool) or not isinstance(copy, (int, np.integer)) or copy < 0:
            refuse("slot %d's env copy %r is not a non-negative integer" % (i, copy))
        if agent not in agents:
            refuse("slot %d's agent %r is not in possible_agents %r" % (i, agent, agents))
        stream = int(copy) * n + agents.index(agent)
        if stream in where:
            refuse("slots %d and %d both carry %s" % (where[stream], i, wording.stream_name(stream, agents)))
        where[stream] = i
        streams.append(stream)
    if len(pairs) % n:
        refuse("%d slots are not a whole number of env copies of %d agents" % (len(pairs), n))
    missing = [s for s in range(len(pairs)) if s not in where]
    if missing:
        refuse("no slot carries %s (%d slots are env copies 0 .. %d of %d agents each)"
               % (wording.stream_name(missing[0], agents), len(pairs), len(pairs) // n - 1, n))
    return streams


class LedgerParallelEnv(AgentLedger, BaseParallelWrapper):
    """Records what each agent of a PettingZoo parallel env took and gave.

    Example::

        >>> from mpe2 import simple_spread_v3
        >>> from stepledger.pettingzoo import LedgerParallelEnv
        >>> env = LedgerParallelEnv(simple_spread_v3.parallel_env(N=3), "ledger", index=0)
        >>> obs, infos = env.reset(seed=0)
        >>> obs, rewards, terms, truncs, infos = env.step({a: env.action_space(a).sample() for a in env.agents})
        >>> env.close()  # writes ledger/env-0.npz: streams 0, 1, 2 for agent_0, agent_1, agent_2

    Args:
        env: the parallel env (``possible_agents`` must be set; every agent of
            one observation space and one action space).
        directory: where ``env-{index}.npz`` is written: a path, or an fsspec URL.
        index: the env copy's position in the trainer's vector env (SuperSuit's
            copy number); or None, and ``set_index(i)`` before the first reset.
        reward_dtype, keep_values, flush_interval: as for ``LedgerEnv``; the
            same on both sides.
        live: attach each agent's live token to that agent's info, for a
            trainer-side ledger with ``live=True``: a step's under
            ``"stepledger"``, a reset's under ``"stepledger_reset"`` (SuperSuit
            merges the reset's info into the ending step's at an autoreset, so
            the two need keys of their own); each agent's first token comes
            with the settings and ``possible_agents``.
    """

    owner = "LedgerParallelEnv"

    def __init__(self, env: Any, directory: str | os.PathLike[str], index: int | None = None,
                 reward_dtype: Any = np.float32, keep_values: bool = False, flush_interval: float | None = None,
                 live: bool = False) -> None:
        super().__init__(env)
        self._open_agents(env, directory, index, reward_dtype, keep_values, flush_interval, live)

    # ------------------------------------------------------------------ events

    def reset(self, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[Any, Any], dict[Any, dict[str, Any]]]:
        recorders = self._recorder()
        try:  # in place, not through _call: SuperSuit's autoreset calls this within its step
            obs, infos = self.env.reset(seed=seed, options=options)
        except BaseException:
            self._interrupted()
            raise
        self._in_play = set()
        entered: list[Any] = []
        if self._enter(recorders, obs, (), entered):
            attend()
        if self.live:
            infos = self._with_tokens(infos, (), entered)
        return obs, infos

    def step(self, actions: dict[Any, Any]) -> tuple[dict[Any, Any], dict[Any, Any], dict[Any, bool],
                                                     dict[Any, bool], dict[Any, dict[str, Any]]]:
        recorders = self._recorder()
        # Each agent's action is noted as sent, before the env (which may change arrays in place) sees it.
        acting = []
        for agent, action in actions.items():
            rec = recorders.get(agent)
            if rec is not None and agent in self._in_play:
                rec.take_action(action)
                acting.append(agent)
        try:
            obs, rewards, terminations, truncations, infos = self.env.step(actions)
        except BaseException:  # Ctrl-C or an error inside the env: the run did not end cleanly
            self._interrupted()
            raise
        over = False
        for agent in acting:
            te, tr = bool(terminations.get(agent, False)), bool(truncations.get(agent, False))
            over |= recorders[agent].step_taken(obs.get(agent), rewards.get(agent, 0.0), te, tr)
            if te or tr:
                self._in_play.discard(agent)
        entered: list[Any] | None = [] if self.live else None
        over |= self._enter(recorders, obs, acting, entered)  # an agent that joined: its first observation
        if over:
            attend()
        if self.live:
            infos = self._with_tokens(infos, acting, entered)
        return obs, rewards, terminations, truncations, infos

    def _with_tokens(self, infos, stepped, entered):
        """A copy of ``infos`` with each agent's token: a step's under TOKEN_KEY, a reset's (the agent's first
        observation) under RESET_TOKEN_KEY; the env's own dicts are left as they were (it may reuse them)."""
        infos = dict(infos) if infos else {}
        recorders, streams = self._recorders, self._streams
        for agent in stepped:
            info = infos[agent] = dict(infos.get(agent) or ())
            info[S.TOKEN_KEY] = recorders[agent].token(streams[agent])
        for agent in entered:
            info = infos[agent] = dict(infos.get(agent) or ())
            info[S.RESET_TOKEN_KEY] = recorders[agent].token(streams[agent])
        if self._unsent:  # each agent's first token carries the settings
            for agent in (*stepped, *entered):
                if agent in self._unsent:
                    self._unsent.discard(agent)
                    infos[agent][S.SETTINGS_KEY] = self._settings
        return infos

    def _enter(self, recorders, obs, acting, entered=None):
        """Record a reset for each agent in ``obs`` that is not in play (nor among ``acting``); each is added
        to ``entered`` if given."""
        over = False
        for agent, value in obs.items():
            if agent in self._in_play or agent in acting:
                continue
            rec = recorders.get(agent)
            if rec is None:
                self._unknown(agent)
                continue
            over |= rec.reset(value)
            self._in_play.add(agent)
            if entered is not None:
                entered.append(agent)
        return over

    # ledger_path, flush() and close(): EnvAdapter's


def _supersuit_inner(venv):
    """SuperSuit's ConcatVecEnv (in-process copies) or ProcConcatVec (worker processes) in ``venv``."""
    inner = venv
    for _ in range(8):  # SuperSuit's SB3 or Gymnasium wrapper around it
        if hasattr(inner, "vec_envs") or hasattr(inner, "procs"):
            return inner
        inner = getattr(inner, "venv", None)
        if inner is None:
            break
    raise LedgerError("index_supersuit_copies: %s is not one of SuperSuit's vector envs (concat_vec_envs_v1: a "
                      "ConcatVecEnv, or a ProcConcatVec with num_cpus > 1)" % type(venv).__name__)


def _ledger_in(par_env):
    env = par_env
    while env is not None and not isinstance(env, AgentLedger):  # LedgerParallelEnv, or LedgerAECEnv in aec_to_parallel
        # most SuperSuit wrappers of a parallel env wrap it as an AEC env: aec_to_parallel(w(parallel_to_aec(env)))
        env = own_attr(env, "env") or own_attr(env, "aec_env")
    return env


def index_supersuit_copies(venv: Any, strict: bool = True) -> int:
    """Give each env copy of a SuperSuit vector env its index: copy c's LedgerParallelEnv gets c.

    ``concat_vec_envs_v1`` builds every copy from one env (a pickled copy of
    it), so an index given at construction would be the same in all of them:
    build ``LedgerParallelEnv(par_env, directory)`` without one and call this
    on the vector env before its first reset. In-process copies (``num_cpus``
    0 or 1) are given theirs here; with worker processes (``num_cpus > 1``)
    the indices travel to the workers in a message of SuperSuit's own (its
    ``env_is_wrapped`` query, whose wrapper class is unpickled in each
    worker), and each worker numbers its copies from the first vector slot
    SuperSuit gave it. Returns the number of copies (in-process) or worker
    processes given their indices. ``strict=False`` passes over copies with
    no LedgerParallelEnv and copies indexed already.
    """
    inner = _supersuit_inner(venv)
    if hasattr(inner, "procs"):
        slots = {p.pid: (inner.idx_starts[w], inner.idx_starts[w + 1] - inner.idx_starts[w])
                 for w, p in enumerate(inner.procs)}
        inner.env_is_wrapped(_WorkerIndices(slots, strict))
        return len(inner.procs)
    for c, copy in enumerate(inner.vec_envs):
        env = _ledger_in(getattr(copy, "par_env", None))
        if env is None:
            if not strict:
                continue
            raise LedgerError("index_supersuit_copies: env copy %d has no LedgerParallelEnv in it (wrap the raw "
                              "parallel env, before any SuperSuit wrapper)" % c)
        if env.index is None or strict:
            env.set_index(c)
    return len(inner.vec_envs)


def _index_worker_copies(slots, strict):
    """In a SuperSuit worker process: number this process's env copies from its first vector slot.

    Runs as the worker unpickles ``_WorkerIndices``; returns the class SuperSuit then asks about.
    """
    first, n_slots = slots.get(os.getpid(), (None, None))
    pid = os.getpid()
    copies = [ref() for p, ref in LOADED_COPIES if p == pid]
    copies = [c for c in copies if c is not None]
    if first is not None and copies:
        n_agents = len(copies[0]._agents)
        n_copies = n_slots // n_agents
        if strict and len(copies) < n_copies:
            raise LedgerError("index_supersuit_copies: worker process %d holds %d LedgerParallelEnv copies of %d "
                              "agents for %d vector slots: wrap each copy's raw parallel env in one "
                              "LedgerParallelEnv" % (pid, len(copies), n_agents, n_slots))
        # the copies are the last ones loaded: a worker started by spawn or forkserver first loads the env
        # they are copied from, with SuperSuit's constructor
        for k, env in enumerate(copies[-n_copies:]):
            if env.index is None or strict:
                env.set_index(first // n_agents + k)
    elif strict and first is not None:
        raise LedgerError("index_supersuit_copies: worker process %d holds no LedgerParallelEnv (wrap the raw "
                          "parallel env, before any SuperSuit wrapper)" % pid)
    return LedgerParallelEnv


class _WorkerIndices:
    """What index_supersuit_copies sends each worker: unpickled there, it gives the copies their indices."""

    def __init__(self, slots, strict):
        self.slots, self.strict = slots, strict

    def __reduce__(self):
        return _index_worker_copies, (self.slots, self.strict)


_TERMINAL_OBS = "terminal_observation"


class LedgerSuperSuitVecEnv(TrainerAdapter):
    """The trainer side of SuperSuit's Gymnasium form (``concat_vec_envs_v1(..., base_class="gymnasium")``).

    That vector env is not a Gymnasium 1.x vector env: its infos are a list
    of per-slot dicts, it has no ``single_observation_space``, and it resets a
    slot within the step that ends its episode, with the final observation in
    ``infos[i]["terminal_observation"]``. This adapter records it through
    ``TrainerLedger`` (same-step autoreset) and returns exactly what it
    returned; other attributes pass through. With in-process copies whose
    ``LedgerParallelEnv`` has no index yet, each copy is given its own
    (``index_supersuit_copies``).

    Example::

        venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(LedgerParallelEnv(par_env, "ledger")),
                                     2, num_cpus=0, base_class="gymnasium")
        venv = LedgerSuperSuitVecEnv(venv, "ledger/trainer.npz")

    With ``live=True`` (and ``LedgerParallelEnv(live=True)``), each slot's
    tokens are checked as they arrive: a step's under ``"stepledger"``, a
    reset's under ``"stepledger_reset"`` of the same info (SuperSuit merges the
    two at an autoreset), as ``LedgerVecEnv`` does under SuperSuit's SB3
    form; ``on_fault``, ``keep_tokens`` and ``streams`` (the slots' (env copy,
    agent) map, ``slot_map``) as there. ``check_wrappers`` and ``deliberate_wrappers``: as for ``LedgerVecEnv``,
    the wrappers found between this ledger and SuperSuit's vector env (through ``.venv`` or ``.env``) are warned
    of once and kept in the ledger's meta for compare's hints.
    """

    def __init__(self, venv: Any, path: str | os.PathLike[str] | None, reward_dtype: Any = np.float32,
                 keep_values: bool = False, flush_interval: float | None = None, live: bool = False,
                 on_fault: OnFault = "raise", keep_tokens: bool = False, streams: Sequence[int] | None = None,
                 check_wrappers: bool = True, deliberate_wrappers: Any = None) -> None:
        self.venv = venv
        between = check_placement(venv, "LedgerSuperSuitVecEnv", check_wrappers, deliberate_wrappers)
        try:
            index_supersuit_copies(venv, strict=False)  # copies given their indices already keep them
        except LedgerError:
            pass  # not one of SuperSuit's vector envs: nothing to give
        self._open_ledger(venv, path, venv.num_envs, venv.observation_space, venv.action_space,
                          autoreset_mode=SAME_STEP, reward_dtype=reward_dtype, keep_values=keep_values, live=live,
                          on_fault=on_fault, keep_tokens=keep_tokens, flush_interval=flush_interval,
                          streams=streams, owner="LedgerSuperSuitVecEnv",
                          final_obs_name="infos[{i}]['%s']" % _TERMINAL_OBS)
        self.ledger.note_wrappers(between)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("venv", "ledger"):
            raise AttributeError(name)
        return getattr(self.venv, name)

    def reset(self, seed: int | list[int] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, list[dict[str, Any]]]:
        obs, infos = self._call(self.venv.reset, seed=seed, options=options)
        led = self.ledger
        led.reset(obs)
        if self.live:
            slots = slot_infos(self.venv, infos)
            led.check_settings(led.tokens(slots, S.SETTINGS_KEY))
            led.check_tokens(led.tokens(slots, S.RESET_TOKEN_KEY))
        return obs, infos

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, list[dict[str, Any]]]:
        led = self.ledger
        led.actions(actions)
        try:
            obs, rewards, terminations, truncations, infos = self.venv.step(actions)
        except BaseException:  # Ctrl-C or an error: the run did not end cleanly
            led.interrupted()
            raise
        led.step(obs, rewards, terminations, truncations,
                 lambda i: infos[i].get(_TERMINAL_OBS) if isinstance(infos[i], dict) else None)
        if self.live:
            steps = led.tokens(infos)
            led.check_tokens(steps, steps, led.tokens(infos, S.RESET_TOKEN_KEY) if led.ended else None)
        return obs, rewards, terminations, truncations, infos

