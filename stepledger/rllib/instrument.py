"""Ray RLlib: both ledgers of a run, with one call on the algorithm config.

    >>> from ray.rllib.algorithms.ppo import PPOConfig
    >>> import stepledger.rllib
    >>> config = PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=2, num_envs_per_env_runner=2)
    >>> config = stepledger.rllib.instrument(config, "s3://bucket/run-17")  # or a local or shared directory
    >>> algo = config.build_algo(); algo.train(); algo.stop()

then ``stepledger compare s3://bucket/run-17 s3://bucket/run-17`` (the trainer files are there too).

Where each side is recorded (the new API stack: env runners, episodes, learners):

- **The env side.** ``LedgerEnv`` goes around every sub-env of every env
  runner, local and remote, inside the env creator (the user's own env,
  registered name or Gymnasium id, is built by it as RLlib would). Each
  sub-env gets a global index when its runner's vector env is created
  (``on_environment_created``): ``(worker_index - 1) * num_envs_per_env_runner
  + its position in the runner's vector env``, or its position alone on the
  local runner when there are no remote runners. Ledgers spill every
  ``flush_interval`` seconds, at a cost proportional to what is new, and are
  closed by ``algo.stop()``; a killed cluster leaves them up to the last spill.
- **The trainer side.** With the learner placement (PPO's): what each learner
  trains on, the episodes (with several learners, the slices of them RLlib
  gave it) that crossed the object store, recorded by the first piece of its
  learner connector, before any other (PPO's ``AddOneTsToEpisodesAndTruncate``
  renames ``id_`` and adds a step). Each learner writes its own file:
  ``PATH/trainer.npz`` with one learner, ``PATH/trainer-learner-K.npz`` with
  several, each slice with its offset in its env's stream (the algorithm's
  process works them out from the episodes it hands the learner group), so
  that compare stitches an env's slices from several files. With the runner
  placement (the other algorithms', whose learners
  train on replayed or aggregated data): the episodes each runner returns from
  ``sample()``, before they cross; ``PATH/trainer-runner-N.npz`` per runner.
  Chunks of one env across ``sample()`` calls are stitched by the env index
  tagged on each episode when it is created. Actions are the ones sent to the
  env: the episode keeps the policy's, so the recorder applies RLlib's own
  ``NormalizeAndClipActions`` (unsquash or clip, as the config says).
- **Episodes a runner drops** (its env reset under them: with
  ``batch_mode="complete_episodes"``, every ``sample()`` resets its envs and
  deletes the episodes under way) never reach a learner: each runner counts
  their events per stream and hands the count on with the next episode of that
  env it returns (``custom_data[DROPPED]``); the trainer side records that
  episode's events past them, and compare names the dropped ones.
- **Evaluation runners** are not recorded: their episodes never reach a
  learner. **A runner that RLlib recreates** after a failure gets new indices
  (past those of the first runners), so that its ledgers never replace those
  of the runner it replaces; the old runner's ledgers end where it died.
"""

from __future__ import annotations

import functools
import os
import time
import uuid
import warnings
from typing import TYPE_CHECKING, Any, Literal

import gymnasium as gym
import numpy as np

from stepledger.format import schema as S
from stepledger.format import storage
from stepledger.gymnasium.env import LedgerEnv
from stepledger.errors import SettingsError
from stepledger.gymnasium.faults import FaultyEnv
from stepledger.recording.hooks import attend

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

Placement = Literal["auto", "learner", "runner"]

TAG = "stepledger_env"            # episode.custom_data key: the global env index of the episode's sub-env
DROPPED = "stepledger_dropped"    # episode.custom_data key: {stream: events} of episodes of its env that the
                                  # runner dropped before it (never returned by sample()): the env took them
TRAINER_FILE = "trainer.npz"              # the learner placement's trainer ledger, with one learner
LEARNER_FILE = "trainer-learner-%d.npz"    # with several: each learner's (K: its place in the learner group)
RUNNER_FILE = "trainer-runner-%d.npz"      # the runner placement's, one per env runner (its first env index)
PLACEMENTS = ("auto", "learner", "runner")
ALLOCATOR = "stepledger-indices-%s"  # a named actor handing out indices to recreated runners
RESTARTS_KEPT = 16                   # trainer-side streams kept per runner for its recreations


# ---------------------------------------------------------------- the env side

class LedgeredEnvCreator:
    """The env creator RLlib calls in each env runner: the user's env, with ``LedgerEnv`` around it.

    The index is given later, by ``on_environment_created``, once the sub-env's
    place in its runner's vector env is known (every sub-env of a runner gets
    the same ``EnvContext``: its ``vector_index`` is always 0).
    """

    def __init__(self, env, directory, reward_dtype=np.float32, keep_values=False, flush_interval=None, live=False):
        self.env, self.directory = env, directory
        self.reward_dtype, self.keep_values, self.flush_interval = reward_dtype, keep_values, flush_interval
        self.live = live
        self.fault = None  # set by inject(..., place="wrapper"): a FaultyEnv outside LedgerEnv
        self.maker = None  # what builds the user's env, once looked up (see _look_up)

    def __setstate__(self, state):
        self.__dict__.update(state)
        if self.maker is None:
            # Unpickled in an env runner's process (or copied with the config): look up the user's env here,
            # where Ray's registry can be asked. An AsyncVectorEnv builds the sub-envs in processes forked
            # from the runner, where a call to Ray's GCS never returns; they get the creator looked up.
            self._look_up()

    def _look_up(self):
        env = self.env
        if callable(env):
            self.maker = env
            return
        from ray.tune.registry import ENV_CREATOR, _global_registry
        self.maker = _global_registry.get(ENV_CREATOR, env) if _global_registry.contains(ENV_CREATOR, env) else \
            functools.partial(_gym_make, env)

    def make_inner(self, ctx):
        """The user's env, built as RLlib builds it from ``config.env``."""
        if self.maker is None:
            self._look_up()
        return self.maker(ctx)

    def __call__(self, ctx):
        inner = self.make_inner(ctx)
        from ray.rllib.env.multi_agent_env import MultiAgentEnv
        if isinstance(inner, MultiAgentEnv):  # one stream an agent (stepledger.rllib.multiagent)
            from stepledger.rllib.multiagent import LedgerMultiAgentEnv
            if self.fault is not None:
                raise SettingsError("stepledger.rllib.inject: place='wrapper' faults are single-agent only so far; "
                                    "this env is a MultiAgentEnv")
            if getattr(self, "live", False):
                raise SettingsError("stepledger.rllib.instrument: live=True is single-agent only so far; "
                                    "this env is a MultiAgentEnv")
            return LedgerMultiAgentEnv(inner, self.directory, reward_dtype=self.reward_dtype,
                                       keep_values=self.keep_values, flush_interval=self.flush_interval)
        env = LedgerEnv(inner, self.directory, reward_dtype=self.reward_dtype,
                        keep_values=self.keep_values, flush_interval=self.flush_interval,
                        live=getattr(self, "live", False))
        if self.fault is not None:
            # index=None: it takes LedgerEnv's once that has it (given in on_environment_created)
            env = FaultyEnv(env, self.fault["fault"], index=None, at=self.fault["at"], target=self.fault["env_index"],
                            record=self.fault["record"])
        return env


def _gym_make(env_id, ctx):
    return gym.make(env_id, **dict(ctx))


class LedgeredEnv:
    """What ``config.env`` is once instrumented: RLlib takes an env class, and calling this one returns the
    user's env with ``LedgerEnv`` around it (``creator``, a ``LedgeredEnvCreator``, set on a subclass per
    ``instrument`` call, travels with the config to every env runner)."""

    creator = None

    def __new__(cls, ctx=None):
        return cls.creator({} if ctx is None else ctx)


def creator_of(env):
    return env.creator if isinstance(env, type) and issubclass(env, LedgeredEnv) else None


def runner_base(env_runner):
    """The global index of a runner's first sub-env: (worker_index - 1) * n on remote runners, 0 on the local one."""
    w, n = int(env_runner.worker_index), int(env_runner.num_envs)
    return 0 if w == 0 else (w - 1) * n


def _recreated(env_runner):
    """Whether RLlib restarted this remote runner's actor after a failure (the local runner never is)."""
    if int(env_runner.worker_index) == 0:
        return False
    try:
        import ray
        with warnings.catch_warnings():  # Ray 2.60's property reads its own deprecated actor_id
            warnings.simplefilter("ignore", DeprecationWarning)
            return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:
        return False


def _index_env(run, env_runner, env, **_):
    """on_environment_created: each sub-env of the runner gets its global index."""
    if env_runner.config.in_evaluation:
        return
    n = int(env_runner.num_envs)
    base = runner_base(env_runner)
    if _recreated(env_runner):
        # RLlib restarted this runner's actor after a failure: new indices, so that the ledgers of the
        # runner it replaces are neither overwritten nor continued by another process.
        import ray
        allocator = ray.get_actor(ALLOCATOR % run)
        base = ray.get(allocator.take.remote(n))
    env_runner._stepledger_base = base
    # each env ledger is told the run (the trainer files carry it too: EpisodeRecorder's run), so that compare
    # pairs them by it, not by their recordings overlapping in time (compare.other_run)
    if hasattr(env, "set_attr"):
        env.set_attr("stepledger_index", [base + j for j in range(n)])
        env.set_attr(S.LINK_ATTR, [(run, base + j) for j in range(n)])
        return
    # a multi-agent runner's vector env (RLlib's SyncVectorMultiAgentEnv): each sub-env's LedgerMultiAgentEnv
    from stepledger.rllib.multiagent import ledger_of
    for j, sub in enumerate(env.envs):
        ledger = ledger_of(sub)
        if ledger is not None:
            ledger.set_index(base + j)
            ledger.link(run)
            env_runner._stepledger_agents = ledger.stream_agents
    if getattr(env_runner, "_stepledger_agents", None) is not None:
        # RLlib's own per-episode metrics, as it logs them: stepledger episodes checks them (rllib/episodes.py)
        from stepledger.rllib.episodes import install_metrics_log
        install_metrics_log(env_runner, creator_of(env_runner.config.env).directory, base)


def _tag_episode(env_runner, episode, env_index, **_):
    """on_episode_created: the episode carries its sub-env's global index (cut() copies it into each chunk)."""
    if env_runner.config.in_evaluation:
        return
    base = getattr(env_runner, "_stepledger_base", None)
    if base is None:
        base = runner_base(env_runner)
    episode.custom_data[TAG] = base + int(env_index)
    # every episode a runner creates, until its sample() ends: which of them it returned, and which it dropped
    created = getattr(env_runner, "_stepledger_created", None)
    if created is None:
        created = env_runner._stepledger_created = {}
    created.setdefault(int(env_index), []).append(episode)


def _count_dropped(env_runner, samples):
    """At the end of a runner's sample(): each episode (chunk) of its envs that was under way in this call and is
    neither returned nor still going on was dropped, with the events the env recorded of it: the runner reset its
    env under it (``EnvRunner._reset_envs_and_episodes`` "deletes ongoing episodes": with
    ``batch_mode="complete_episodes"``, at the start of every sample() call; after an env step that failed), or
    left a done episode unreturned (a sample of ``num_episodes`` stops at the episode that completes it, and
    another env's episode done at the same step is not returned). Their events are counted per stream
    (an agent's reset where it has one in the chunk, and its steps) and given to the next episode of the same
    env that the runner returns (``custom_data[DROPPED]``), so that the trainer side records where its events
    stand in the env's stream: compare then says which events never reached a learner (read.stitch)."""
    created = getattr(env_runner, "_stepledger_created", None) or {}
    env_runner._stepledger_created = {}
    carry = getattr(env_runner, "_stepledger_carry", None) or {}
    dropped = getattr(env_runner, "_stepledger_dropped", None)
    if dropped is None:
        dropped = env_runner._stepledger_dropped = {}  # env index -> {stream: events} not given on yet
    agents = getattr(env_runner, "_stepledger_agents", None)
    returned = {id(ep) for ep in samples or ()}
    ongoing = list(getattr(env_runner, "_ongoing_episodes", None) or [])
    new_carry = {}
    for i in sorted(set(carry) | set(created) | set(range(len(ongoing)))):
        now = ongoing[i] if i < len(ongoing) else None
        for ep in ([carry[i]] if i in carry else []) + created.get(i, []):  # in the order the runner had them
            if ep is None or TAG not in ep.custom_data:
                continue
            if now is not None and ep.id_ == now.id_:
                continue  # going on: itself, or the chunk that cut() continues it in (it brings a reset of no step)
            if id(ep) in returned:
                if dropped.get(i):
                    ep.custom_data[DROPPED] = dropped.pop(i)
                continue
            for stream, sa in agent_units(ep, int(ep.custom_data[TAG]), agents):
                n = len(sa) + (1 if sa.t_started == 0 and sa.is_reset else 0)
                if n:
                    counts = dropped.setdefault(i, {})
                    counts[stream] = counts.get(stream, 0) + n
        if now is not None:
            new_carry[i] = now
    env_runner._stepledger_carry = new_carry


def pending_dropped(env_runner):
    """{stream: events} of the episodes the runner dropped since the last episode of their env it returned (at
    the end of a run: events before the last resets, ``pending_resets``, that never reached a learner)."""
    if env_runner.config.in_evaluation:
        return {}
    out = {}
    for counts in (getattr(env_runner, "_stepledger_dropped", None) or {}).values():
        for stream, n in counts.items():
            out[stream] = out.get(stream, 0) + n
    return out


def _on_sample_end(settings, env_runner, samples=None, metrics_logger=None, **_):
    """on_sample_end: with the runner placement, record the episodes before they cross the object store; with
    live, check them against their live tokens and log the counts in the runner's metrics. Then, as the runner
    goes idle until its next sample() call, spill now what is due, so that a cluster killed in between keeps
    every event up to the last sample() that ended past an interval."""
    if env_runner.config.in_evaluation:
        return
    _count_dropped(env_runner, samples)
    if settings["placement"] == "runner" and samples:
        _runner_recorder(settings, env_runner).record(samples)
    if settings.get("live") and samples:
        _live_check(settings, env_runner, samples, metrics_logger)
    attend()


def _live_check(settings, env_runner, samples, metrics_logger):
    """The live check on an env runner: the episodes sample() returns (the runner placement's view) against the
    live tokens LedgerEnv(live=True) put in their infos; the counts go to RLlib's metrics (lifetime sums, under
    live.METRIC_FAULTS and live.METRIC_CHECKED: ``result["env_runners"][name]``, summed over the runners)."""
    checker = getattr(env_runner, "_stepledger_live", None)
    if checker is None:
        base = getattr(env_runner, "_stepledger_base", None)
        base = runner_base(env_runner) if base is None else base
        checker = env_runner._stepledger_live = EpisodeRecorder(
            None, base + int(env_runner.num_envs), env_runner.config, reward_dtype=settings["reward_dtype"], live=True)
        checker.logged = {}
    checker.record(samples)
    counts = checker.ledger.live_metrics() if checker.ledger is not None else {}
    if metrics_logger is not None:
        for name, value in counts.items():
            metrics_logger.log_value(name, value - checker.logged.get(name, 0), reduce="lifetime_sum")
    checker.logged = counts


def pending_resets(env_runner):
    """(stream, episode) of the runner's episodes that were reset and have no step yet. Of a multi-agent
    runner: each agent's single-agent episode that has its first observation and no step, with its agent's
    stream, whether or not the env stepped since: in a turn-based env, a sample cut between two players'
    turns returns neither player's episode (RLlib prunes an agent's episode of no step from the chunk it
    returns), so the first observations of both come with no chunk at the end of a run."""
    if env_runner.config.in_evaluation:
        return []
    agents = getattr(env_runner, "_stepledger_agents", None)
    out = []
    for ep in getattr(env_runner, "_ongoing_episodes", None) or []:
        if ep is None or not ep.is_reset or TAG not in ep.custom_data:
            continue
        if agents is None:
            if _t_started(ep) == 0 and len(ep) == 0:
                out.append((int(ep.custom_data[TAG]), ep))
            continue
        out.extend((stream, sa) for stream, sa in agent_units(ep, int(ep.custom_data[TAG]), agents)
                   if sa.t_started == 0 and len(sa) == 0 and sa.is_reset)
    return out


def _t_started(ep):
    """The env step an episode (chunk) starts at: ``t_started``, a MultiAgentEpisode's ``env_t_started``."""
    t = getattr(ep, "env_t_started", None)
    return ep.t_started if t is None else t


def agent_units(episode, env, agents):
    """(stream, single-agent episode) pairs of an episode: (env, episode) itself with ``agents`` None."""
    if agents is None:
        return [(env, episode)]
    from stepledger.rllib.multiagent import agent_units as units
    return units(episode, env, agents)


def runner_agents(env_runner):
    """The possible agents of a multi-agent runner's envs (None: a single-agent runner, or none indexed)."""
    return getattr(env_runner, "_stepledger_agents", None)


def _runner_recorder(settings, env_runner):
    """The runner placement's recorder: ``trainer-runner-{first index}.npz``, streams of this runner's envs."""
    recorder = getattr(env_runner, "_stepledger_recorder", None)
    if recorder is None:
        base = getattr(env_runner, "_stepledger_base", None)
        base = runner_base(env_runner) if base is None else base
        path = storage.join(settings["path"], RUNNER_FILE % base)
        agents = runner_agents(env_runner)
        recorder = EpisodeRecorder(path, (base + int(env_runner.num_envs)) * (len(agents) if agents else 1),
                                   env_runner.config, agents=agents,
                                   reward_dtype=settings["reward_dtype"], keep_values=settings["keep_values"],
                                   flush_interval=settings["flush_interval"], run=settings["run"])
        env_runner._stepledger_recorder = recorder
        stop = env_runner.stop

        @functools.wraps(stop)
        def stop_and_close(*args, **kwargs):
            try:
                recorder.skip(pending_dropped(env_runner))
                recorder.record_resets(pending_resets(env_runner))
                return stop(*args, **kwargs)
            finally:
                recorder.close()

        env_runner.stop = stop_and_close
    return recorder


class _Allocator:
    """Hands out blocks of indices past the first runners' ones, to runners that RLlib recreates."""

    def __init__(self, start):
        self.next = int(start)

    def take(self, n):
        base, self.next = self.next, self.next + int(n)
        return base


# ---------------------------------------------------------------- the trainer side

def env_actions(actions, action_space, config):
    """The actions the env runner sent for the policy's ``actions``, as its NormalizeAndClipActions made them."""
    if not getattr(config, "add_default_connectors_to_module_to_env_pipeline", True):
        return actions
    from ray.rllib.utils.spaces.space_utils import (
        clip_action, get_base_struct_from_space, unsquash_action)
    struct = get_base_struct_from_space(action_space)
    if config.normalize_actions:
        return unsquash_action(actions, struct)
    if config.clip_actions:
        return clip_action(actions, struct)
    return actions


def _token(info):
    """The live token in an event's info (LedgerEnv(live=True) puts it there), or None."""
    return info.get(S.TOKEN_KEY) if isinstance(info, dict) else None


def _flags(m, last):
    flags = np.zeros(m, dtype=bool)
    if m and last:
        flags[-1] = True
    return flags


class EpisodeRecorder:
    """Episodes (and chunks of them) into a trainer-side ledger, one stream per global env index.

    A chunk with ``t_started == 0`` begins with its reset obs; a later chunk's
    first obs repeats the previous chunk's last one and is not recorded again.
    """

    def __init__(self, path, num_envs, config, reward_dtype=np.float32, keep_values=False, flush_interval=None,
                 agents=None, live=False, run=None):
        self.path, self.num_envs, self.config = path, int(num_envs), config
        self.run = run  # instrument's run id, which each env ledger of the run is told too (_index_env)
        self.agents = agents  # a multi-agent run's possible agents: agent k of env e is stream e * n + k
        self.reward_dtype, self.keep_values, self.flush_interval = reward_dtype, keep_values, flush_interval
        self.live = live  # check each event against the live token in its info (path None: the check alone)
        self.ledger = None
        self.next_t = {}  # env -> the t the next chunk of that env must start at
        self.untagged = 0
        self.beyond = set()  # indices past num_envs: runners recreated more often than indices were kept for
        self.fragments, self.rows, self.end = {}, {}, {}  # a learner's: env -> [(offset, row)], rows, offset past
        self.reset_of = {}  # stream -> the id_ of the episode whose reset it recorded last
        self.count, self.skipped = {}, {}  # a runner's: env -> events recorded; events dropped before the next
        self.created = time.time()  # set up before the run samples (a learner's: at on_algorithm_init)

    def _open(self, episode):
        from stepledger.recording.trainer import TrainerLedger
        self.ledger = TrainerLedger(self.path, self.num_envs, episode.observation_space, episode.action_space,
                                    reward_dtype=self.reward_dtype, keep_values=self.keep_values,
                                    flush_interval=self.flush_interval, live=self.live, on_fault="warn",
                                    owner="stepledger.rllib")
        # the trainer side began when it was set up, not at its first episode: an env ledger that carries no
        # run id (one of an older stepledger, or told none) goes by the times, and an env runner killed before
        # the learners' first update (its ledger's last write seconds before that episode came, on a loaded
        # machine) is still of this run (compare.other_run)
        recording = getattr(self.ledger, "recording", None)
        if recording is not None:
            recording.began_at(self.created)
            if self.run is not None:
                recording.link(self.run, None)

    def record(self, episodes, positions=None):
        """Record episodes (chunks, slices). With ``positions`` (a learner's: ``EpisodePositions.of``), each
        episode's env and the offset of its reset in its env's stream come from there, by its ``id_`` (a
        slice has no ``custom_data``), and each slice's offset goes into the ledger (``set_fragments``)."""
        for ep in episodes:
            if positions is not None:
                units = [(None, sa) for _, sa in agent_units(ep, 0, self.agents)]
            else:
                tag = ep.custom_data.get(TAG) if hasattr(ep, "custom_data") else None
                if tag is None:
                    self.untagged += 1
                    continue
                units = agent_units(ep, int(tag), self.agents)
                if self.path is not None:
                    self.skip(ep.custom_data.get(DROPPED))
            for stream, sa in units:
                base = None
                if positions is not None:
                    stream, base = positions.get(sa.id_, (None, None))
                    if stream is None:
                        self.untagged += 1
                        continue
                self._record_one(stream, sa, base)

    def _record_one(self, env, ep, base):
        """One episode (chunk, slice) of stream ``env``; ``base``: the offset of its reset (a learner's)."""
        if env >= self.num_envs:
            if env not in self.beyond:
                self.beyond.add(env)
                warnings.warn("stepledger.rllib: env %d (of a runner RLlib recreated more often than the %d "
                              "indices kept for recreated runners) is not recorded on the trainer side"
                              % (env, self.num_envs), RuntimeWarning, stacklevel=3)
            return
        if self.ledger is None:
            self._open(ep)
        m, t = len(ep), ep.t_started
        # an agent that joined at a chunk's last step has its reset in that chunk and in the next one again
        again = t == 0 and self.agents is not None and self.reset_of.get(env) == ep.id_
        n = m + (t == 0 and not again)
        if base is not None:
            self._at(env, base + (0 if t == 0 and not again else 1 + t), n)
        else:
            self._after_skipped(env, n)
        if t == 0:
            if not again:
                token = _token(ep.get_infos(0)) if self.live else None
                self.ledger.env_reset(env, ep.get_observations(0), token)  # without the lookback buffer
                self.reset_of[env] = ep.id_
        elif base is None and self.next_t.get(env) != t:
            warnings.warn("stepledger.rllib: env %d: a chunk starting at step %d follows one that ended at %s: "
                          "the steps between never reached the learner" % (env, t, self.next_t.get(env)),
                          RuntimeWarning, stacklevel=3)
        self.next_t[env] = t + m
        if m == 0:
            return
        actions = env_actions(ep.get_actions(), ep.action_space, self.config)
        tokens = [_token(info) for info in ep.get_infos(slice(1, None))] if self.live else None
        self.ledger.env_steps(env, actions, ep.get_observations(slice(1, None)), np.asarray(ep.get_rewards()),
                              _flags(m, ep.is_terminated), _flags(m, ep.is_truncated), tokens)

    def skip(self, dropped):
        """A runner's: events of streams that it dropped ({stream: events}, ``DROPPED``): the next events of each
        stream are recorded at an offset past them (a new fragment), so that compare names them."""
        for env, n in (dropped or {}).items():
            self.skipped[int(env)] = self.skipped.get(int(env), 0) + int(n)

    def _after_skipped(self, env, n):
        """A runner's: the next n events of env, after the events dropped before them (``skip``), if any."""
        if env in self.fragments or self.skipped.get(env):
            if env not in self.fragments:  # the events so far: its first fragment, from offset 0
                self.fragments[env] = [(0, 0)]
                self.rows[env] = self.end[env] = self.count.get(env, 0)
            self._at(env, self.end[env] + self.skipped.pop(env, 0), n)
        self.count[env] = self.count.get(env, 0) + n

    def _at(self, env, offset, n):
        """The next n events of env are at ``offset`` of its stream: a new fragment where they do not follow
        this ledger's last ones of that env (given before the events, so that a spill never has more)."""
        if self.end.get(env) != offset:
            self.fragments.setdefault(env, []).append((offset, self.rows.get(env, 0)))
            self.ledger.set_fragments(self.fragments)
        self.rows[env] = self.rows.get(env, 0) + n
        self.end[env] = offset + n

    def record_resets(self, resets, offsets=None):
        """Resets a runner did after its last ``sample()`` returned: an episode just reset has no step yet and
        is not returned (its reset obs starts the next chunk). At the end of a run they would never come.
        ``offsets`` (a learner's) gives each reset's offset in its env's stream."""
        for k, (env, ep) in enumerate(resets):
            if self.agents is not None and offsets is None and self.reset_of.get(env) == ep.id_:
                continue  # a chunk brought this agent's reset already
            if offsets is not None and offsets[k] is None:
                continue  # the learners were handed it already (EpisodePositions.resets)
            if self.ledger is None:
                self._open(ep)
            if 0 <= env < self.num_envs:
                if offsets is not None:
                    self._at(env, offsets[k], 1)
                else:
                    self._after_skipped(env, 1)
                self.ledger.env_reset(env, ep.get_observations(0))
                self.reset_of[env] = ep.id_
                self.next_t[env] = 0

    def flush(self):
        if self.ledger is not None:
            self.ledger.flush()

    def close(self):
        if self.ledger is not None:
            self.ledger.close()


def _training_episodes(kwargs):
    td = kwargs.get("training_data")
    if td is not None:
        if td.episodes_refs is not None:
            td.solve_refs()
        return td.episodes or []
    return kwargs.get("episodes") or []


def _hook_algorithm(settings, algorithm, **_):
    """on_algorithm_init (the algorithm's process): with the learner placement, record what the learner group
    is handed and close at stop(); the allocator of indices for recreated runners either way."""
    import ray
    config = algorithm.config
    runners = int(config.num_env_runners)
    n = int(config.num_envs_per_env_runner)
    total = n * max(runners, 1)
    if runners and config.restart_failed_env_runners:
        algorithm._stepledger_allocator = ray.remote(num_cpus=0)(_Allocator).options(
            name=ALLOCATOR % settings["run"]).remote(total)
        restarts = min(int(config.max_num_env_runner_restarts), RESTARTS_KEPT)
        total += restarts * n * runners
    agents = None
    if config.is_multi_agent:  # each agent of each sub-env is a stream: total * n of them
        agents = _possible_agents(algorithm)
        total *= len(agents)
    if settings["placement"] != "learner":
        return
    group = algorithm.learner_group
    # each learner records its own shard into its own file: trainer.npz for one learner, else
    # trainer-learner-K.npz; with several, RLlib slices episodes across them, and compare stitches an env's
    # slices by their offsets in its stream, which the driver works out from the episodes it hands the group
    learners = [r.actor_id for r in group.foreach_learner(_learner_token)]
    for k, actor in enumerate(learners):
        name = TRAINER_FILE if len(learners) == 1 else LEARNER_FILE % k
        for r in group.foreach_learner(_install_tap, remote_actor_ids=None if group.is_local else [actor],
                                       path=storage.join(settings["path"], name), num_envs=total,
                                       options=dict(reward_dtype=settings["reward_dtype"], agents=agents,
                                                    keep_values=settings["keep_values"],
                                                    flush_interval=settings["flush_interval"], run=settings["run"])):
            if not r.ok:  # RLlib returns a learner's error instead of raising it
                raise r.get()
            if r.get() is False:
                raise no_learner_pipeline(config.learner_class)
    positions = EpisodePositions(agents)
    algorithm._stepledger_positions = positions
    update, stop = group.update, algorithm.stop

    @functools.wraps(update)
    def recording_update(*args, **kwargs):
        group.foreach_learner(_set_positions, positions=positions.of(_training_episodes(kwargs)))
        return update(*args, **kwargs)

    @functools.wraps(stop)
    def stop_and_close(*args, **kwargs):
        try:
            try:
                runners = algorithm.env_runner_group
                resets = runners.foreach_env_runner(pending_resets, local_env_runner=runners.local_env_runner
                                                    is not None and runners.local_env_runner.env is not None)
                resets = [pair for part in resets for pair in part]
                for part in runners.foreach_env_runner(pending_dropped, local_env_runner=runners.local_env_runner
                                                       is not None and runners.local_env_runner.env is not None):
                    positions.skip(part)
                group.foreach_learner(_record_resets, remote_actor_ids=None if group.is_local else learners[:1],
                                      resets=resets, offsets=positions.resets(resets))
            except Exception as exc:  # a runner or learner already gone: its last resets stay unrecorded
                warnings.warn("stepledger.rllib: could not record the env runners' last resets: %s" % exc,
                              RuntimeWarning, stacklevel=2)
            try:
                group.foreach_learner(_close_tap)
            except Exception as exc:  # a learner already gone: its ledger ends at its last spill
                warnings.warn("stepledger.rllib: could not close the learners' trainer ledgers: %s" % exc,
                              RuntimeWarning, stacklevel=2)
            return stop(*args, **kwargs)
        finally:
            if group.is_local:
                group.foreach_learner(_close_tap)  # in this process: closed even where the call above failed

    group.update = recording_update
    algorithm.stop = stop_and_close


class EpisodePositions:
    """Where the events of the episodes the learner group is handed stand in their envs' streams (the driver's
    view: tagged episodes, each env's chunks in order): ``of(episodes)`` maps each one's ``id_`` to (its env,
    the offset of its reset), which survive RLlib's slicing of episodes across learners (``custom_data`` does
    not). An env's stream: a reset, the episode's steps, the next reset..."""

    def __init__(self, agents=None):
        self.base = {}  # id_ of an episode not yet done -> (env, offset of its reset)
        self.end = {}   # env -> the offset past its last event handed to the learners
        self.agents = agents  # a multi-agent run's: each agent's episode is keyed by its own id_, stream e * n + k

    def of(self, episodes):
        out = {}
        for episode in episodes:
            tag = episode.custom_data.get(TAG)
            if tag is None:
                continue
            self.skip(episode.custom_data.get(DROPPED))
            for env, ep in agent_units(episode, int(tag), self.agents):
                t = ep.t_started
                known = self.base.get(ep.id_)
                if t == 0:
                    # an agent that joined at a chunk's last step: its reset is in the next chunk again
                    base = known[1] if known is not None and self.agents is not None else self.end.get(env, 0)
                else:
                    base = known[1] if known is not None else self.end.get(env, 0) - 1 - t
                    if base + 1 + t != self.end.get(env):
                        warnings.warn("stepledger.rllib: env %d: a chunk starting at step %d follows one that ended "
                                      "at event %s of its stream, not %d: the events between never reached the "
                                      "learner" % (env, t, self.end.get(env), base + 1 + t), RuntimeWarning,
                                      stacklevel=2)
                out[ep.id_] = (env, base)
                self.end[env] = base + 1 + t + len(ep)
                if ep.is_done:
                    self.base.pop(ep.id_, None)
                else:
                    self.base[ep.id_] = (env, base)
        return out

    def skip(self, dropped):
        """Events of streams that a runner dropped ({stream: events}, ``DROPPED``): the next ones of each stream
        stand past them."""
        for env, n in (dropped or {}).items():
            self.end[int(env)] = self.end.get(int(env), 0) + int(n)

    def resets(self, resets):
        """The offsets of the resets (env, episode) that no chunk brought (``pending_resets``); None for one
        that a chunk brought (an agent's episode handed to the learners with no step yet)."""
        out = []
        for env, ep in resets:
            if self.agents is not None and ep.id_ in self.base:
                out.append(None)  # an agent's episode a chunk handed the learners: its reset is there
                continue
            out.append(self.end.get(env, 0))
            self.end[env] = out[-1] + 1
        return out


def _possible_agents(algorithm):
    """The possible agents of a multi-agent run's envs, as its env runners' LedgerMultiAgentEnvs have them."""
    runners = algorithm.env_runner_group
    local = runners.local_env_runner is not None and runners.local_env_runner.env is not None
    for agents in runners.foreach_env_runner(runner_agents, local_env_runner=local):
        if agents:
            return agents
    raise SettingsError("stepledger.rllib.instrument: this multi-agent config's env runners hold no "
                        "MultiAgentEnv of possible_agents to record (is config.env a MultiAgentEnv?)")


def _learner_token(learner):
    return None


def _tap_class():
    from ray.rllib.connectors.connector_v2 import ConnectorV2

    class StepledgerLearnerTap(ConnectorV2):
        """The first piece of a learner's connector pipeline: records the learner's shard of episodes (slices
        of them with several learners) as handed to it, before any other piece changes them."""

        def __init__(self, recorder):
            super().__init__()
            self.recorder, self.positions = recorder, {}

        def __call__(self, *, rl_module, batch, episodes, **kwargs):
            self.recorder.record(episodes, self.positions)
            attend()
            return batch

    return StepledgerLearnerTap


# Ray 2.60 gives no public way to the learner connector pipeline a learner runs: PPO's learner prepends its
# AddOneTsToEpisodesAndTruncate to the private Learner._learner_connector in build(), before the pieces of
# config.learners(learner_connector=...), so the trainer side is recorded by a piece prepended there after
# build (docs/RLLIB.md, "Ray's private names"). LEARNER_PIPELINE names it once.
LEARNER_PIPELINE = "_learner_connector"


def learner_pipeline(learner):
    """The learner connector pipeline a built RLlib learner runs (``Learner._learner_connector``), or None where
    this Ray's learner has none there to prepend to."""
    pipeline = getattr(learner, LEARNER_PIPELINE, None)
    return pipeline if callable(getattr(pipeline, "prepend", None)) else None


def no_learner_pipeline(learner_class):
    """The one-line error where a learner has no connector pipeline at LEARNER_PIPELINE (another Ray)."""
    import ray
    return SettingsError("stepledger.rllib: the %s learner of this Ray (%s) has no connector pipeline at %s, where "
                         "the trainer side records what it trains on (Ray 2.60 has one); use "
                         "instrument(..., placement='runner')" % (getattr(learner_class, "__name__", learner_class),
                                                                   ray.__version__, LEARNER_PIPELINE))


def _install_tap(learner, path, num_envs, options):
    """In the learner's process: its recorder, as the first piece of its learner connector (before PPO's
    AddOneTsToEpisodesAndTruncate, which adds a step and renames ``id_``). False where it has none."""
    pipeline = learner_pipeline(learner)
    if pipeline is None:
        return False
    tap = _tap_class()(EpisodeRecorder(path, num_envs, learner.config, **options))
    pipeline.prepend(tap)
    learner._stepledger_tap = tap
    return True


def learner_pieces(learner):
    """The class names of the pieces of a learner's connector pipeline, in order (None: it has none)."""
    pipeline = learner_pipeline(learner)
    return None if pipeline is None else [type(piece).__name__ for piece in pipeline.connectors]


def _set_positions(learner, positions):
    learner._stepledger_tap.positions = positions


def _record_resets(learner, resets, offsets):
    learner._stepledger_tap.recorder.record_resets(resets, offsets)


def _close_tap(learner):
    tap = getattr(learner, "_stepledger_tap", None)
    if tap is not None:
        tap.recorder.close()


# ---------------------------------------------------------------- the one call

def _append(existing, fn):
    if existing is None:
        return [fn]
    if isinstance(existing, (list, tuple)):
        return list(existing) + [fn]
    return [existing, fn]


def instrument(config: AlgorithmConfig, path: str | os.PathLike[str], *, placement: Placement = "auto",
               reward_dtype: Any = np.float32, keep_values: bool = False,
               flush_interval: float | None = None, live: bool = False) -> AlgorithmConfig:
    """Record both sides of an RLlib run into ``path`` (a directory or an fsspec URL); returns the config.

    The user's env, callbacks, connectors and learner keep working as they
    were: the env creator is wrapped, and stepledger's callbacks are added
    after the user's own.

    Args:
        config: an ``AlgorithmConfig`` of the new API stack (env runners and learners), single agent.
        path: where the ledgers go: ``env-N.npz`` for each sub-env, ``trainer.npz`` (with several learners
            ``trainer-learner-K.npz`` for each; with the runner placement ``trainer-runner-N.npz`` for each
            env runner).
        placement: where the trainer side records: ``"learner"``, what each learner is handed (after
            the object store); ``"runner"``, the episodes each env runner returns (``on_sample_end``, before
            they cross); ``"auto"`` (default): ``"learner"`` for PPO, whose learners train on the episodes
            just sampled, ``"runner"`` for the others (a replay buffer or an aggregator stands between the
            runners and the learners there, so the learners' batches are not the episodes in order).
        reward_dtype, keep_values, flush_interval: as for ``LedgerEnv``.
        live: also check, on each env runner, the episodes ``sample()`` returns against the live tokens
            ``LedgerEnv(live=True)`` puts in each event's info, as they come: a fault warns in the runner, and
            the counts go to RLlib's metrics (``result["env_runners"][name]``, summed over the runners, under the
            names ``stepledger.recording.live.METRIC_FAULTS`` and ``METRIC_CHECKED``: docs/LIVE.md).
    """
    try:
        from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    except ImportError as exc:
        raise ImportError("stepledger.rllib needs Ray RLlib: pip install 'plugrl-stepledger[rllib]' (%s)" % exc) \
            from None
    if not isinstance(config, AlgorithmConfig):
        raise SettingsError("stepledger.rllib.instrument: config must be an RLlib AlgorithmConfig "
                            "(PPOConfig() ...), got %s" % type(config).__name__)
    if not (config.enable_env_runner_and_connector_v2 and config.enable_rl_module_and_learner):
        raise SettingsError("stepledger.rllib.instrument: the config is on RLlib's old API stack; stepledger records "
                            "the new one (env runners, episodes and learners)")
    if creator_of(config.env) is not None:
        raise SettingsError("stepledger.rllib.instrument: this config is already instrumented (into %s)"
                            % creator_of(config.env).directory)
    if not config.env:
        raise SettingsError("stepledger.rllib.instrument: the config has no env: call "
                            "config.environment(...) first")
    mode = str(getattr(config, "gym_env_vectorize_mode", "sync")).lower()
    if "vector_entry_point" in mode:
        raise SettingsError("stepledger.rllib.instrument: gym_env_vectorize_mode=%s builds no single sub-envs "
                            "to record; use 'sync' or 'async'" % config.gym_env_vectorize_mode)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError("stepledger.rllib.instrument: path must be a directory or an fsspec URL, got %r" % (path,))
    path = os.fspath(path)
    if not storage.is_remote(path):
        path = os.path.abspath(path)  # the runners may run elsewhere: never relative to their working directory
        os.makedirs(path, exist_ok=True)
    if placement not in PLACEMENTS:
        raise ValueError("stepledger.rllib.instrument: placement must be one of %s, got %r"
                         % (", ".join(PLACEMENTS), placement))
    if placement == "auto":
        from ray.rllib.algorithms.ppo import PPOConfig
        placement = "learner" if isinstance(config, PPOConfig) else "runner"
    user_env = config.env
    settings = dict(run=uuid.uuid4().hex[:16], path=path, placement=placement, reward_dtype=reward_dtype,
                    keep_values=keep_values, flush_interval=flush_interval, live=bool(live))
    creator = LedgeredEnvCreator(user_env, path, reward_dtype, keep_values, flush_interval, bool(live))
    config.environment(env=type("LedgeredEnv", (LedgeredEnv,), {"creator": creator}))
    # evaluation runners build the user's env itself: their episodes reach no learner
    evaluation = config.evaluation_config
    if evaluation is None:
        config.evaluation(evaluation_config={"env": user_env})
    elif isinstance(evaluation, dict) and "env" not in evaluation:
        config.evaluation(evaluation_config=dict(evaluation, env=user_env))
    elif not isinstance(evaluation, dict) and creator_of(getattr(evaluation, "env", None)) is not None:
        evaluation.env = user_env
    config.callbacks(
        on_environment_created=_append(config.callbacks_on_environment_created,
                                       functools.partial(_index_env, settings["run"])),
        on_episode_created=_append(config.callbacks_on_episode_created, _tag_episode),
        on_sample_end=_append(config.callbacks_on_sample_end, functools.partial(_on_sample_end, settings)),
        on_algorithm_init=_append(config.callbacks_on_algorithm_init, functools.partial(_hook_algorithm, settings)),
    )
    return config


# ---------------------------------------------------------------- faults on purpose (the fault kit's RLlib injector)
