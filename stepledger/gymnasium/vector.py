"""The trainer side for Gymnasium: ``LedgerVectorEnv``, innermost around the vector env."""

from __future__ import annotations

import functools
import os
from typing import Any

import gymnasium as gym
import numpy as np

from stepledger.format.schema import LINK_ATTR, SETTINGS_KEY
from stepledger.gymnasium.batch import link_batch
from stepledger.recording.batches import row as _row
from stepledger.recording.adapters import TrainerAdapter
from stepledger.recording.hooks import attend
from stepledger.recording.placement import check_placement
from stepledger.recording.trainer import NEXT_STEP, SAME_STEP, OnFault, TrainerLedger, check_autoreset_mode

__all__ = ["LedgerVectorEnv", "NEXT_STEP", "SAME_STEP", "final_obs_at", "link_envs", "resolve_autoreset_mode"]


def final_obs_at(info: Any, i: int) -> Any:
    """Env i's final observation under same-step autoreset, or None where it is absent.

    ``info["final_obs"][i]`` where the mask ``_final_obs`` says so; also when a
    vector env without Gymnasium's info merging split a Dict observation into
    a dict of arrays (with ``_key`` masks). Never raises.
    """
    final = info.get("final_obs") if isinstance(info, dict) else None
    if final is None:
        return None
    try:
        mask = info.get("_final_obs")
        if mask is not None and not mask[i]:
            return None
        return _row(final, i)
    except Exception:
        return None




def resolve_autoreset_mode(env: Any, autoreset_mode: Any, owner: str) -> str:
    """The vector env's autoreset mode, "next_step" or "same_step": ``autoreset_mode`` where given, else
    what the vector env declares; refuses DISABLED and refuses to guess (``check_autoreset_mode``)."""
    if autoreset_mode is not None:
        return check_autoreset_mode(autoreset_mode, owner)
    metadata = getattr(env, "metadata", None) or {}
    declared = metadata.get("autoreset_mode")
    # Gymnasium's own vector envs, directly or behind wrappers that pass their
    # metadata through. Gymnasium 1.1 to 1.3 write the mode into the sub-env's
    # metadata dict, often a class attribute shared with every other vector env
    # of that env class, so the last one built wins there: their own
    # autoreset_mode attribute is what they do.
    base = getattr(env, "unwrapped", env)
    gymnasium_own = (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv)
    own = isinstance(base, gymnasium_own) and (base is env or metadata is getattr(base, "metadata", None))
    if own and (declared is not None or type(base) in gymnasium_own) \
            and getattr(base, "autoreset_mode", None) is not None:
        declared = base.autoreset_mode
    if declared is not None:
        return check_autoreset_mode(declared, owner, declared=True)
    if own and type(base) in gymnasium_own:
        return NEXT_STEP  # Gymnasium 1.0's own vector envs: always the next step
    raise ValueError("%s: cannot tell how %s resets its envs (no metadata['autoreset_mode']); pass "
                     "autoreset_mode='next_step' or 'same_step' to say so" % (owner, type(env).__name__))


def link_envs(env: Any, side: TrainerLedger) -> None:
    """Tell each env-side ledger of a Gymnasium vector env the run and its position in it.

    Through ``set_attr``, which reaches a ``LedgerEnv`` anywhere in each env's
    wrapper stack (``set_wrapper_attr``) and sets a harmless attribute on an env
    without one. Only Gymnasium's own vector envs, whose set_attr is known; a
    bridge that has none leaves compare to tell runs apart by their times.
    """
    if side.run is not None and link_batch(env, side.run):
        return  # the env side of the batch (LedgerBatchEnv) is in the chain: one file, told its run
    if side.run is None or type(env) not in (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv):
        return
    try:
        env.set_attr(LINK_ATTR, side.links())
    except Exception:
        pass


class LedgerVectorEnv(TrainerAdapter, gym.vector.VectorWrapper):
    """Records what the trainer sent and received through a Gymnasium vector env.

    Place it innermost on the trainer side: directly around SyncVectorEnv,
    AsyncVectorEnv or a bridge client, inside NormalizeObservation,
    RecordEpisodeStatistics and other wrappers that change values on purpose.
    It rebuilds each env's events as the env side saw them, following the
    vector env's autoreset mode (read from ``metadata["autoreset_mode"]``, or
    given as ``autoreset_mode=``), and writes one file with every env's
    stream on ``close()``, ``flush()`` and at interpreter exit.

    It returns exactly what the vector env returned. One vector step costs a
    constant number of Python calls, whatever the number of envs. The
    vector env's other calls pass through: ``call``, ``get_attr`` and
    ``set_attr`` (and ``call_async``/``call_wait``) go to it unchanged; its
    ``step_async``/``step_wait`` and ``reset_async``/``reset_wait`` are
    recorded like ``step`` and ``reset``, the actions taken in
    ``step_async`` before they are sent.

    Example::

        >>> import gymnasium as gym
        >>> from stepledger import LedgerVectorEnv
        >>> envs = LedgerVectorEnv(gym.make_vec("CartPole-v1", num_envs=2), "ledger/trainer.npz")
        >>> _ = envs.reset(seed=0)
        >>> _ = envs.step(envs.action_space.sample())
        >>> envs.close()  # writes ledger/trainer.npz

    Args:
        env: the vector env.
        path: the trainer ledger file to write: a path, or an fsspec URL.
        reward_dtype: np.float32 (default) or np.float64; the same on both sides.
        keep_values: also keep observations and actions (costs a Python loop
            over envs per step); the same on both sides.
        autoreset_mode: overrides the mode, for bridges that do not declare it.
        live: check each env's live token (from ``LedgerEnv(live=True)``) as
            it arrives; with ``path=None`` no file is written and memory stays
            constant.
        on_fault: with live, what a mismatch does: "raise" a BoundaryFault
            (default), "warn", "record" (only keep it in ``live_faults``), or
            a callable that receives the BoundaryFault.
        keep_tokens: leave the tokens in the info (by default they are removed,
            so training code sees what it would see without stepledger).
        check_wrappers: warn once when a wrapper sits between this ledger
            and the vector env, or around LedgerEnv in a SyncVectorEnv's
            envs: one that changes values on purpose (NormalizeObservation,
            ClipAction, ... or one declared so) is named as such; any other
            (a wrapper of your own) as on the checked side, its differences
            its doing. False silences it (the wrappers found are still kept
            in the ledger's meta, for compare's hints).
        deliberate_wrappers: wrapper classes (or class names) of your own
            that change values on purpose, named as such in the warning and
            the hints; a class may also say so itself with the attribute
            ``stepledger_changes_values = True`` (or a tuple of the fields it
            changes; False for a wrapper that only watches).
        flush_interval: seconds between periodic spills to disk (default 5,
            or ``$STEPLEDGER_FLUSH_INTERVAL``).
    """

    def __init__(self, env: gym.vector.VectorEnv, path: str | os.PathLike[str] | None,
                 reward_dtype: Any = np.float32, keep_values: bool = False, autoreset_mode: Any = None,
                 live: bool = False, on_fault: OnFault = "raise", keep_tokens: bool = False,
                 check_wrappers: bool = True, flush_interval: float | None = None,
                 deliberate_wrappers: Any = None) -> None:
        super().__init__(env)
        between = check_placement(env, "LedgerVectorEnv", check_wrappers, deliberate_wrappers)
        self.autoreset_mode = resolve_autoreset_mode(env, autoreset_mode, "LedgerVectorEnv")
        self._open_ledger(env, path, env.num_envs, env.single_observation_space, env.single_action_space,
                          autoreset_mode=self.autoreset_mode, reward_dtype=reward_dtype, keep_values=keep_values,
                          live=live, on_fault=on_fault, keep_tokens=keep_tokens, flush_interval=flush_interval,
                          owner="LedgerVectorEnv", final_obs_name="info['final_obs'][{i}] (same-step autoreset)")
        self.ledger.note_wrappers(between)
        link_envs(env, self.ledger)
        self._same = self.autoreset_mode == SAME_STEP
        self._pending_reset_mask = None  # the mask of a reset started by reset_async
        self._step_results = self.ledger.step_results  # None with a live check or kept values

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        mask = self._reset_mask(options)
        obs, info = self._call(self.env.reset, seed=seed, options=options)
        return self._record_reset(obs, info, mask)

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        self.ledger.actions(actions)
        try:
            results = self.env.step(actions)
        except BaseException:  # Ctrl-C or an error: the run did not end cleanly
            self.ledger.interrupted()
            raise
        record = self._step_results
        if record is not None:  # the hot path (no live check, no kept values): one call into the core
            due = record(results)
            if due is False:
                return results
            if due:
                attend()
                return results
            # None: an env's episode ended under same-step autoreset; its final observation is looked up below
        return self._recorded(*results)

    # The vector env's split calls, where it has them (AsyncVectorEnv): the actions are taken
    # in step_async, before they are sent; the results are recorded in step_wait.
    def step_async(self, actions: Any) -> None:
        """Take the actions, then send them (the inner vector env's ``step_async``)."""
        send = self._inner("step_async")
        self.ledger.actions(actions)
        send(actions)

    def step_wait(self, **kwargs: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """The results of the actions sent by ``step_async``, recorded (``timeout=`` is passed on)."""
        try:
            results = self._inner("step_wait")(**kwargs)
        except BaseException:  # a step path: the try in place costs nothing, a call through _call would
            self.ledger.interrupted()
            raise
        return self._recorded(*results)

    def reset_async(self, seed: int | list[int | None] | None = None,
                    options: dict[str, Any] | None = None) -> None:
        """Start a reset (the inner vector env's ``reset_async``); ``reset_wait`` records it."""
        start = self._inner("reset_async")
        mask = self._reset_mask(options)
        start(seed=seed, options=options)
        self._pending_reset_mask = mask

    def reset_wait(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """The observations of the reset started by ``reset_async``, recorded (``timeout=`` is passed on)."""
        obs, info = self._call(lambda: self._inner("reset_wait")(**kwargs))
        mask, self._pending_reset_mask = self._pending_reset_mask, None
        return self._record_reset(obs, info, mask)

    # Calls that do not cross the boundary as events go straight to the vector env.
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """The inner vector env's ``call``: calls ``name`` on every sub-env."""
        return self._inner("call")(name, *args, **kwargs)

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        """The inner vector env's ``call_async``."""
        return self._inner("call_async")(name, *args, **kwargs)

    def call_wait(self, **kwargs: Any) -> tuple[Any, ...]:
        """The inner vector env's ``call_wait``."""
        return self._inner("call_wait")(**kwargs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """The inner vector env's ``get_attr``: the attribute ``name`` of every sub-env."""
        return self._inner("get_attr")(name)

    def set_attr(self, name: str, values: Any) -> None:
        """The inner vector env's ``set_attr``."""
        return self._inner("set_attr")(name, values)

    def _inner(self, method):
        fn = getattr(self.env, method, None)
        if fn is None:
            raise AttributeError("LedgerVectorEnv: the vector env it wraps (%s) has no %s()"
                                 % (type(self.env).__name__, method))
        return fn

    def _reset_mask(self, options):
        if not options or options.get("reset_mask") is None:
            return None
        # Copied now: the vector env pops the key from the caller's dict.
        mask = np.array(options["reset_mask"], dtype=np.bool_)
        if mask.shape != (self.num_envs,):
            raise ValueError("LedgerVectorEnv.reset: options['reset_mask'] must have shape (%d,), got %s"
                             % (self.num_envs, mask.shape))
        return mask

    def _record_reset(self, obs, info, mask):
        self.ledger.reset(obs, mask)
        if self.live:
            self._check(info, None)
        return obs, info

    def _recorded(self, obs, rewards, terminated, truncated, info):
        """Record a vector step's results (from step or step_wait) and return them unchanged."""
        if self._same:
            # info holds final_obs only at a step where an env ended: a lookup is made for those steps only
            finals = functools.partial(final_obs_at, info) if "final_obs" in info else None
            self.ledger.step(obs, rewards, terminated, truncated, finals)
        else:
            self.ledger.step(obs, rewards, terminated, truncated)
        if self.live:
            self._check(info, info.get("final_info") if self._same and self.ledger.ended else None)
        return obs, rewards, terminated, truncated, info

    def _check(self, info, final_info):
        """The live check: an env's token rides in the step's info, and a step that ended an
        episode under same-step autoreset has its token in ``final_info``."""
        led = self.ledger
        settings = led.tokens(info, SETTINGS_KEY)
        if settings is not None:  # only with an env's first event
            led.check_settings(settings)
        top = led.tokens(info)
        final = led.tokens(final_info) if isinstance(final_info, dict) else None
        led.check_tokens(top, final, top)

    # ledger_path, live_faults, set_on_fault, flush() and close(**kwargs): TrainerAdapter's
