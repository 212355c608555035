"""The env side for a Gymnasium vector env with no single env to wrap: ``LedgerBatchEnv``, innermost.

``gym.make_vec("CartPole-v1")`` returns Gymnasium's own ``CartPoleVectorEnv`` (its ``vector_entry_point``),
which steps every env in one NumPy call and refuses ``wrappers=``: ``LedgerEnv`` has no env to go around.
``LedgerBatchEnv`` goes directly on the vector env instead and records, through ``EnvLedger``, each env's
stream as the vector env returned it; the trainer side (``LedgerVectorEnv``, the SB3 adapter) stays
outermost, so that what lies between them (vector wrappers, a framework's conversion, device copies) is
what compare checks.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import gymnasium as gym
import numpy as np

from stepledger.recording.adapters import TrainerAdapter
from stepledger.recording.envbatch import EnvLedger
from stepledger.recording.hooks import attend
from stepledger.recording.placement import find_in_chain
from stepledger.recording.trainer import SAME_STEP

__all__ = ["LedgerBatchEnv", "link_batch"]


class LedgerBatchEnv(TrainerAdapter, gym.vector.VectorWrapper):
    """Records the env side of a vector env at its own output: one file for the whole batch.

    Put it directly on the vector env (innermost), and the trainer side around everything else::

        >>> import gymnasium as gym
        >>> from stepledger import LedgerVectorEnv
        >>> from stepledger.gymnasium import LedgerBatchEnv
        >>> envs = gym.make_vec("CartPole-v1", num_envs=256, vectorization_mode="vector_entry_point")
        >>> envs = LedgerVectorEnv(LedgerBatchEnv(envs, "ledger"), "ledger/trainer.npz")
        >>> _ = envs.reset(seed=0)
        >>> _ = envs.step(envs.action_space.sample())
        >>> envs.close()  # writes ledger/env-0-255.npz and ledger/trainer.npz

    ``stepledger compare ledger ledger/trainer.npz`` then compares them, with no other flag. The autoreset
    mode is the vector env's own (``metadata["autoreset_mode"]``; NEXT_STEP for Gymnasium's vector entry
    points), or ``autoreset_mode=``. It returns exactly what the vector env returned; a vector step costs
    one call into the core, whatever the number of envs.

    Args:
        env: the vector env (Gymnasium's ``VectorEnv``).
        directory: where ``env-{first}-{last}.npz`` goes.
        first: the env index of its first env (default 0).
        reward_dtype, keep_values, flush_interval: as for ``LedgerVectorEnv``; the same on both sides.
        autoreset_mode: overrides the mode the vector env declares.
    """

    stepledger_changes_values = False  # it only watches: the trainer side's placement check passes over it

    def __init__(self, env: gym.vector.VectorEnv, directory: str | os.PathLike[str], first: int = 0,
                 reward_dtype: Any = np.float32, keep_values: bool = False, autoreset_mode: Any = None,
                 flush_interval: float | None = None) -> None:
        from stepledger.gymnasium.vector import resolve_autoreset_mode
        super().__init__(env)
        mode = resolve_autoreset_mode(env, autoreset_mode, "LedgerBatchEnv")
        self._wrapped = env
        self.ledger: EnvLedger = EnvLedger(directory, env.num_envs, env.single_observation_space, env.single_action_space,
                                autoreset_mode=mode, first=first, reward_dtype=reward_dtype,
                                keep_values=keep_values, flush_interval=flush_interval, owner="LedgerBatchEnv")
        self.live = False
        self.autoreset_mode = mode
        self._same = mode == SAME_STEP
        self._step_results = self.ledger.step_results
        self._pool = _is_envpool(env)
        self._all = np.arange(env.num_envs, dtype=np.int64)
        self._last_ids: Any = self._all  # EnvPool: the env ids of the last recv, which send() defaults to

    def stepledger_link_batch(self, run: str | None) -> None:
        """The trainer side's run, told by ``LedgerVectorEnv`` when it is built around this wrapper."""
        self.ledger.link(run)

    def reset(self, env_id: Any = None, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset every env (Gymnasium's ``reset(seed=, options=)``, with ``reset_mask``), or EnvPool's
        ``reset(env_id)``: those envs, their rows in the order of ``info["env_id"]``."""
        if self._pool:
            given = {k: v for k, v in (("seed", seed), ("options", options)) if v is not None}  # EnvPool's to refuse
            obs, info = self._call(self.env.reset, *(() if env_id is None else (env_id,)), **given)
            self.ledger.reset_at(_env_ids(info, env_id, self.num_envs), obs)
            return obs, info
        mask = None
        if options and options.get("reset_mask") is not None:
            mask = np.array(options["reset_mask"], dtype=np.bool_)  # copied: the vector env pops it
        obs, info = self._call(self.env.reset, seed=seed, options=options)
        self.ledger.reset(obs, mask)
        return obs, info

    def step(self, actions: Any, env_id: Any = None) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        if self._pool:
            return self._pool_step(actions, env_id)
        self.ledger.actions(actions)
        try:
            results = self.env.step(actions)
        except BaseException:  # Ctrl-C or an error: the run did not end cleanly
            self.ledger.interrupted()
            raise
        record = self._step_results
        if record is not None:  # the hot path: one call into the core
            due = record(results)
            if due is False:
                return results
            if due:
                attend()
                return results
        obs, rewards, terminated, truncated, info = results
        if self._same:
            finals = functools.partial(_final_obs_at, info) if "final_obs" in info else None
            self.ledger.step(obs, rewards, terminated, truncated, finals)
        else:
            self.ledger.step(obs, rewards, terminated, truncated)
        return results

    # EnvPool (a Gymnasium VectorEnv whose rows carry info["env_id"]): every call's rows are a sub-batch by
    # env id, recorded with the core's *_ids calls, one call a batch; async_reset marks every env's next
    # row as its reset (the core's pending flag: the row recv returns first is a reset, as an autoreset's is).
    def _pool_step(self, actions, env_id):
        ledger = self.ledger
        ids = self._all if env_id is None else env_id
        ledger.actions_at(ids, actions)
        try:
            results = self.env.step(actions, *(() if env_id is None else (env_id,)))
        except BaseException:
            ledger.interrupted()
            raise
        obs, rewards, terminated, truncated, info = results
        ledger.step_at(info["env_id"], obs, rewards, terminated, truncated)
        return results

    def _pool_call(self, name: str) -> Any:
        fn = getattr(self.env, name, None)
        if fn is None:
            raise AttributeError("LedgerBatchEnv: the vector env it wraps (%s) has no %s(): %s is EnvPool's"
                                 % (type(self.env).__name__, name, name))
        return fn

    def async_reset(self) -> None:
        """EnvPool's ``async_reset``: every env resets; ``recv`` returns their reset observations."""
        self._call(self._pool_call("async_reset"))
        self.ledger.reset_next()  # each env's next row is its reset

    def send(self, actions: Any, env_id: Any = None) -> None:
        """EnvPool's ``send``: the actions are noted (for ``env_id``, or the envs of the last ``recv``), then
        sent."""
        ids = self._last_ids if env_id is None else env_id
        self.ledger.actions_at(ids, actions)
        try:
            self._pool_call("send")(actions, *(() if env_id is None else (env_id,)))
        except BaseException:
            self.ledger.interrupted()
            raise

    def recv(self) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """EnvPool's ``recv``: the rows of the envs that are ready (``info["env_id"]``), recorded."""
        try:
            results = self._pool_call("recv")()
        except BaseException:
            self.ledger.interrupted()
            raise
        obs, rewards, terminated, truncated, info = results
        self._last_ids = ids = info["env_id"]
        self.ledger.step_at(ids, obs, rewards, terminated, truncated)
        return results

    # ledger_path, flush() and close(**kwargs) (the ledger, then the vector env): TrainerAdapter's


def _final_obs_at(info, i):
    from stepledger.gymnasium.vector import final_obs_at
    return final_obs_at(info, i)


def link_batch(env: Any, run: str | None) -> bool:
    """Tell a ``LedgerBatchEnv`` in ``env``'s chain (Gymnasium's ``.env``, SB3's ``.venv``) the trainer side's
    run; True if one was found."""
    batch = find_in_chain(env, LedgerBatchEnv)
    if batch is None:
        return False
    batch.stepledger_link_batch(run)
    return True


def _is_envpool(env: Any) -> bool:
    """An EnvPool pool (its classes come from the envpool package): rows by info["env_id"], send/recv."""
    return any(c.__module__.split(".")[0] == "envpool" for c in type(env).__mro__)


def _env_ids(info: Any, env_id: Any, n: int) -> Any:
    """The env ids of a call's rows: ``info["env_id"]``, else those asked for, else all n."""
    ids = info.get("env_id") if isinstance(info, dict) else None
    if ids is not None:
        return ids
    return np.arange(n) if env_id is None else env_id
