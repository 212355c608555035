"""Ray RLlib: both ledgers of a run, with one call on the algorithm config.

    >>> from ray.rllib.algorithms.ppo import PPOConfig
    >>> import stepledger.rllib
    >>> config = PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=2, num_envs_per_env_runner=2)
    >>> config = stepledger.rllib.instrument(config, "s3://bucket/run-17")  # or a local or shared directory
    >>> algo = config.build_algo(); algo.train(); algo.stop()

One folder holds the library's support: ``instrument`` (both sides: the env runners and the learners;
its docstring says where each is recorded), ``faults`` (``inject``), ``check`` (``check_rllib``, ``stepledger
check --trainer rllib``), ``library`` (its line in ``stepledger.libraries``), ``multiagent`` (``LedgerMultiAgentEnv``, the env side of a
multi-agent run; it subclasses RLlib's MultiAgentEnv, so it is imported from there, not from this face), ``episodes`` (``check_rllib_episodes``: RLlib's own episode metrics against the env ledgers). docs/RLLIB.md has the whole story.
"""

from typing import TYPE_CHECKING

from stepledger._moved import lazy_face

if TYPE_CHECKING:  # what an editor and a type checker see; at run time each name is imported on first use
    from stepledger.rllib.instrument import ALLOCATOR, EpisodePositions, EpisodeRecorder, LEARNER_FILE, LEARNER_PIPELINE, LedgeredEnv, LedgeredEnvCreator, PLACEMENTS, RESTARTS_KEPT, RUNNER_FILE, TAG, TRAINER_FILE, attend, env_actions, instrument, learner_pieces, learner_pipeline, no_learner_pipeline, pending_resets, runner_base
    from stepledger.rllib.faults import CONNECTOR_FAULTS, PLACES, inject
    from stepledger.rllib.check import check_rllib
    from stepledger.rllib.episodes import check_rllib_episodes

_NAMES = {
    **dict.fromkeys(('TAG', 'TRAINER_FILE', 'LEARNER_FILE', 'RUNNER_FILE', 'PLACEMENTS', 'ALLOCATOR', 'RESTARTS_KEPT', 'LedgeredEnvCreator', 'LedgeredEnv', 'runner_base', 'pending_resets', 'env_actions', 'EpisodeRecorder', 'EpisodePositions', 'LEARNER_PIPELINE', 'learner_pipeline', 'no_learner_pipeline', 'learner_pieces', 'instrument', 'attend'), 'instrument'),
    **dict.fromkeys(('PLACES', 'CONNECTOR_FAULTS', 'inject'), 'faults'),
    **dict.fromkeys(('check_rllib',), 'check'),
    **dict.fromkeys(('check_rllib_episodes',), 'episodes'),
}
__all__ = sorted(_NAMES)
if not TYPE_CHECKING:  # a type checker sees only the names above: a misspelt one is an error, not Any
    __getattr__, __dir__ = lazy_face(__name__, _NAMES)
