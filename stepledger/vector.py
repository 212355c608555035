"""The trainer side for Gymnasium: ``LedgerVectorEnv``, innermost around the vector env."""

import warnings

import gymnasium as gym
import numpy as np

from . import core
from ._schema import LINK_ATTR, SETTINGS_KEY, TOKEN_KEY
from .recording import TrainerSide
from .stack import warn_inner_wrappers

NEXT_STEP, SAME_STEP, DISABLED = "next_step", "same_step", "disabled"

_ABSENT = object()  # no final observation for this env


def final_obs_at(info, i):
    """``info["final_obs"][i]`` as a SAME_STEP vector env reports it, or _ABSENT.

    Gymnasium (1.1 and later) gives an object array with the mask
    ``_final_obs``. A vector env whose info merging lacks Gymnasium's special
    case for final_obs splits a dict observation into a dict of arrays (with
    ``_key`` masks); that is read key by key. Never raises.
    """
    final_obs = info.get("final_obs", _ABSENT) if isinstance(info, dict) else _ABSENT
    if final_obs is _ABSENT or final_obs is None:
        return _ABSENT
    try:
        mask = info.get("_final_obs")
        if mask is not None and not mask[i]:
            return _ABSENT
        value = _row(final_obs, i)
    except Exception:
        return _ABSENT
    return _ABSENT if value is None else value


def _row(batch, i):
    if isinstance(batch, dict):
        # "_key" is the mask of "key"; a key of the space may itself start with "_" (its mask is "__key")
        return {k: _row(v, i) for k, v in batch.items()
                if not (isinstance(k, str) and k.startswith("_") and k[1:] in batch)}
    return batch[i]


def _mode_name(mode):
    """Normalise an AutoresetMode, its value ('NextStep') or a name ('next_step')."""
    value = getattr(mode, "value", mode)
    if not isinstance(value, str):
        return None
    key = value.replace("_", "").replace("-", "").lower()
    return {"nextstep": NEXT_STEP, "samestep": SAME_STEP, "disabled": DISABLED}.get(key)


def resolve_autoreset_mode(env, autoreset_mode, owner):
    """The vector env's autoreset mode; refuses DISABLED and refuses to guess."""
    if autoreset_mode is not None:
        mode = _mode_name(autoreset_mode)
        if mode is None:
            raise ValueError("%s: autoreset_mode must be 'next_step' or 'same_step' (or an AutoresetMode), "
                             "got %r" % (owner, autoreset_mode))
    else:
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
            mode = _mode_name(declared)
            if mode is None:
                raise ValueError("%s: the vector env declares an unknown autoreset_mode %r; "
                                 "pass autoreset_mode= explicitly" % (owner, declared))
        elif own and type(base) in gymnasium_own:
            mode = NEXT_STEP  # Gymnasium 1.0's own vector envs: always the next step
        else:
            raise ValueError("%s: cannot tell how %s resets its envs (no metadata['autoreset_mode']); pass "
                             "autoreset_mode='next_step' or 'same_step' to say so" % (owner, type(env).__name__))
    if mode == DISABLED:
        raise ValueError("%s: autoreset mode DISABLED is not supported: the trainer resets envs itself with "
                         "reset_mask, and a ledger cannot tell which envs it meant to reset from the step's "
                         "results; use NEXT_STEP or SAME_STEP" % owner)
    return mode


def link_envs(env, side):
    """Tell each env-side ledger of a Gymnasium vector env the run and its position in it.

    Through ``set_attr``, which reaches a ``LedgerEnv`` anywhere in each env's
    wrapper stack (``set_wrapper_attr``) and sets a harmless attribute on an env
    without one. Only Gymnasium's own vector envs, whose set_attr is known; a
    bridge that has none leaves compare to tell runs apart by their times.
    """
    if side.run is None or type(env) not in (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv):
        return
    try:
        env.set_attr(LINK_ATTR, side.links(env.num_envs))
    except Exception:
        pass


class LedgerVectorEnv(gym.vector.VectorWrapper):
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
        check_wrappers: warn once when a wrapper that changes values on
            purpose (NormalizeObservation, NormalizeReward, TransformReward,
            ClipAction, ...) sits between this ledger and the vector env;
            False if you mean to check through it.
        flush_interval: seconds between periodic spills to disk (default 5,
            or ``$STEPLEDGER_FLUSH_INTERVAL``).
    """

    def __init__(self, env, path, reward_dtype=np.float32, keep_values=False, autoreset_mode=None, live=False,
                 on_fault="raise", keep_tokens=False, check_wrappers=True, flush_interval=None):
        super().__init__(env)
        warn_inner_wrappers(env, "LedgerVectorEnv", check_wrappers)
        self.autoreset_mode = resolve_autoreset_mode(env, autoreset_mode, "LedgerVectorEnv")
        self._side = TrainerSide("LedgerVectorEnv", path, env.num_envs, env.single_observation_space,
                                 env.single_action_space, reward_dtype, keep_values, self.autoreset_mode, live,
                                 on_fault, flush_interval)
        link_envs(env, self._side)
        self._recording, self._rec, self._live = self._side.recording, self._side.recorder, self._side.live
        self._keep = keep_values
        self._kept_actions, self._was_pending = None, None  # with keep_values: the actions under way
        self._pending_reset_mask = None  # the mask of a reset started by reset_async
        self._warned_missing = False
        self.live = bool(live)
        self._pop_tokens = not keep_tokens

    @property
    def ledger_path(self):
        """Where the trainer ledger is written (None in live-only mode)."""
        return self._side.path

    @property
    def live_faults(self):
        """The boundary faults the live check has found so far (BoundaryFault objects)."""
        return self._live.faults if self._live is not None else []

    def reset(self, *, seed=None, options=None):
        mask = self._reset_mask(options)
        try:
            obs, info = self.env.reset(seed=seed, options=options)
        except BaseException:  # Ctrl-C or an error: the run did not end cleanly
            self._side.interrupted()
            raise
        return self._record_reset(obs, info, mask)

    def step(self, actions):
        if self._keep:
            self._take_actions(actions)
        else:
            self._rec.actions(actions)  # the hot path: one call fewer than _take_actions
        try:
            results = self.env.step(actions)
        except BaseException:  # Ctrl-C or an error: the run did not end cleanly
            self._side.interrupted()
            raise
        return self._record_step(*results)

    # The vector env's split calls, where it has them (AsyncVectorEnv): the actions are taken
    # in step_async, before they are sent; the results are recorded in step_wait.
    def step_async(self, actions):
        """Take the actions, then send them (the inner vector env's ``step_async``)."""
        send = self._inner("step_async")
        self._take_actions(actions)
        send(actions)

    def step_wait(self, **kwargs):
        """The results of the actions sent by ``step_async``, recorded (``timeout=`` is passed on)."""
        try:
            results = self._inner("step_wait")(**kwargs)
        except BaseException:
            self._side.interrupted()
            raise
        return self._record_step(*results)

    def reset_async(self, seed=None, options=None):
        """Start a reset (the inner vector env's ``reset_async``); ``reset_wait`` records it."""
        start = self._inner("reset_async")
        mask = self._reset_mask(options)
        start(seed=seed, options=options)
        self._pending_reset_mask = mask

    def reset_wait(self, **kwargs):
        """The observations of the reset started by ``reset_async``, recorded (``timeout=`` is passed on)."""
        try:
            obs, info = self._inner("reset_wait")(**kwargs)
        except BaseException:
            self._side.interrupted()
            raise
        mask, self._pending_reset_mask = self._pending_reset_mask, None
        return self._record_reset(obs, info, mask)

    # Calls that do not cross the boundary as events go straight to the vector env.
    def call(self, name, *args, **kwargs):
        """The inner vector env's ``call``: calls ``name`` on every sub-env."""
        return self._inner("call")(name, *args, **kwargs)

    def call_async(self, name, *args, **kwargs):
        return self._inner("call_async")(name, *args, **kwargs)

    def call_wait(self, **kwargs):
        return self._inner("call_wait")(**kwargs)

    def get_attr(self, name):
        """The inner vector env's ``get_attr``: the attribute ``name`` of every sub-env."""
        return self._inner("get_attr")(name)

    def set_attr(self, name, values):
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
        over = self._rec.reset(obs, mask)
        if self._keep:
            over |= self._keep_reset(obs, mask)
        self._after(over, info, None)
        return obs, info

    def _take_actions(self, actions):
        """Digest the actions before they are handed over (and, with keep_values, copy them)."""
        rec = self._rec
        rec.actions(actions)
        if self._keep:
            self._was_pending = rec.pending.copy()
            self._kept_actions = [None if leaves is None else [np.array(a, copy=True) for a in leaves]
                                  for leaves in rec.act_layout.cast_each(actions, self.num_envs)]

    def _record_step(self, obs, rewards, terminated, truncated, info):
        rec = self._rec
        if self.autoreset_mode == NEXT_STEP:
            over = rec.step_next(obs, rewards, terminated, truncated)
            if self._keep:
                over |= self._keep_next(obs)
            self._after(over, info, None)
        else:
            ended = rec.ended(terminated, truncated)
            finals = {}
            # A loop over the envs whose episode ended at this step only.
            for i in ended:
                final = final_obs_at(info, i)
                if final is _ABSENT:
                    h = core.MISSING_DIGEST
                    self._warn_missing(i)
                else:
                    h = rec.digest_obs(final)
                finals[i] = (h, bool(terminated[i]), bool(truncated[i]))
            over = rec.step_same(obs, rewards, finals)
            if self._keep:
                over |= self._keep_same(obs, ended, info)
            self._after(over, info, info.get("final_info") if ended else None)
        return obs, rewards, terminated, truncated, info

    def _after(self, over, info, final_info):
        """Keep memory bounded; run the live check; drop the tokens from the info."""
        self._side.after_step(over)
        if self._live is None:
            return
        settings = info.get(SETTINGS_KEY)
        if settings is not None:  # only with an env's first event
            if self._pop_tokens:
                info.pop(SETTINGS_KEY, None)
                info.pop("_" + SETTINGS_KEY, None)
            self._live.check_settings(settings)
        top = info.get(TOKEN_KEY)
        final = final_info.get(TOKEN_KEY) if isinstance(final_info, dict) else None
        if self._pop_tokens:
            info.pop(TOKEN_KEY, None)
            info.pop("_" + TOKEN_KEY, None)
            if isinstance(final_info, dict):
                final_info.pop(TOKEN_KEY, None)
                final_info.pop("_" + TOKEN_KEY, None)
        self._live(top, final, top)

    def _warn_missing(self, i):
        if not self._warned_missing:
            self._warned_missing = True
            warnings.warn("LedgerVectorEnv: env %d ended an episode under SAME_STEP autoreset without "
                          "info['final_obs'][%d]; its final observation is recorded as missing and will "
                          "show as an obs difference" % (i, i), stacklevel=3)

    # Kept values: a Python loop over envs, paid only with keep_values=True.
    def _rows(self, layout, batch):
        """Each env's cast leaves (None where they cannot be cast)."""
        return layout.cast_each(batch, self.num_envs)

    def _cast(self, layout, value):
        try:
            return layout.cast(value)
        except Exception:
            return None

    def _keep_reset(self, obs, mask):
        rows = self._rows(self._rec.obs_layout, obs)
        over = False
        for i, store in enumerate(self._recording.values):
            if mask is None or mask[i]:
                over |= store.append(rows[i], None)
        return over

    def _keep_next(self, obs):
        orows = self._rows(self._rec.obs_layout, obs)
        arows, was_pending = self._kept_actions, self._was_pending
        over = False
        for i, store in enumerate(self._recording.values):
            o = orows[i]
            a = None if arows is None or was_pending[i] else arows[i]
            over |= store.append(o, a)
        return over

    def _keep_same(self, obs, ended, info):
        orows = self._rows(self._rec.obs_layout, obs)
        arows = self._kept_actions
        over = False
        for i, store in enumerate(self._recording.values):
            o = orows[i]
            a = None if arows is None else arows[i]
            if i in ended:
                final = final_obs_at(info, i)
                f = None if final is _ABSENT else self._cast(self._rec.obs_layout, final)
                over |= store.append(f, a)
                over |= store.append(o, None)
            else:
                over |= store.append(o, a)
        return over

    def flush(self):
        """Write the trainer ledger now; recording goes on."""
        self._side.flush()

    def close(self, **kwargs):
        """Write the trainer ledger, then close the vector env."""
        try:
            self._side.close()
        finally:
            self.env.close(**kwargs)
