"""The env side's per-agent streams, shared by PettingZoo's two APIs (``LedgerParallelEnv``, ``LedgerAECEnv``).

It imports no PettingZoo, so that the turn-based pieces work on the PettingZoo versions whose turn-based API
they need (1.22 and later: ``last()`` with termination and truncation) while the parallel pieces need 1.24
(``PETTINGZOO_NEEDS``).
"""

from __future__ import annotations

import os
import warnings
import weakref
from typing import Any, Hashable, Sequence

import numpy as np

from stepledger import core
from stepledger.errors import LedgerError
from stepledger.format import schema as S
from stepledger.format import storage
from stepledger.format.spaces import LeafLayout
from stepledger.recording.adapters import EnvAdapter
from stepledger.recording.checks import check_directory, check_path, check_reward_dtype
from stepledger.recording.checks import flush_interval as resolve_flush_interval
from stepledger.recording.live import settings_message
from stepledger.recording.recording import Recording

__all__ = ["AgentLedger", "agent_streams"]


def agent_streams(index: int, possible_agents: Sequence[Hashable]) -> dict[Hashable, int]:
    """{agent: stream id} of env copy ``index``: SuperSuit's vector slot of each agent."""
    n = len(possible_agents)
    return {agent: index * n + k for k, agent in enumerate(possible_agents)}


def _one_space(env, kind, agents, owner="LedgerParallelEnv"):
    """The space every agent shares (``kind`` is "observation" or "action"); a one-line error otherwise."""
    spaces = [getattr(env, kind + "_space")(agent) for agent in agents]
    for agent, space in zip(agents, spaces):
        if space != spaces[0]:
            raise LedgerError("%s: agents %r and %r have different %s spaces (%s, %s): a ledger "
                              "records one space for all agents; pad them to one first (SuperSuit's "
                              "pad_observations_v0 / pad_action_space_v0), as SuperSuit's vector envs need anyway"
                              % (owner, agents[0], agent, kind, spaces[0], space))
    return spaces[0]


# (pid, weakref) of each LedgerParallelEnv unpickled in this process, in order: the env copies SuperSuit builds
# (one pickled env, loaded once per copy), which index_supersuit_copies numbers in a worker process
LOADED_COPIES: list[tuple[int, weakref.ref[AgentLedger]]] = []


class AgentLedger(EnvAdapter):
    """The env side's per-agent streams, for any PettingZoo API: one ``Recording`` an env copy, one
    ``core.EventRecorder`` an agent (stream ``index * len(possible_agents) + k`` for agent ``k``).

    ``LedgerParallelEnv`` (parallel API) and ``LedgerAECEnv`` (turn-based API) are this plus the events of
    their API; ``owner`` is the name their messages give.
    """

    owner = "AgentLedger"

    def __setstate__(self, state):
        self.__dict__.update(state)
        LOADED_COPIES[:] = [(pid, ref) for pid, ref in LOADED_COPIES if ref() is not None]
        LOADED_COPIES.append((os.getpid(), weakref.ref(self)))

    def _open_agents(self, env: Any, directory: str | os.PathLike[str], index: int | None, reward_dtype: Any,
                     keep_values: bool, flush_interval: float | None, live: bool) -> None:
        owner = self.owner
        agents = list(getattr(env, "possible_agents", None) or [])
        if not agents:
            raise LedgerError("%s: the env has no possible_agents; wrap the raw PettingZoo env (its "
                              "possible_agents lists every agent that can take part)" % owner)
        directory = check_path(directory, owner, "directory")
        if not storage.is_remote(directory):
            if os.path.splitext(directory)[1].lower() == ".npz" and not os.path.isdir(directory):
                raise LedgerError("%s: directory %r looks like a ledger file; give the directory "
                                  "the env ledgers go to" % (owner, directory))
            check_directory(directory, owner)
        self._agents = agents
        self._dtype = check_reward_dtype(reward_dtype, owner)
        self._interval = resolve_flush_interval(flush_interval, owner)
        self._obs_layout = LeafLayout(_one_space(env, "observation", agents, owner), "%s: observation space" % owner)
        self._act_layout = LeafLayout(_one_space(env, "action", agents, owner), "%s: action space" % owner)
        self._directory = directory
        self._keep_values = bool(keep_values)
        self._recording = None
        self._recorders: dict[Any, Any] | None = None  # {agent: core.EventRecorder}
        self._in_play: set[Any] = set()  # agents whose episode is under way (reset and not ended)
        self.live = bool(live)
        self._streams: dict[Any, int] | None = None  # {agent: stream id}, once indexed
        self._unsent: set[Any] = set()  # with live: agents whose first token (it carries the settings) is still to go
        self.index: int | None = None
        if index is not None:
            self.set_index(index)

    # ------------------------------------------------------------------ the index

    def set_index(self, index: int) -> None:
        """Give this env copy its index (its position in the trainer's vector env), before its first reset."""
        owner = self.owner
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
            raise ValueError("%s: index must be a non-negative integer, got %r" % (owner, index))
        index = int(index)
        if self._recording is not None:
            if index == self.index:
                return
            raise LedgerError("%s: this env copy is index %s already; it cannot become %d"
                              % (owner, self.index, index))
        path = storage.join(self._directory, "env-%d.npz" % index)
        streams = agent_streams(index, self._agents)
        self._recording = rec = Recording(
            path, "env", [streams[a] for a in self._agents], self._obs_layout, self._act_layout, self._dtype,
            self._keep_values, {S.META_POSSIBLE_AGENTS: S.agent_names(self._agents), S.META_RECORDED_BY: owner}, self._interval, owner)
        is_f32 = self._dtype == np.float32
        self._recorders = {
            agent: core.EventRecorder(rec.buffers[k], self._obs_layout, self._act_layout, is_f32,
                                      rec.values[k].append if self._keep_values else None)
            for k, agent in enumerate(self._agents)}
        self._streams = streams
        if self.live:
            self._settings = settings_message(self._dtype.name, self._obs_layout, self._act_layout, self._agents)
            self._unsent = set(self._agents)
        self.index = index

    def link(self, run: str) -> None:
        """The run this env copy's ledger belongs to (the trainer side's run id, which its files carry too),
        once indexed: compare pairs the two by it, not by their times (stepledger.rllib's multi-agent env)."""
        if self._recording is not None:
            self._recording.link(run, None)

    @property
    def stream_agents(self) -> list[Any]:
        """The agents in the order of their streams: agent k of env copy e is stream e * n + k."""
        return list(self._agents)

    def _recorder(self):
        if self._recorders is None:
            raise LedgerError("%s: no index: give index= or call set_index(i) before the first "
                              "reset (i: the env copy's position in the trainer's vector env)" % self.owner)
        return self._recorders

    def _unknown(self, agent: Any) -> None:
        warnings.warn("%s: agent %r is not in possible_agents %r; its events are not recorded"
                      % (self.owner, agent, self._agents), RuntimeWarning, stacklevel=4)

    # ledger_path, flush() and close(): EnvAdapter's
