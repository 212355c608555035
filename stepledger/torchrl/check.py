"""``stepledger check --trainer torchrl``: the fault matrix on a TorchRL stack.

One clean rollout, then one per fault: a TorchRL ``SerialEnv`` or ``ParallelEnv`` of ``num_envs`` copies of the
env (``ledger_env_fns``: LedgerEnv in each worker, inside GymWrapper), sampled by a ``Collector`` with random
actions (no policy) through a ``LedgerCollector``; each fault is injected at dose ``one``, in the worker
(``FaultyEnv`` outside LedgerEnv) or between the batched env and the collector (``FaultyTransform`` on the
batched env), and the report says whether compare named its env, episode, step and field.
"""

import os

import numpy as np

from stepledger.faults.check import clean_steps, faults_from, no_opportunity, registered_env, run_check
from stepledger.faults.engine import FAULTS, check_fault, read_record
from stepledger.report.compare import compare
from stepledger.torchrl.faults import ENV_SIDE_FAULTS, TRAINER_SIDE_FAULTS, FaultyTransform, inject_in_worker

__all__ = ["PLACES", "VECTORS", "check_collector", "check_from_cli", "collector_rollout", "faults_of", "place_of"]

VECTORS = ("serial", "parallel")
# "worker": each fault in the worker where it can be injected there (the env-side ones), the others (the swaps
# between envs) through FaultyTransform; "batched": every fault through FaultyTransform (the trainer-side ones)
PLACES = ("worker", "batched")


def faults_of(place):
    """The faults a check at ``place`` can inject."""
    return FAULTS if place == "worker" else TRAINER_SIDE_FAULTS


def place_of(fault, place="worker"):
    """Where a check at ``place`` injects ``fault``: "worker" or "batched"."""
    return "worker" if place == "worker" and fault in ENV_SIDE_FAULTS else "batched"


def collector_rollout(env_fn, vector, num_envs, steps, directory, fault=None, target=0, at=5, seed=0,
                      place="worker"):
    """One rollout with both ledgers (and ``fault`` injected where ``place_of(fault, place)`` says); returns
    (compare's report, where the fault first struck or None)."""
    import torch
    from torchrl.collectors import Collector
    from torchrl.envs import ParallelEnv, SerialEnv, TransformedEnv

    from stepledger.torchrl.collector import LedgerCollector
    from stepledger.torchrl.envs import ledger_env_fns

    record = os.path.join(directory, "fault.json")
    where = place_of(fault, place) if fault is not None else None
    wrap = inject_in_worker(fault, at=at, target=target, record=record) if where == "worker" else None
    fns = ledger_env_fns(env_fn, num_envs, directory, pass_index=True, wrap=wrap, seed=seed)
    env = (SerialEnv if vector == "serial" else ParallelEnv)(num_envs, fns)
    injector = FaultyTransform(fault, at=at, target=target, record=record) if where == "batched" else None
    if injector is not None:  # only when a fault is due there: a clean run has no transform
        env = TransformedEnv(env, injector)
    torch.manual_seed(seed)
    collector = LedgerCollector(Collector(env, None, frames_per_batch=num_envs * min(steps, 50),
                                          total_frames=num_envs * steps),
                                os.path.join(directory, "trainer.npz"), fns)
    try:
        for _ in collector:
            pass
    finally:
        collector.shutdown()
    injected = injector.first if injector is not None else (read_record(record) if fault else None)
    return compare(directory, collector.ledger_path), injected


def check_collector(env_fn, vector="parallel", num_envs=2, steps=100, faults=None, at=5, target=None, seed=0,
                    directory=None, keep=False, progress=None, place="worker"):
    """Check that the ledgers catch and locate every boundary fault on a TorchRL stack.

    Args:
        env_fn: ``env_fn(index)`` returns the user's Gymnasium env (with its own TimeLimit and wrappers);
            picklable, or a lambda (ParallelEnv sends factories to its workers with cloudpickle).
        vector: "serial" or "parallel": TorchRL's ``SerialEnv`` or ``ParallelEnv``.
        num_envs, steps: the rollout's size (steps of each env); episodes must end within it for the
            episode-end faults to be exercised, and the swaps need two envs.
        faults: the faults to inject, one run each (default: every fault of ``faults_of(place)``).
        at, target, seed, directory, keep, progress: as for ``stepledger.check.check_boundary``.
        place: "worker" (each env-side fault in the worker, ``FaultyEnv`` outside LedgerEnv; the others, the
            swaps between envs, through ``FaultyTransform`` on the batched env) or "batched" (every
            trainer-side fault through ``FaultyTransform``).

    Returns the generic CheckReport, truthy when every exercised fault was caught and located.
    """
    if vector not in VECTORS:
        raise ValueError("check_collector: vector must be one of %s, got %r" % (", ".join(VECTORS), vector))
    if place not in PLACES:
        raise ValueError("check_collector: place must be one of %s, got %r" % (", ".join(PLACES), place))
    for name, value in (("num_envs", num_envs), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError("check_collector: %s must be a positive int, got %r" % (name, value))
    allowed = faults_of(place)
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
        return collector_rollout(env_fn, vector, num_envs, steps, sub, fault, target, at, seed, place)

    def opportunity(fault, clean_dir):
        return no_opportunity(fault, *clean_steps(clean_dir, target), at, target, time_limit)

    return run_check(one, faults, opportunity, directory, keep, steps, progress, prefix="stepledger-check-torchrl-")


def check_from_cli(args, progress):
    """``stepledger check ENV_ID --trainer torchrl``: check_collector on ``gym.make(args.env_id)``, on the batched
    env of ``--torchrl-vector``, each fault injected where ``--torchrl-place`` says."""
    place = getattr(args, "torchrl_place", None) or "worker"
    return check_collector(registered_env(args.env_id, args.max_episode_steps), vector=args.torchrl_vector,
                           num_envs=args.num_envs, steps=args.steps,
                           faults=faults_from(args.faults, faults_of(place)), directory=args.dir, keep=args.keep,
                           progress=progress, place=place)
