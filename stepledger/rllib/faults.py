"""RLlib's fault injector: ``inject(config, fault, ...)``, by a Gymnasium wrapper outside ``LedgerEnv`` in the
env runners (``place="wrapper"``) or by an env-to-module connector piece (``place="connector"``), over the
library-free ``stepledger.faults.FaultEngine``."""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Literal


from stepledger.errors import SettingsError
from stepledger.faults.engine import ENV_SIDE_FAULTS, FaultEngine, check_fault
from stepledger.format import storage
from stepledger.rllib.instrument import TAG, creator_of

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

PLACES = ("wrapper", "connector")
# reward:ender (multi-agent): the agent whose move ended the game gets reward 0 at its last step (RLlib PR 31156)
CONNECTOR_FAULTS = ("obs:f16", "obs:zero", "reward:f16", "reward:zero", "terminated:spurious", "reward:ender")


def _faulty_connector_class():
    from ray.rllib.connectors.connector_v2 import ConnectorV2

    class FaultyEnvToModule(ConnectorV2):
        """An env-to-module connector piece that changes the episode's latest obs, reward or end flag once:
        at the first step of env ``env_index`` at or after its ``at``-th step (over the env's life) where the
        change changes something. It runs in the env runner, after the env stepped, before the episode
        leaves it: the env's ledger keeps what the env gave, the episode what the connector made of it.
        The fault kit's ``FaultEngine`` decides where and how, and records where it struck; this piece tells
        it each reset and step of the env's episodes, and writes what it returns into the episode."""

        def __init__(self, input_observation_space=None, input_action_space=None, *, fault, env_index, at=10,
                     record=None, agent=None, **kwargs):
            super().__init__(input_observation_space, input_action_space, **kwargs)
            self.env_index, self.agent = int(env_index), agent
            self.settings = dict(fault=fault, at=at, record=record)
            # single agent: the env's stream; multi-agent: the agent's (env * n + k), known at its first episode
            self.engine = None if agent is not None else self._engine(self.env_index)
            self._id, self._last_t = None, None
            self._movers = {}  # multi-agent episode id -> the agents asked to act at its latest step

        def _engine(self, stream):
            self.stream = stream
            return FaultEngine(self.settings["fault"], at=self.settings["at"], target=stream,
                               record=self.settings["record"], allowed=CONNECTOR_FAULTS,
                               owner="stepledger.rllib.inject")

        def __call__(self, *, rl_module, batch, episodes, **kwargs):
            if self.engine is not None and self.engine.first is not None:
                return batch
            for episode in episodes:
                if episode.custom_data.get(TAG) != self.env_index:
                    continue
                ep = episode
                if self.agent is not None:  # a MultiAgentEpisode: the agent's own episode
                    if self.settings["fault"] == "reward:ender" and episode.is_done:
                        pass  # its movers are those of the step before
                    else:
                        self._follow_movers(episode)
                    ep = episode.agent_episodes.get(self.agent)
                    if ep is None:
                        continue
                    if self.engine is None:
                        agents = sorted(episode.observation_space, key=str)  # the streams' order
                        self.engine = self._engine(self.env_index * len(agents) + agents.index(self.agent))
                if self._id != ep.id_:  # a new episode: it starts with its reset
                    self._id, self._last_t = ep.id_, ep.t_started
                    self.engine.reset(self.stream, ep.get_observations(0))
                if ep.t == self._last_t:
                    continue  # not stepped since the last call
                self._last_t = ep.t
                obs, reward = ep.get_observations(-1), ep.get_rewards(-1)
                other = None
                if self.settings["fault"] == "reward:ender" and ep.is_done and self._moved_last(episode):
                    other = (obs, 0.0)
                new = self.engine.step(self.stream, obs, reward, ep.is_terminated, ep.is_truncated, other=other)
                if new[0] is not obs:
                    ep.set_observations(new_data=new[0], at_indices=-1)
                if new[1] is not reward:
                    ep.set_rewards(new_data=float(new[1]), at_indices=-1)
                if new[2] and not ep.is_done:
                    ep.is_terminated = True
            return batch

        def _moved_last(self, episode):
            """Whether this agent took the multi-agent episode's last move (its move ended the game): it was
            among the agents the env asked to act, those it gave an observation, at the step before the end."""
            return self.agent in self._movers.get(episode.id_, ())

        def _follow_movers(self, episode):
            if not episode.is_done:
                try:
                    self._movers = {episode.id_: set(episode.get_observations(-1))}
                except Exception:  # no observation yet
                    pass

    return FaultyEnvToModule


def inject(config: AlgorithmConfig, fault: str, *, env: int = 0, at: int = 10,
           record: str | os.PathLike[str] | None = None,
           place: Literal["wrapper", "connector"] = "wrapper", agent: str | None = None) -> AlgorithmConfig:
    """Put one boundary fault into an instrumented RLlib config, to prove that its ledgers catch it.

    Args:
        config: a config that ``instrument`` returned.
        fault: with ``place="wrapper"``, any of the fault kit's env-side faults (stepledger.faults); with
            ``place="connector"``, one of ``CONNECTOR_FAULTS``.
        env: the global index of the env that is hit.
        at: the fault takes the first opportunity after this many steps of that env.
        record: a local JSON file where the injector writes where it struck (env, episode, step, fault,
            field), for ``stepledger.faults.read_record``.
        place: ``"wrapper"``: a gym wrapper (``FaultyEnv``) outside ``LedgerEnv`` in every sub-env;
            ``"connector"``: an env-to-module connector piece, after the user's own, that edits the episode.
        agent: a multi-agent run's agent that is hit (its episode in env ``env``'s MultiAgentEpisodes; the
            record names its stream, ``env * n + k``); connector faults only so far.
    """
    creator = creator_of(config.env)
    if creator is None:
        raise SettingsError("stepledger.rllib.inject: call stepledger.rllib.instrument(config, path) first")
    if place not in PLACES:
        raise ValueError("stepledger.rllib.inject: place must be one of %s, got %r" % (", ".join(PLACES), place))
    if record is not None and storage.is_remote(os.fspath(record)):
        raise ValueError("stepledger.rllib.inject: record must be a local file")
    record = None if record is None else os.path.abspath(os.fspath(record))
    if config.is_multi_agent and agent is None:
        raise SettingsError("stepledger.rllib.inject: a multi-agent config: name the agent to hit (agent=...)")
    if agent is not None and place == "wrapper":
        raise SettingsError("stepledger.rllib.inject: multi-agent faults are injected in the connector pipeline "
                            "only so far (place='connector')")
    if place == "wrapper":
        check_fault(fault, ENV_SIDE_FAULTS, "stepledger.rllib.inject")
        creator.fault = dict(fault=fault, env_index=int(env), at=int(at), record=record)
        return config
    check_fault(fault, CONNECTOR_FAULTS, "stepledger.rllib.inject")
    user = config._env_to_module_connector
    config.env_runners(env_to_module_connector=functools.partial(
        _with_faulty_connector, user, dict(fault=fault, env_index=int(env), at=int(at), record=record,
                                           agent=agent)))
    return config


def _with_faulty_connector(user, settings, env=None, spaces=None, device=None):
    pieces = []
    if user is not None:
        got = user(env, spaces, device)
        pieces = list(got) if isinstance(got, (list, tuple)) else [got]
    return pieces + [_faulty_connector_class()(**settings)]


# ---------------------------------------------------------------- stepledger check --trainer rllib
