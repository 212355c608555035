"""``stepledger check --trainer tianshou``: the fault matrix on a Tianshou stack.

One clean rollout, then one per fault: a Tianshou vector env of ``num_envs``
copies of the env (``ledger_env_fns``: LedgerEnv in each worker), stepped by
a ``LedgerCollector`` with random actions (``collect(n_step=..., random=True)``)
into a ``VectorReplayBuffer``; each fault is injected at dose ``one`` in the
worker (``FaultyEnv`` outside LedgerEnv, ``place="worker"``) or between the
vector env and the collector (``FaultyVectorEnv``, ``place="vector"``), and
the report says whether compare named its env, episode, step and field.
"""

from typing import Any

import os

import numpy as np

from stepledger.faults.check import clean_steps, faults_from, no_opportunity, registered_env, run_check
from stepledger.faults.engine import check_fault, read_record
from stepledger.report.compare import compare
from stepledger.tianshou.faults import ENV_SIDE_FAULTS, VECTOR_FAULTS, FaultyVectorEnv, inject_in_worker

__all__ = ["PLACES", "VECTORS", "check", "check_collector", "check_from_cli"]

VECTORS = ("dummy", "subproc", "shmem")
PLACES = ("worker", "vector")


def _vector_env(kind, fns):
    from tianshou.env import DummyVectorEnv, ShmemVectorEnv, SubprocVectorEnv
    return {"dummy": DummyVectorEnv, "subproc": SubprocVectorEnv, "shmem": ShmemVectorEnv}[kind](fns)


def collector_rollout(env_fn, vector, num_envs, steps, directory, fault=None, place="worker", target=0, at=5,
                      seed=0):
    """One rollout with both ledgers (and ``fault`` injected at ``place``); returns (compare's report, where the
    fault first struck or None)."""
    from tianshou.algorithm.algorithm_base import RandomActionPolicy
    from tianshou.data import VectorReplayBuffer

    from stepledger.tianshou.collector import LedgerCollector
    from stepledger.tianshou.envs import ledger_env_fns

    record = os.path.join(directory, "fault.json")
    wrap = None
    if fault is not None and place == "worker":
        wrap = inject_in_worker(fault, at=at, target=target, record=record)
    venv = _vector_env(vector, ledger_env_fns(env_fn, num_envs, directory, pass_index=True, wrap=wrap))
    trainer_file = os.path.join(directory, "trainer.npz")
    injector = None
    try:
        if fault is not None and place == "vector":
            venv = injector = FaultyVectorEnv(venv, fault, at=at, target=target)
        policy = RandomActionPolicy(venv.action_space[0])
        collector = LedgerCollector(policy, venv, VectorReplayBuffer((steps + 1) * num_envs, num_envs),
                                    path=trainer_file)
    except BaseException:
        venv.close()
        raise
    try:
        spaces: Any = collector.action_space
        for k, space in enumerate(spaces):
            space.seed(seed + k)
        collector.reset()
        collector.collect(n_step=steps * num_envs, random=True)
    finally:
        collector.close()
    injected = injector.first if injector is not None else (read_record(record) if fault else None)
    return compare(directory, trainer_file), injected


def check_collector(env_fn, vector="subproc", place="worker", num_envs=4, steps=200, faults=None, at=5, target=None,
                    seed=0, directory=None, keep=False, progress=None):
    """Check that the ledgers catch and locate every boundary fault on a Tianshou stack.

    Args:
        env_fn: ``env_fn(index)`` returns the user's env (with its own TimeLimit and wrappers); picklable, or
            a lambda (Tianshou sends factories to its workers with cloudpickle).
        vector: "dummy", "subproc" or "shmem": Tianshou's ``DummyVectorEnv``, ``SubprocVectorEnv`` or
            ``ShmemVectorEnv``.
        place: "worker" (``FaultyEnv`` outside LedgerEnv in each env's process; the env-side faults) or
            "vector" (``FaultyVectorEnv`` between the vector env and the collector; the trainer-side faults,
            the swaps among them).
        num_envs, steps: the rollout's size (vector steps); episodes must end within it for the episode-end
            faults to be exercised.
        faults: the faults to inject, one run each (default: every fault of the place).
        at, target, seed, directory, keep, progress: as for ``stepledger.check.check_boundary``.

    Returns the generic CheckReport, truthy when every exercised fault was caught and located.
    """
    if vector not in VECTORS:
        raise ValueError("check_collector: vector must be one of %s, got %r" % (", ".join(VECTORS), vector))
    if place not in PLACES:
        raise ValueError("check_collector: place must be one of %s, got %r" % (", ".join(PLACES), place))
    for name, value in (("num_envs", num_envs), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError("check_collector: %s must be a positive int, got %r" % (name, value))
    allowed = ENV_SIDE_FAULTS if place == "worker" else VECTOR_FAULTS
    faults = list(allowed if faults is None else [check_fault(f, allowed, "check_collector") for f in faults])
    target = num_envs - 1 if target is None else int(target)
    if not 0 <= target < num_envs:
        raise ValueError("check_collector: target must be an env index below num_envs=%d, got %r"
                         % (num_envs, target))

    def time_limit():
        env = env_fn(target)
        try:
            limit = getattr(getattr(env, "spec", None), "max_episode_steps", None)
            return int(limit) if limit else None
        finally:
            env.close()

    def one(sub, fault):
        return collector_rollout(env_fn, vector, num_envs, steps, sub, fault, place, target, at, seed)

    def opportunity(fault, clean_dir):
        return no_opportunity(fault, *clean_steps(clean_dir, target), at, target, time_limit)

    return run_check(one, faults, opportunity, directory, keep, steps, progress, prefix="stepledger-check-tianshou-")


def check(env_id, *, faults=None, num_envs=4, steps=200, directory=None, keep=False, progress=None, vector=None,
          place=None, max_episode_steps=20, **options):
    """``stepledger check ENV_ID --trainer tianshou``: ``check_collector`` on ``gym.make(env_id)``.

    ``vector`` ("subproc" by default) and ``place`` ("worker" by default) are also taken as
    ``tianshou_vector`` and ``tianshou_place`` (the command line's ``--tianshou-vector`` and
    ``--tianshou-place``); ``max_episode_steps`` is the env's time limit (20 by default, so that episodes end
    within a short rollout); ``at``, ``target`` and ``seed`` as for ``check_collector``.
    """
    vector = vector or options.pop("tianshou_vector", None) or "subproc"
    place = place or options.pop("tianshou_place", None) or "worker"
    known = {k: options.pop(k) for k in ("at", "target", "seed") if k in options}
    unknown = sorted(k for k, v in options.items() if v is not None)
    if unknown:
        raise TypeError("stepledger.tianshou.check: unknown option(s) %s" % ", ".join(unknown))
    return check_collector(registered_env(env_id, max_episode_steps), vector=vector, place=place, num_envs=num_envs,
                           steps=steps, faults=faults, directory=directory, keep=keep, progress=progress, **known)


def check_from_cli(args, progress):
    """``stepledger check ENV_ID --trainer tianshou``: check_collector on ``gym.make(args.env_id)``, on the vector env
    of ``--tianshou-vector`` with each fault injected at ``--tianshou-place``."""
    allowed = ENV_SIDE_FAULTS if args.tianshou_place == "worker" else VECTOR_FAULTS
    return check_collector(registered_env(args.env_id, args.max_episode_steps), vector=args.tianshou_vector,
                           place=args.tianshou_place, num_envs=args.num_envs, steps=args.steps,
                           faults=faults_from(args.faults, allowed), directory=args.dir, keep=args.keep,
                           progress=progress)
