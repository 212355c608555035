"""``check_rllib``: the check's fault matrix on short RLlib PPO runs (``stepledger check --trainer rllib``)."""

from __future__ import annotations

import os
from typing import Any, Sequence


from stepledger.faults.check import CheckReport, clean_steps, faults_from, no_opportunity, run_check
from stepledger.faults.engine import ENV_SIDE_FAULTS, check_fault, read_record
from stepledger.errors import SettingsError
from stepledger.format import storage
from stepledger.report.compare import compare
from stepledger.rllib.faults import CONNECTOR_FAULTS, inject
from stepledger.rllib.instrument import TRAINER_FILE, instrument

def _ppo_config(env_id, max_episode_steps, runners, envs, batch, seed):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    env_config = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
    return (PPOConfig()
            .environment(env_id, env_config=env_config)
            .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs,
                         num_cpus_per_env_runner=0.25 if runners else 1)
            .training(train_batch_size_per_learner=batch, minibatch_size=min(batch, 128), num_epochs=1)
            .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[16]))
            .debugging(seed=seed, log_level="ERROR"))


def shared_module(agent_id, episode, **kwargs):
    """The multi-agent check's policy_mapping_fn: every agent feeds one module, "shared"."""
    return "shared"


def _agent_stream(directory, target, agent):
    """Agent ``agent``'s stream in env ``target``'s ledger of a multi-agent run (target * n + k)."""
    from stepledger.format import schema as S
    from stepledger.report.read import read
    with read(os.path.join(directory, "env-%d.npz" % target)) as ledger:
        agents = next(iter(ledger.streams.values())).meta.get(S.META_POSSIBLE_AGENTS) or []
    if agent not in agents:
        raise SettingsError("check_rllib: agent %r is not one of the env's agents %s" % (agent, agents))
    return target * len(agents) + agents.index(agent)


def check_rllib(env_id: str, faults: Sequence[str] = ENV_SIDE_FAULTS, runners: int = 2, envs: int = 2,
                iterations: int = 1, batch: int = 400, at: int = 5, target: int | None = None,
                max_episode_steps: int | None = 20, place: str = "wrapper", seed: int = 0,
                directory: str | os.PathLike[str] | None = None, keep: bool = False,
                progress: Any = None, agent: str | None = None) -> CheckReport:
    """``check_boundary`` on RLlib: short PPO runs of ``env_id`` (one clean, one per fault) on env runners with
    both ledgers in, each fault injected by ``inject`` at env ``target`` (default: the last one); returns a
    ``stepledger.check.CheckReport``. Starts a local Ray (``ray.init()``) unless one is running, and shuts
    down what it started. With ``agent``, ``env_id`` is a registered ``MultiAgentEnv`` whose agents all feed
    one module, and each fault hits that agent's episode in the connector pipeline (``place="connector"``)."""
    import ray

    if agent is not None and place != "connector":
        raise SettingsError("check_rllib: a multi-agent check (agent=%r) injects in the connector pipeline: give "
                            "place='connector' (--place connector)" % (agent,))


    allowed = ENV_SIDE_FAULTS if place == "wrapper" else CONNECTOR_FAULTS
    faults = [check_fault(f, allowed, "check_rllib") for f in faults]
    n_envs = envs * max(runners, 1)
    target = n_envs - 1 if target is None else int(target)
    if not 0 <= target < n_envs:
        raise ValueError("check_rllib: target must be an env index below %d (runners x envs), got %r"
                         % (n_envs, target))
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", include_dashboard=False, log_to_driver=False)  # never another's cluster

    def one(sub, fault):
        config = _ppo_config(env_id, max_episode_steps, runners, envs, batch, seed)
        if agent is not None:
            config = config.multi_agent(policies={"shared"}, policy_mapping_fn=shared_module)
        config = instrument(config, sub)
        record = os.path.join(sub, "fault.json")
        if fault is not None:
            inject(config, fault, env=target, at=at, record=record, place=place, agent=agent)
        algo = config.build_algo()
        try:
            for _ in range(iterations):
                algo.train()
        finally:
            algo.stop()
        return compare(sub, storage.join(sub, TRAINER_FILE)), read_record(record) if fault else None

    def opportunity(fault, clean_dir):
        stream = None if agent is None else _agent_stream(clean_dir, target, agent)
        reason, _ = no_opportunity(fault, *clean_steps(clean_dir, target, stream), at, target,
                                   lambda: max_episode_steps)
        return reason, None  # RLlib runs are sized in iterations, not vector steps

    try:
        return run_check(one, faults, opportunity, directory, keep, progress=progress, prefix="stepledger-check-rllib-")
    finally:
        if started:
            ray.shutdown()


def check_from_cli(args, progress):
    """``stepledger check --trainer rllib``: check_rllib on ``args.env_id``."""
    allowed = CONNECTOR_FAULTS if args.place == "connector" else ENV_SIDE_FAULTS
    return check_rllib(args.env_id, faults=faults_from(args.faults, allowed), runners=args.runners, envs=args.num_envs,
                       iterations=args.iterations, max_episode_steps=args.max_episode_steps, place=args.place,
                       directory=args.dir, keep=args.keep, progress=progress, agent=getattr(args, "agent", None))
