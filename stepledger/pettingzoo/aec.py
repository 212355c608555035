"""Turn-based (AEC) PettingZoo envs: ``LedgerAECEnv`` on the env side, ``TurnLedger`` on the trainer side.

PettingZoo's turn-based API is ``for agent in env.agent_iter(): obs, reward, termination, truncation, info =
env.last(); env.step(action)``. An agent's stream holds its turns:

- its first turn is a reset: the observation it is given then;
- each action it takes opens a step, which closes at its next turn with what it is given there: its
  observation, its reward since its own last action (``last()``'s cumulative reward: what other agents'
  moves gave it belongs to its stream), and its end flags;
- an agent that is terminated or truncated has that last step closed at the turn where it is told so
  (before the ``None`` step PettingZoo asks of it, which records nothing), and then leaves; one that joins
  starts with a reset at its first turn.

Agent ``k`` of ``possible_agents`` in env copy ``index`` is stream ``index * len(possible_agents) + k``, as
for the parallel API (``agent_streams``), so that an agent's turn-based stream and its stream through
``aec_to_parallel`` into ``LedgerSuperSuitVecEnv`` or ``LedgerVecEnv`` are paired by compare alike.
"""

from __future__ import annotations

import os
from typing import Any, Hashable, Sequence

import numpy as np

from stepledger.pettingzoo.streams import AgentLedger, agent_streams
from stepledger.recording.batches import copy_value, map_leaves
from stepledger.recording.hooks import attend
from stepledger.recording.trainer import TrainerLedger

from pettingzoo.utils import BaseWrapper

__all__ = ["LedgerAECEnv", "TurnLedger"]


class LedgerAECEnv(AgentLedger, BaseWrapper):
    """Records each agent's turns of a PettingZoo turn-based (AEC) env, one stream an agent.

    It wraps the env innermost, in the env's own process: ``LedgerAECEnv(tictactoe_v3.env(), "ledger",
    index=0)`` (the env's own wrappers, such as ``TerminateIllegalWrapper``, which writes into the raw env,
    stay inside it), and everything between it and the trainer (``aec_to_parallel``, SuperSuit's wrappers,
    Tianshou's ``PettingZooEnv``, a loop of your own) is the checked boundary.

    What it records is what ``last()`` gives the agent whose turn it is, as the trainer is given it (at its
    ``last()``, or at the ``step()`` of a trainer that takes the turn without it): the first turn of
    an agent is its reset; an action opens its step, closed at its next turn by the observation, the
    cumulative reward and the end flags it is given there. A terminated or truncated agent's step is closed
    at the turn where it is told so; the ``None`` step that follows records nothing, and the agent leaves.
    An agent whose observation is handed out through ``observe(agent)`` before its turn comes (as
    ``aec_to_parallel`` does for every agent at the end of a cycle) has its step closed there, with its
    cumulative reward and flags at that moment. An agent whose open step another agent's move ended, and
    whose ``None`` turn never comes before the next reset or close (a trainer that stops at the game's end,
    as Tianshou's collector does), has it closed with what ``observe()``, its cumulative reward and its
    flags gave as the game ended.

    Args:
        env: the AEC env (``possible_agents`` set; every agent of one observation space and one action space).
        directory, index, reward_dtype, keep_values, flush_interval: as for ``LedgerParallelEnv``.
    """

    owner = "LedgerAECEnv"

    def __init__(self, env: Any, directory: str | os.PathLike[str], index: int | None = None,
                 reward_dtype: Any = np.float32, keep_values: bool = False,
                 flush_interval: float | None = None) -> None:
        super().__init__(env)
        self._open_agents(env, directory, index, reward_dtype, keep_values, flush_interval, False)
        self._acted: set[Any] = set()  # agents whose step is open: it closes at their next turn
        self._gone: set[Any] = set()  # agents that ended in this game: they take part again after a reset
        self._final: dict[Any, tuple[Any, Any, bool, bool]] = {}  # agent -> what it was given as its step ended

    @property
    def _cumulative_rewards(self) -> dict[Any, Any]:  # what AECEnv.last() reads; PettingZoo 1.22's wrappers hide it
        return self.env._cumulative_rewards

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Reset the env (``kwargs``: what an older PettingZoo's wrappers pass on, such as 1.22's
        ``return_info``)."""
        self._recorder()  # an index first
        if self._final and self._close_ended():
            attend()
        try:
            self.env.reset(seed=seed, options=options, **kwargs)
        except BaseException:
            self._interrupted()
            raise
        self._in_play, self._acted, self._gone = set(), set(), set()

    def last(self, observe: bool = True) -> tuple[Any, Any, bool, bool, Any]:
        obs, reward, te, tr, info = self.env.last(observe)
        if observe:
            agent = self.env.agent_selection
            if agent not in self._gone and (agent in self._acted or agent not in self._in_play):
                rec = self._recorder().get(agent)
                if rec is None:
                    self._unknown(agent)
                elif self._record(agent, rec, obs, reward, bool(te), bool(tr)):
                    attend()
        return obs, reward, te, tr, info

    def step(self, action: Any) -> None:
        recorders = self._recorder()
        agent = self.env.agent_selection
        if agent not in self._gone and (agent in self._acted or agent not in self._in_play):
            self.last()  # its turn, which the trainer took without last() or observe(): recorded now
        if action is not None and agent in self._in_play:
            recorders[agent].take_action(action)  # before the env (which may change it in place) sees it
            self._acted.add(agent)
        try:
            self.env.step(action)
        except BaseException:
            self._interrupted()
            raise
        if self._acted and self._ended(recorders):
            attend()

    def _ended(self, recorders: dict[Any, Any]) -> bool:
        """Keep what each agent whose open step this step ended (terminated or truncated) is given now: its
        step closes at its ``None`` turn, or, where that never comes (a trainer that stops at the game's end, as
        Tianshou's collector does), with these values at the next reset or at close."""
        env = self.env
        terminations, truncations = env.terminations, env.truncations
        if not (any(terminations.values()) or any(truncations.values())):
            return False
        for agent in self._acted:
            if agent not in self._final and (terminations.get(agent) or truncations.get(agent)):
                self._final[agent] = (copy_value(env.observe(agent)), env._cumulative_rewards[agent],
                                      bool(terminations[agent]), bool(truncations[agent]))
        return False

    def _close_ended(self) -> bool:
        """The steps kept by ``_ended`` whose ``None`` turn never came: closed with what they kept."""
        over = False
        recorders = self._recorders or {}
        for agent, (obs, reward, te, tr) in list(self._final.items()):
            over |= self._record(agent, recorders[agent], obs, reward, te, tr)
        return over

    def _closing(self) -> None:
        self._close_ended()

    def observe(self, agent: Any) -> Any:
        obs = self.env.observe(agent)
        # handed out before its turn (aec_to_parallel hands every agent's out at a reset and a cycle's end)
        if agent not in self._gone and (agent in self._acted or agent not in self._in_play):
            recorders = self._recorder()
            rec = recorders.get(agent)
            env = self.env
            if rec is not None and agent in env.agents:
                te, tr = bool(env.terminations[agent]), bool(env.truncations[agent])
                if self._record(agent, rec, obs, env._cumulative_rewards[agent], te, tr):
                    attend()
        return obs

    def _record(self, agent: Any, rec: Any, obs: Any, reward: Any, te: bool, tr: bool) -> bool:
        """What ``agent`` is given now: the close of its open step, or else its first observation (a reset)."""
        self._final.pop(agent, None)
        if agent in self._acted:
            self._acted.discard(agent)
            over = rec.step_taken(obs, reward, te, tr)
        else:
            over = rec.reset(obs)
        if te or tr:
            self._in_play.discard(agent)
            self._gone.add(agent)
        else:
            self._in_play.add(agent)
        return over

    # ledger_path, flush() and close(): EnvAdapter's


def _one(value: Any) -> Any:
    """``value`` as a batch of one (a leading axis of 1 on every leaf), copied."""
    return map_leaves(value, lambda v: np.array(v, copy=True)[None])


class TurnLedger:
    """The trainer side of a hand-written ``agent_iter`` loop: each agent's turns, through ``TrainerLedger``'s
    per-env events (``env_reset``, ``env_steps``), one stream an agent.

    Example::

        turns = TurnLedger("ledger/trainer.npz", env.possible_agents, env.observation_space(agent),
                           env.action_space(agent))
        env.reset(seed=0)
        for agent in env.agent_iter():
            obs, reward, termination, truncation, info = env.last()
            turns.observed(agent, obs, reward, termination, truncation)
            action = None if termination or truncation else policy(obs, agent)
            turns.acted(agent, action)
            env.step(action)
        turns.close()  # writes ledger/trainer.npz; compare it with LedgerAECEnv's env-0.npz

    ``observed`` is what the trainer was given at an agent's turn, ``acted`` what it sent (None, the step
    of an agent that left, is not an action). ``copy`` names the env copy where a trainer steps several
    (agent ``k`` of copy ``c`` is stream ``c * len(possible_agents) + k``, as on the env side). Call
    ``new_game(copy)`` where the trainer resets an env copy before its agents have all left.

    Args:
        path: the trainer ledger file.
        possible_agents: the env's ``possible_agents``.
        observation_space, action_space: one agent's spaces (every agent's, as on the env side).
        copies: how many env copies the trainer steps.
        reward_dtype, keep_values, flush_interval: as for ``TrainerLedger``; the same on both sides.
    """

    def __init__(self, path: str | os.PathLike[str], possible_agents: Sequence[Hashable], observation_space: Any,
                 action_space: Any, copies: int = 1, reward_dtype: Any = np.float32, keep_values: bool = False,
                 flush_interval: float | None = None) -> None:
        self.agents = list(possible_agents)
        if not self.agents:
            raise ValueError("TurnLedger: possible_agents is empty")
        self.ledger = TrainerLedger(path, copies * len(self.agents), observation_space, action_space,
                                    reward_dtype=reward_dtype, keep_values=keep_values,
                                    flush_interval=flush_interval, owner="TurnLedger")
        self._streams = [agent_streams(c, self.agents) for c in range(int(copies))]
        self._in_play: set[int] = set()
        self._acted: dict[int, Any] = {}  # stream -> the action of its open step (a batch of one, copied)

    def _stream(self, agent: Hashable, copy: int) -> int:
        try:
            return self._streams[copy][agent]
        except (IndexError, KeyError):
            raise ValueError("TurnLedger: no stream for env copy %r, agent %r (possible_agents %r, %d copies)"
                             % (copy, agent, self.agents, len(self._streams))) from None

    def observed(self, agent: Hashable, obs: Any, reward: Any, terminated: Any, truncated: Any,
                 copy: int = 0) -> None:
        """The trainer was given ``last()``'s values at ``agent``'s turn."""
        i = self._stream(agent, copy)
        ended = bool(terminated) or bool(truncated)
        action = self._acted.pop(i, None)
        if action is not None:
            self.ledger.env_steps(i, action, _one(obs), np.array([reward], np.float64), np.array([bool(terminated)]),
                                  np.array([bool(truncated)]))
        elif i not in self._in_play:
            self.ledger.env_reset(i, copy_value(obs))
        else:
            return
        if ended:
            self._in_play.discard(i)
        else:
            self._in_play.add(i)

    def acted(self, agent: Hashable, action: Any, copy: int = 0) -> None:
        """The trainer sent ``action`` at ``agent``'s turn (None: the step of an agent that left)."""
        i = self._stream(agent, copy)
        if action is not None and i in self._in_play:
            self._acted[i] = _one(action)

    def new_game(self, copy: int = 0) -> None:
        """The trainer reset env copy ``copy``: its agents' open steps are dropped, and each starts anew."""
        for i in self._streams[copy].values():
            self._in_play.discard(i)
            self._acted.pop(i, None)

    @property
    def ledger_path(self) -> str | None:
        return self.ledger.path

    def flush(self) -> None:
        self.ledger.flush()

    def close(self) -> None:
        """Write the trainer ledger."""
        self.ledger.close()
