"""``check_boundary``: prove that a stack's ledgers catch every boundary fault.

It runs a short random-action rollout through the user's env factory and
vector env with both ledgers and compares them (the clean run must agree),
then runs it again once per fault with ``FaultyEnv`` in the workers at dose
``one``, and checks that compare names the injected env, episode, step and
field. The vector env is one of Gymnasium's (``sync``, ``async``) or any
library's that the table in ``stepledger.libraries`` lists (SB3's ``subproc``
and ``dummy``), or a callable.
"""

import functools
import os

import numpy as np

from stepledger import libraries
from stepledger.faults.check import clean_steps, faults_from, no_opportunity, registered_env, run_check, time_limit
from stepledger.faults.engine import ENV_SIDE_FAULTS, check_fault, read_record
from stepledger.gymnasium.env import LedgerEnv
from stepledger.gymnasium.faults import FaultyEnv
from stepledger.gymnasium.vector import LedgerVectorEnv
from stepledger.report.compare import compare

VECTORS = ("sync", "async")  # this library's; check_boundary takes every library's (libraries.vector_kinds())


class Vector:
    """A kind of vector env for the check's rollouts: how it is built from env factories and how the
    trainer-side ledger goes around it. Libraries with vector envs of their own subclass it (SB3's
    ``stepledger.sb3.check.SB3Vector``)."""

    def __init__(self, build):
        self.build = build  # [env factory] -> vector env

    def ledgered(self, venv, path):
        """The vector env with the trainer-side ledger around it."""
        return LedgerVectorEnv(venv, path)

    def action_space(self, venv):
        return venv.single_action_space

    def reset(self, venv, seed):
        venv.reset(seed=seed)


def vector(kind, autoreset="next"):
    """Gymnasium's vector env of ``kind`` ("sync" or "async") with ``autoreset`` ("next" or "same")."""
    import gymnasium as gym
    if autoreset == "same" and not hasattr(gym.vector, "AutoresetMode"):
        raise ValueError("check_boundary: autoreset='same' needs Gymnasium 1.1 or later (Gymnasium %s's vector "
                         "envs always reset on the next step)" % gym.__version__)

    def build(fns):
        kwargs = {}
        if autoreset == "same":
            kwargs["autoreset_mode"] = gym.vector.AutoresetMode.SAME_STEP
        cls = gym.vector.SyncVectorEnv if kind == "sync" else gym.vector.AsyncVectorEnv
        return cls(fns, **kwargs)
    return Vector(build)


def _ledgered(env_fn, directory, index, fault, record, target, at):
    env = LedgerEnv(env_fn(index), directory, index=index)
    if fault is not None:
        env = FaultyEnv(env, fault, index=index, at=at, target=target, record=record)
    return env


def _rollout(env_fn, vector, n_envs, steps, directory, fault, target, at, seed):
    record = os.path.join(directory, "fault.json")
    fns = [functools.partial(_ledgered, env_fn, directory, i, fault, record, target, at) for i in range(n_envs)]
    trainer_file = os.path.join(directory, "trainer.npz")
    venv = vector.build(fns)
    try:
        venv = vector.ledgered(venv, trainer_file)
        space = vector.action_space(venv)
        space.seed(seed)
        actions = [np.stack([space.sample() for _ in range(n_envs)]) for _ in range(steps)]
        vector.reset(venv, seed)
        for a in actions:
            venv.step(a)
    finally:
        venv.close()
    return compare(directory, trainer_file), (read_record(record) if fault else None)


def check_boundary(env_fn, vector="sync", autoreset="next", n_envs=4, steps=200, faults=ENV_SIDE_FAULTS,
                   at=5, target=None, seed=0, directory=None, keep=False, progress=None):
    """Check that the ledgers catch and locate every boundary fault on this stack.

    Args:
        env_fn: ``env_fn(index)`` returns the user's env (with its own
            TimeLimit and wrappers; LedgerEnv is added outside it).
        vector: "sync", "async" (Gymnasium), "subproc", "dummy" (SB3; every
            library's kinds: ``libraries.vector_kinds()``), or a callable
            that takes a list of env factories and returns a Gymnasium
            vector env.
        autoreset: "next" or "same", for Gymnasium's own vector envs.
        n_envs, steps: the rollout's size; episodes must end within it for
            the episode-end faults to be exercised.
        faults: the env-side faults to inject, one run each.
        at, target: each fault is injected at the first opportunity at or
            after step ``at`` of env ``target`` (default: the last env).
        directory: where the ledgers go (default: a new temporary directory,
            removed again when the check passes unless ``keep``).
        keep: keep the temporary directory even when the check passes.
        progress: ``progress(done, total)`` is called after each run.

    Returns a CheckReport, truthy when the boundary is fully checked. A
    rollout too short for some fault's first opportunity is not: the report
    says how many steps it needs.
    """
    for name, value in (("n_envs", n_envs), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError("check_boundary: %s must be a positive int, got %r" % (name, value))
    if autoreset not in ("next", "same"):
        raise ValueError("check_boundary: autoreset must be 'next' or 'same', got %r" % (autoreset,))
    if isinstance(vector, str):
        kinds = libraries.vector_kinds()
        if vector not in kinds:
            raise ValueError("check_boundary: vector must be one of %s or a callable, got %r" % (kinds, vector))
        build = libraries.vector(vector, autoreset)
    elif callable(vector):
        build = Vector(vector)
    else:
        raise TypeError("check_boundary: vector must be a name or a callable, got %r" % (vector,))
    faults = [check_fault(f, ENV_SIDE_FAULTS, "check_boundary") for f in faults]
    target = n_envs - 1 if target is None else int(target)
    if not 0 <= target < n_envs:
        raise ValueError("check_boundary: target must be an env index below n_envs=%d, got %r" % (n_envs, target))
    limit = functools.lru_cache(None)(lambda: time_limit(env_fn, target))

    def one(sub, fault):
        return _rollout(env_fn, build, n_envs, steps, sub, fault, target, at, seed)

    def opportunity(fault, clean_dir):
        return no_opportunity(fault, *clean_steps(clean_dir, target), at, target, limit)

    return run_check(one, faults, opportunity, directory, keep, steps, progress)


def check_from_cli(args, progress):
    """``stepledger check --trainer vector``: check_boundary on ``args.env_id`` with ``args.vector``."""
    faults = faults_from(args.faults, ENV_SIDE_FAULTS)
    env_fn = registered_env(args.env_id, args.max_episode_steps)
    return check_boundary(env_fn, vector=args.vector, autoreset=args.autoreset, n_envs=args.num_envs,
                          steps=args.steps, faults=faults, directory=args.dir, keep=args.keep, progress=progress)
