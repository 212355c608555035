"""``check_boundary``: prove that a stack's ledgers catch every boundary fault.

It runs a short random-action rollout through the user's env factory and
vector env with both ledgers and compares them (the clean run must agree),
then runs it again once per fault with ``FaultyEnv`` in the workers at dose
``one``, and checks that compare names the injected env, episode, step and
field. The vector env is one of Gymnasium's (``sync``, ``async``) or any
library's that the table in ``stepledger.libraries`` lists (SB3's ``subproc``
and ``dummy``), or a callable.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from stepledger import libraries
from stepledger.faults.check import (CheckReport, clean_steps, faults_from, no_opportunity, registered_env,
                                     run_check, time_limit)
from stepledger.faults.engine import ENV_SIDE_FAULTS, Record, check_fault, read_record
from stepledger.gymnasium.env import LedgerEnv
from stepledger.gymnasium.faults import FaultyEnv
from stepledger.gymnasium.vector import LedgerVectorEnv
from stepledger.report.compare import Report, compare

if TYPE_CHECKING:
    import argparse

    import gymnasium as gym

#: the user's env factory: ``env_fn(index)`` returns env ``index``
EnvFactory = Callable[[int], "gym.Env[Any, Any]"]

VECTORS = ("sync", "async")  # this library's; check_boundary takes every library's (libraries.vector_kinds())


class Vector:
    """A kind of vector env for the check's rollouts: how it is built from env factories and how the
    trainer-side ledger goes around it. Libraries with vector envs of their own subclass it (SB3's
    ``stepledger.sb3.check.SB3Vector``)."""

    def __init__(self, build: Callable[[Sequence[Callable[[], Any]]], Any]) -> None:
        self.build = build  # [env factory] -> vector env

    def ledgered(self, venv: Any, path: str) -> Any:
        """The vector env with the trainer-side ledger around it."""
        # the fault injector around LedgerEnv is between the ledgers on purpose: no placement warning
        return LedgerVectorEnv(venv, path, check_wrappers=False)

    def action_space(self, venv: Any) -> gym.Space[Any]:
        """The single env's action space, whose samples the rollout sends."""
        return venv.single_action_space

    def reset(self, venv: Any, seed: int) -> None:
        venv.reset(seed=seed)


def vector(kind: str, autoreset: str = "next") -> Vector:
    """Gymnasium's vector env of ``kind`` ("sync" or "async") with ``autoreset`` ("next" or "same")."""
    import gymnasium as gym
    if autoreset == "same" and not hasattr(gym.vector, "AutoresetMode"):
        raise ValueError("check_boundary: autoreset='same' needs Gymnasium 1.1 or later (Gymnasium %s's vector "
                         "envs always reset on the next step)" % gym.__version__)

    def build(fns: Sequence[Callable[[], Any]]) -> Any:
        kwargs: dict[str, Any] = {}
        if autoreset == "same":
            kwargs["autoreset_mode"] = gym.vector.AutoresetMode.SAME_STEP
        cls: Any = gym.vector.SyncVectorEnv if kind == "sync" else gym.vector.AsyncVectorEnv
        return cls(fns, **kwargs)
    return Vector(build)


def _ledgered(env_fn: EnvFactory, directory: str, index: int, fault: str | None, record: str, target: int,
              at: int) -> gym.Env[Any, Any]:
    env: gym.Env[Any, Any] = LedgerEnv(env_fn(index), directory, index=index)
    if fault is not None:
        env = FaultyEnv(env, fault, index=index, at=at, target=target, record=record)
    return env


def _rollout(env_fn: EnvFactory, vector: Vector, n_envs: int, steps: int, directory: str, fault: str | None,
             target: int, at: int, seed: int) -> tuple[Report, Record | None]:
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


def check_boundary(env_fn: EnvFactory, vector: str | Callable[[Sequence[Callable[[], Any]]], Any] = "sync",

                   autoreset: str = "next", n_envs: int = 4, steps: int = 200,
                   faults: Sequence[str] = ENV_SIDE_FAULTS, at: int = 5, target: int | None = None, seed: int = 0,
                   directory: str | None = None, keep: bool = False,
                   progress: Callable[[int, int], Any] | None = None) -> CheckReport:
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
    build: Vector
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
    hit = n_envs - 1 if target is None else int(target)
    if not 0 <= hit < n_envs:
        raise ValueError("check_boundary: target must be an env index below n_envs=%d, got %r" % (n_envs, hit))
    limit = functools.lru_cache(None)(lambda: time_limit(env_fn, hit))

    def one(sub: str, fault: str | None) -> tuple[Report, Record | None]:
        return _rollout(env_fn, build, n_envs, steps, sub, fault, hit, at, seed)

    def opportunity(fault: str, clean_dir: str) -> tuple[str, int | None]:
        return no_opportunity(fault, *clean_steps(clean_dir, hit), at, hit, limit)

    return run_check(one, faults, opportunity, directory, keep, steps, progress)


def check_from_cli(args: argparse.Namespace, progress: Callable[[int, int], Any] | None) -> CheckReport:

    """``stepledger check --trainer vector``: check_boundary on ``args.env_id`` with ``args.vector``."""
    faults = faults_from(args.faults, ENV_SIDE_FAULTS)
    env_fn = registered_env(args.env_id, args.max_episode_steps)
    return check_boundary(env_fn, vector=args.vector, autoreset=args.autoreset, n_envs=args.num_envs,
                          steps=args.steps, faults=faults, directory=args.dir, keep=args.keep, progress=progress)
