"""RLlib multi-agent runs: the env side of a ``MultiAgentEnv``, one stream an agent, and what the trainer side
needs to pair its agent episodes with those streams.

``LedgerMultiAgentEnv`` goes around the user's ``MultiAgentEnv`` in every sub-env of every env runner (the
instrumented env creator builds it when the user's env is one; ``config.env`` stays what RLlib builds the
env runner's vector env from). The per-agent streams are the parallel PettingZoo ledger's
(``stepledger.pettingzoo.LedgerParallelEnv``, reused here as the recorder of a view of the env): agent ``k``
of ``possible_agents`` (sorted: RLlib's PettingZoo wrappers list them from a set, in an order that differs
between processes) in the sub-env of global index ``e`` is stream ``e * len(possible_agents) + k`` of
``env-{e}.npz``, whose meta lists them.

What an agent's event is follows RLlib's ``MultiAgentEpisode`` (Ray 2.60), which builds one
``SingleAgentEpisode`` per agent from the env's dicts, so that the two sides count the same steps:

- An agent's reset is the first observation it gets in an episode (at the env's reset, or later: it joins).
- An agent's step runs from the action it was sent to the next observation it gets; the rewards the env gives
  it in between (it waits while others act, in turn-based envs) add up into that step's reward.
- An agent that is terminated with no observation (it leaves while another acts) ends its step with its
  last observation, as RLlib's episode does; ``"__all__"`` ends every agent in play.
- Rewards an agent gets before its first observation are in no step (RLlib's episode drops them too).

RLlib's own env checker resets and steps the env once before the runner gives it its index
(``on_environment_created``); those calls pass through unrecorded: they are not part of the run.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.env.multi_agent_env import MultiAgentEnv

from stepledger.errors import LedgerError
from stepledger.pettingzoo.parallel import LedgerParallelEnv
from stepledger.recording.hooks import attend

AGENTS = "__all__"  # the key of RLlib's flag dicts that ends every agent


class _ParallelView:
    """A ``MultiAgentEnv`` seen as a PettingZoo parallel env (``possible_agents``, ``observation_space(agent)``,
    ``action_space(agent)``, the same ``reset``/``step`` dicts), for ``LedgerParallelEnv`` to record."""

    metadata: dict[str, Any] = {}

    def __init__(self, env):
        self.env = env
        # the streams' order: RLlib's PettingZoo wrappers list possible_agents from a set, in an order that
        # differs between processes; sorted, agent k is the same agent in every runner and on the trainer side
        self.possible_agents = sorted(env.possible_agents, key=str)

    def observation_space(self, agent):
        return self.env.get_observation_space(agent)

    def action_space(self, agent):
        return self.env.get_action_space(agent)

    def reset(self, seed=None, options=None):
        return self.env.reset(seed=seed, options=options)

    def close(self):
        return self.env.close()

    @property
    def unwrapped(self):
        return self


def is_multi_agent_env(env: Any) -> bool:
    return isinstance(env, MultiAgentEnv)


class LedgerMultiAgentEnv(MultiAgentEnv):
    """Records what each agent of an RLlib ``MultiAgentEnv`` was sent and got, one stream an agent.

    Args:
        env: the user's ``MultiAgentEnv`` (``possible_agents`` set; every agent of one observation space and
            one action space, as for ``LedgerParallelEnv``).
        directory, reward_dtype, keep_values, flush_interval: as for ``LedgerParallelEnv``.
        index: the sub-env's global index, or None and ``set_index`` before its first recorded event.
    """

    def __init__(self, env: MultiAgentEnv, directory: str, index: int | None = None, reward_dtype: Any = None,
                 keep_values: bool = False, flush_interval: float | None = None) -> None:
        if not list(getattr(env, "possible_agents", None) or []):
            raise LedgerError("stepledger.rllib: the MultiAgentEnv %s has no possible_agents: set it in its "
                              "constructor (every agent that can take part), so that each agent gets its stream"
                              % type(env).__name__)
        self.env = env
        options = {} if reward_dtype is None else {"reward_dtype": reward_dtype}
        self._led = LedgerParallelEnv(_ParallelView(env), directory, None, keep_values=keep_values,
                                      flush_interval=flush_interval, **options)
        self.possible_agents = list(env.possible_agents)
        self._agent_ids = set(self.possible_agents)
        self.observation_spaces = getattr(env, "observation_spaces", None)
        self.action_spaces = getattr(env, "action_spaces", None)
        self.observation_space = getattr(env, "observation_space", None)
        self.action_space = getattr(env, "action_space", None)
        self._waiting: dict[Any, float] = {}  # agent -> rewards so far of the step it is in (it acted)
        self._last: dict[Any, Any] = {}       # agent -> its last observation (the obs of a step that ends without one)
        if index is not None:
            self.set_index(index)

    # ------------------------------------------------------------------ what RLlib asks of the env

    @property
    def agents(self):
        return self.env.agents

    @agents.setter
    def agents(self, value):
        pass  # the user's env keeps its own

    def get_observation_space(self, agent_id):
        return self.env.get_observation_space(agent_id)

    def get_action_space(self, agent_id):
        return self.env.get_action_space(agent_id)

    def render(self):
        return self.env.render()

    def __getattr__(self, name):
        if name.startswith("_") or name in ("env",):
            raise AttributeError(name)
        return getattr(self.env, name)

    # ------------------------------------------------------------------ the index and the ledger

    def set_index(self, index: int) -> None:
        """The sub-env's global index: its file is ``env-{index}.npz``, agent k's stream ``index * n + k``."""
        self._led.set_index(index)

    def link(self, run: str) -> None:
        """The run this sub-env's ledger belongs to (instrument's run id, which the trainer files carry too),
        once indexed: compare pairs the two by it."""
        self._led.link(run)

    @property
    def stream_agents(self) -> list[Any]:
        """The agents in the order of their streams: agent k of env e is stream e * n + k."""
        return self._led.stream_agents

    @property
    def index(self) -> int | None:
        return self._led.index

    @property
    def ledger_path(self) -> str | None:
        return self._led.ledger_path

    def flush(self) -> None:
        self._led.flush()

    def close(self) -> None:
        self._led.close()  # writes env-N.npz, then closes the user's env

    # ------------------------------------------------------------------ events

    def reset(self, *, seed=None, options=None):
        if self._led.index is None:  # RLlib's env checker, before on_environment_created
            return self.env.reset(seed=seed, options=options)
        obs, infos = self._led.reset(seed=seed, options=options)  # each agent in obs: its reset
        self._waiting.clear()
        self._last = dict(obs)
        return obs, infos

    def step(self, action_dict):
        led = self._led
        if led.index is None:
            return self.env.step(action_dict)
        recorders, in_play, waiting, last = led._recorders, led._in_play, self._waiting, self._last
        for agent, action in action_dict.items():
            if agent in in_play and agent not in waiting:
                recorders[agent].take_action(action)
                waiting[agent] = 0.0
        try:
            result = self.env.step(action_dict)
        except BaseException:
            led._interrupted()
            raise
        obs, rewards, terminateds, truncateds, _ = result
        all_te, all_tr = bool(terminateds.get(AGENTS, False)), bool(truncateds.get(AGENTS, False))
        for agent, reward in rewards.items():
            if agent in waiting:
                waiting[agent] += reward
        over, stepped = False, []
        for agent in list(waiting):
            te = all_te or bool(terminateds.get(agent, False))
            tr = all_tr or bool(truncateds.get(agent, False))
            o = obs.get(agent)
            if o is None:
                if not (te or tr):
                    continue  # it waits for its turn
                o = last.get(agent)  # it left with no observation: RLlib's episode repeats its last one
            over |= recorders[agent].step_taken(o, waiting.pop(agent), te, tr)
            stepped.append(agent)
            if te or tr:
                in_play.discard(agent)
            else:
                last[agent] = o
        if all_te or all_tr:
            in_play.clear()
            waiting.clear()
        else:
            joined: list[Any] = []
            over |= led._enter(recorders, obs, stepped, joined)  # an agent that joins: its first observation
            for agent in joined:
                last[agent] = obs[agent]
        if over:
            attend()
        return result


def ledger_of(sub_env: Any) -> LedgerMultiAgentEnv | None:
    """The ``LedgerMultiAgentEnv`` of one sub-env of an RLlib multi-agent vector env (gym's wrappers around it)."""
    env = getattr(sub_env, "unwrapped", sub_env)
    return env if isinstance(env, LedgerMultiAgentEnv) else None


def agent_units(episode: Any, env: int, agents: list[Any] | None):
    """(stream, single-agent episode) of each agent of a ``MultiAgentEpisode`` (or of a single-agent episode,
    ``agents`` None: (env, episode)). Agent k of the sub-env of global index ``env`` is stream ``env * n + k``."""
    if agents is None:
        return [(env, episode)]
    n = len(agents)
    out = []
    for agent, sa in episode.agent_episodes.items():
        try:
            k = agents.index(agent)
        except ValueError:
            continue  # not in possible_agents: the env side has no stream for it either
        out.append((env * n + k, sa))
    return out
