"""The trainer side's engine: ``TrainerLedger`` records what a trainer sent to its envs and got back.

Any trainer can drive it: a vector env wrapper (``LedgerVectorEnv`` and
``stepledger.sb3.LedgerVecEnv`` are thin adapters over it), a learner that
receives episodes from remote workers, an offline tool, a bridge. It records
in two shapes, both without a Python loop over envs on the per-step path:

- **vector steps**, batched over all envs as a vector env returns them:
  ``reset``, ``actions`` (before they are sent), then ``step`` under the
  declared autoreset convention, or ``step_dones`` for done flags with
  terminal observations in per-env info dicts (SB3's VecEnv convention);
- **per-env events**, for trainers that think in episodes or chunks:
  ``env_reset(i, obs)`` and ``env_steps(i, actions, obs, rewards, terminated,
  truncated)`` with many steps of env i at once.

Each convention's bookkeeping (which env is reset when, which action belongs
to which event) is in the core (``VectorRecorder`` in ``_core.pyx`` and its
mirror in ``_fallback.py``); this module adds kept values, the live check,
the missing-final-observation warning, token removal, flush and close.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, Union

import numpy as np

from stepledger.format import schema as S
from stepledger import core
from stepledger.recording.live import BoundaryFault, LiveCheck, check_on_fault, settings_of
from stepledger.recording.checks import check_path, check_reward_dtype
from stepledger.recording.checks import flush_interval as _flush_interval
from stepledger.recording.hooks import attend
from stepledger.recording.recording import Recording
from stepledger.format.spaces import LeafLayout

if TYPE_CHECKING:
    import gymnasium as gym

__all__ = ["NEXT_STEP", "SAME_STEP", "TrainerLedger", "autoreset_mode_name", "check_autoreset_mode"]

NEXT_STEP, SAME_STEP, DISABLED = "next_step", "same_step", "disabled"
# an event as the live check compares it: (kind, h_obs, h_act, h_rew, terminated, truncated), from these columns
_EVENT_ORDER = tuple(S.FIELD_COLUMNS[f] for f in ("kind", "obs", "action", "reward", "terminated", "truncated"))

# what a live mismatch does: "raise", "warn", "record", or a callable that receives the BoundaryFault
OnFault = Union[str, Callable[[BoundaryFault], object]]
DONE_FLAGS = "done_flags"  # the meta's name for SB3's convention (done flags, terminal obs in the infos)


def autoreset_mode_name(mode: Any) -> str | None:
    """'next_step', 'same_step' or 'disabled' for an AutoresetMode, its value ('NextStep') or a name; else None."""
    value = getattr(mode, "value", mode)
    if not isinstance(value, str):
        return None
    key = value.replace("_", "").replace("-", "").lower()
    return {"nextstep": NEXT_STEP, "samestep": SAME_STEP, "disabled": DISABLED}.get(key)


def _check_streams(streams, n, owner):
    """None (env i carries stream i), or the list of n stream ids: a permutation of 0 .. n-1."""
    if streams is None:
        return None
    try:
        ids = [int(s) for s in streams]
    except (TypeError, ValueError):
        raise ValueError("%s: streams must be a sequence of %d stream ids, got %r" % (owner, n, streams)) from None
    if sorted(ids) != list(range(n)):
        raise ValueError("%s: streams=%r is not a permutation of 0 .. %d (one stream id for each of the %d envs, "
                         "each once)" % (owner, streams, n - 1, n))
    return None if ids == list(range(n)) else ids


def check_autoreset_mode(autoreset_mode: Any, owner: str, *, declared: bool = False) -> str:
    """'next_step' or 'same_step' for an autoreset mode (an AutoresetMode, its value or a name), refusing
    DISABLED and modes it does not know with a one-line ValueError that names ``owner``. ``declared``: the
    mode is what a vector env declares (its metadata), not an argument; the message says so."""
    mode = autoreset_mode_name(autoreset_mode)
    if mode is None:
        if declared:
            raise ValueError("%s: the vector env declares an unknown autoreset_mode %r; "
                             "pass autoreset_mode= explicitly" % (owner, autoreset_mode))
        raise ValueError("%s: autoreset_mode must be 'next_step' or 'same_step' (or an AutoresetMode), got %r"
                         % (owner, autoreset_mode))
    if mode == DISABLED:
        raise ValueError("%s: autoreset mode DISABLED is not supported: the trainer resets envs itself with "
                         "reset_mask, and a ledger cannot tell which envs it meant to reset from the step's "
                         "results; use NEXT_STEP or SAME_STEP" % owner)
    return mode


def _check_mode(autoreset_mode, owner):
    if autoreset_mode is None or autoreset_mode == DONE_FLAGS:
        return autoreset_mode
    return check_autoreset_mode(autoreset_mode, owner)


class TrainerLedger:
    """Records what a trainer sent to its envs and what it received, for any trainer.

    Example, with no vector env at all (a trainer that receives each env's
    steps in chunks)::

        >>> import numpy as np, gymnasium as gym
        >>> from stepledger import TrainerLedger
        >>> led = TrainerLedger("ledger/trainer.npz", 2, gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2))
        >>> led.env_reset(0, np.zeros(3, np.float32))
        >>> led.env_steps(0, actions=np.array([1, 0]), obs=np.ones((2, 3), np.float32),
        ...               rewards=np.array([1.0, 0.5]), terminated=np.array([False, True]),
        ...               truncated=np.array([False, False]))
        >>> led.close()  # writes ledger/trainer.npz; compare it with the envs' LedgerEnv files

    The env side is ``LedgerEnv(env, directory, index=i)`` around env i; the
    trainer ledger's stream i holds what the trainer saw of it. Only streams
    that got events matter: a learner that saw envs 3 and 5 of 8 leaves the
    others empty, and ``compare`` takes several trainer files, each env in
    exactly one of them.

    Vector steps (batches over all ``num_envs`` envs, as a vector env returns
    them): ``reset(obs, mask)``; ``actions(batch)`` or
    ``actions_per_env(values)`` *before* the actions are sent (an env may edit
    its action array in place); then ``step(obs, rewards, terminated,
    truncated, final_obs)`` under ``autoreset_mode`` "next_step" (an env whose
    episode ended is reset by its next step, whose action is ignored) or
    "same_step" (the env is reset within the ending step; ``final_obs[i]`` is
    its final observation, None if absent), or ``step_dones(obs, rewards,
    dones, infos)`` where ``infos[i]`` holds a done env's terminal observation
    and truncation flag (SB3's VecEnv convention).

    Per-env events (episodes or chunks of one env): ``env_reset(i, obs)`` and
    ``env_steps(i, actions, obs, rewards, terminated, truncated)``, the
    values batched over the m steps with a leading axis of m. The actions are
    those sent to the env, the observations those the env returned.

    Values are never read after the call returns: a trainer may edit the
    arrays it received (PPO scales rewards in place).

    Args:
        path: the trainer ledger file: a path or an fsspec URL; None with
            ``live=True`` (check only, write nothing, constant memory).
        num_envs: how many envs (streams 0 .. num_envs-1).
        observation_space, action_space: one env's spaces.
        autoreset_mode: for ``step``: "next_step" or "same_step" (or a
            Gymnasium AutoresetMode); not needed for per-env events.
        reward_dtype: np.float32 (default) or np.float64; the same on both sides.
        keep_values: also keep observations and actions (a Python loop over
            envs per step); the same on both sides.
        live: check each env's live token (``LedgerEnv(live=True)``) with
            ``check_tokens``.
        on_fault: with live: "raise" (default), "warn", "record" or a callable.
        keep_tokens: leave the tokens where they arrived (``tokens`` removes
            them by default).
        flush_interval: seconds between periodic spills (default 5, or
            ``$STEPLEDGER_FLUSH_INTERVAL``).
        streams: the env stream each of the num_envs envs carries, a
            permutation of 0 .. num_envs-1 (default: env i carries stream i);
            a multi-agent vector env's (env copy, agent) map
            (``stepledger.pettingzoo.slot_map``).
        owner: the name used in messages (an adapter passes its own).
        final_obs_name: where a final observation is looked for, for the warning when one is missing
            (``"{i}"``: the env); an adapter passes its library's (``"infos[{i}]['terminal_observation']"``).
    """

    def __init__(self, path: str | os.PathLike[str] | None, num_envs: int,
                 observation_space: gym.spaces.Space[Any], action_space: gym.spaces.Space[Any], *,
                 autoreset_mode: Any = None, reward_dtype: Any = np.float32, keep_values: bool = False,
                 live: bool = False, on_fault: OnFault = "raise", keep_tokens: bool = False,
                 flush_interval: float | None = None, streams: Sequence[int] | None = None,
                 owner: str = "TrainerLedger", final_obs_name: str = "its final observation") -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError("%s: num_envs must be a positive integer, got %r" % (owner, num_envs))
        self.owner = owner
        self.num_envs = n = int(num_envs)
        self.streams = streams = _check_streams(streams, n, owner)
        self.autoreset_mode = _check_mode(autoreset_mode, owner)
        if path is not None or not live:
            path = check_path(path, owner, "path")
        if keep_values and path is None:
            raise ValueError("%s: keep_values=True needs a path to write the values to" % owner)
        dtype = check_reward_dtype(reward_dtype, owner)
        interval = _flush_interval(flush_interval, owner)
        self.obs_layout = obs_layout = LeafLayout(observation_space, "%s: observation space" % owner)
        self.act_layout = act_layout = LeafLayout(action_space, "%s: action space" % owner)
        if path is None:
            # live check only: no file; the buffers are emptied at every step, so memory stays constant
            self.recording = None
            buffers = [core.StreamBuffer(16) for _ in range(n)]
        else:
            meta = {} if self.autoreset_mode is None else {S.META_AUTORESET: self.autoreset_mode}
            self.recording = Recording(path, "trainer", range(n) if streams is None else streams, obs_layout,
                                       act_layout, dtype, keep_values, meta, interval, owner)
            buffers = self.recording.buffers
        self._rec = rec = core.VectorRecorder(buffers, obs_layout, act_layout, dtype == np.float32, streams)
        self._live = LiveCheck(rec, dtype.name, check_on_fault(on_fault, owner), owner,
                               settings_of(dtype.name, obs_layout, act_layout), streams) if live else None
        self.live = bool(live)
        self.keep_values = bool(keep_values)
        self._pop_tokens = not keep_tokens
        self._kept_actions, self._was_pending = None, None  # with keep_values: the actions under way
        self._warned_missing = False
        self.ended: list[int] = []  # the envs whose episode ended at the latest same-step call of step or step_dones
        self.final_obs_name = final_obs_name  # where it was looked for, for the warning ("{i}": env)
        # ``step_results(results)``: a vector env's whole step, the (obs, rewards, terminated, truncated,
        # info) it returned, recorded by the core in one call where nothing else is to be done with it (no
        # kept values, no live check, a file). It returns False, or True when the recordings want attention
        # (``attend()``); under same-step autoreset None when an env's episode ended, with nothing recorded
        # (its final observation is needed: ``step``). None where it does not apply.
        self.step_results: Callable[[Any], bool | None] | None = None
        if not self.keep_values:
            # The hot path: the core's own methods, no Python frame in between (instance attributes that
            # stand in for the methods below, with their signatures).
            self.actions = rec.actions  # type: ignore[method-assign]
            self.actions_per_env = rec.actions_per_env  # type: ignore[method-assign]
            if self.autoreset_mode == NEXT_STEP:
                self.step = self._step_next_plain  # type: ignore[method-assign]
            elif self.autoreset_mode == SAME_STEP:
                self.step = self._step_same_plain  # type: ignore[method-assign]
            if not live and self.recording is not None:
                self.step_results = {NEXT_STEP: rec.step_next_results,
                                     SAME_STEP: rec.step_same_results}.get(self.autoreset_mode)

    def note_wrappers(self, found):
        """Keep the wrappers found between the two ledgers (``stack.check_placement``) in the ledger's meta,
        where compare's hints name them."""
        if self.recording is not None and found:
            self.recording.extra_meta[S.META_WRAPPERS] = list(found)

    # ------------------------------------------------------------------ identity

    @property
    def path(self) -> str | None:
        """Where the trainer ledger is written (None in live-only mode)."""
        return None if self.recording is None else self.recording.path

    @property
    def run(self) -> str | None:
        """The run's identity (written in the meta of every ledger of the run), or None."""
        return None if self.recording is None else self.recording.run

    def links(self) -> list[tuple[str | None, int]]:
        """What each env-side ledger is told (``LedgerEnv.stepledger_link``): (run, its position)."""
        return [(self.run, i) for i in range(self.num_envs)]

    # ------------------------------------------------------------------ vector steps

    def reset(self, obs: Any, mask: Any = None) -> None:
        """Record a reset of every env (or of those where ``mask`` is true) that returned ``obs``."""
        over = self._rec.reset(obs, mask)
        if self.keep_values:
            rows = self.obs_layout.cast_each(obs, self.num_envs)
            for i, store in enumerate(self.recording.values):  # type: ignore[union-attr]  # kept: a file
                if mask is None or mask[i]:
                    over |= store.append(rows[i], None)
        self._after(over)

    def actions(self, actions: Any) -> None:
        """Note the actions about to be sent, in a vector env's batch layout, before they are sent."""
        rec = self._rec
        rec.actions(actions)
        self._keep_actions(self.act_layout.cast_each(actions, self.num_envs))

    def actions_per_env(self, actions: Any) -> None:
        """Note the actions about to be sent, given one value per env (env i is sent ``actions[i]``)."""
        self._rec.actions_per_env(actions)
        self._keep_actions(self.act_layout.cast_per_env(actions, self.num_envs))

    def _keep_actions(self, rows):
        self._was_pending = self._rec.pending.copy()
        self._kept_actions = [None if leaves is None else [np.array(a, copy=True) for a in leaves]
                              for leaves in rows]

    def step(self, obs: Any, rewards: Any, terminated: Any, truncated: Any, final_obs: Any = None,
             final_mask: Any = None) -> None:
        """Record a vector step under the declared autoreset mode.

        Under "same_step", ``final_obs[i]`` (or ``final_obs(i)`` if it is a
        callable) is the final observation of each env whose episode ended; it is
        looked up for those envs only. Where ``final_mask[i]`` is false or the
        value is None it is absent: recorded as missing, with a warning once.
        """
        if self.autoreset_mode == NEXT_STEP:
            over = self._rec.step_next(obs, rewards, terminated, truncated)
            if self.keep_values:
                over |= self._keep_next(obs)
            self._after(over)
        elif self.autoreset_mode == SAME_STEP:
            self.ended = ended = self._rec.ended(terminated, truncated)
            finals = self._finals(ended, terminated, truncated, final_obs, final_mask) if ended else _NO_FINALS
            over = self._rec.step_same(obs, rewards, finals)
            if self.keep_values:
                over |= self._keep_same(obs, ended, final_obs, final_mask)
            self._after(over)
        else:
            raise ValueError("%s: step() needs autoreset_mode='next_step' or 'same_step' at construction"
                             % self.owner)

    # The hot paths, without kept values: as few Python calls as can be.
    def _step_next_plain(self, obs, rewards, terminated, truncated, final_obs=None, final_mask=None):
        if self._rec.step_next(obs, rewards, terminated, truncated):
            self._after(True)
        elif self.recording is None:
            self._rec.clear_buffers()

    def _step_same_plain(self, obs, rewards, terminated, truncated, final_obs=None, final_mask=None):
        rec = self._rec
        self.ended = ended = rec.ended(terminated, truncated)
        finals = self._finals(ended, terminated, truncated, final_obs, final_mask) if ended else _NO_FINALS
        if rec.step_same(obs, rewards, finals):
            self._after(True)
        elif self.recording is None:
            rec.clear_buffers()

    def _finals(self, ended, terminated, truncated, final_obs, final_mask):
        """(final obs digest, terminated, truncated) of each env whose episode ended (a loop over those only)."""
        return {i: (self._final_digest(_at(final_obs, final_mask, i), i), bool(terminated[i]), bool(truncated[i]))
                for i in ended}

    def step_dones(self, obs: Any, rewards: Any, dones: Any, infos: Sequence[Mapping[str, Any]],
                   final_key: str = "terminal_observation", truncated_key: str = "TimeLimit.truncated") -> None:
        """Record a vector step where each env is reset within its ending step and the end is told by
        done flags: a done env's final observation is ``infos[i][final_key]``, and the episode was
        truncated where ``infos[i][truncated_key]`` is true, terminated otherwise (SB3's VecEnv)."""
        self.ended = ended = self._rec.ended(dones)
        finals = {}
        for i in ended:
            info = infos[i]
            truncated = bool(info.get(truncated_key, False))
            finals[i] = (self._final_digest(info.get(final_key), i), not truncated, truncated)
        over = self._rec.step_same(obs, rewards, finals if ended else _NO_FINALS)
        if self.keep_values:
            over |= self._keep_same(obs, ended, _InfoColumn(infos, final_key), None)
        self._after(over)

    def _final_digest(self, value, i):
        if value is None:
            if not self._warned_missing:
                self._warned_missing = True
                warnings.warn("%s: env %d ended an episode without %s; its final observation is recorded as "
                              "missing and will show as an obs difference"
                              % (self.owner, i, self.final_obs_name.format(i=i)), stacklevel=4)
            return core.MISSING_DIGEST
        return self._rec.digest_obs(value)

    # ------------------------------------------------------------------ per-env events

    def env_reset(self, i: int, obs: Any, token: Any = None) -> None:
        """Record that env ``i`` was reset and returned ``obs``; with live, ``token`` is the live token that came
        with it (``info["stepledger"]``), checked now."""
        over = self._rec.env_reset(i, obs)
        if self._live is not None and token is not None:
            self._check_env(i, 1, [token])
        if self.keep_values:
            over |= self.recording.values[i].append(_cast(self.obs_layout, obs), None)  # type: ignore[union-attr]
        self._after(over)

    def env_steps(self, i: int, actions: Any, obs: Any, rewards: Any, terminated: Any, truncated: Any,
                  tokens: Sequence[Any] | None = None) -> None:
        """Record m steps of env ``i``: the actions sent and the observations, rewards and end flags
        received, each batched over the m steps (a leading axis of m). With live, ``tokens`` holds the live
        token that came with each step (None where none did), checked now."""
        over = self._rec.env_steps(i, actions, obs, rewards, terminated, truncated)
        if self._live is not None and tokens is not None:
            self._check_env(i, len(tokens), tokens)
        if self.keep_values:
            m = len(np.asarray(rewards).reshape(-1))
            arows = self.act_layout.cast_each(actions, m)
            orows = self.obs_layout.cast_each(obs, m)
            store = self.recording.values[i]  # type: ignore[union-attr]  # kept values: a file
            for k in range(m):
                over |= store.append(orows[k], arows[k])
        self._after(over)

    def env_reset_withheld(self, i: int) -> None:
        """Record a reset of env ``i`` whose observation the library never gave the trainer (TorchRL resets an
        env as soon as its episode ends; after the run's last batch no batch brings that observation): recorded
        with the withheld marker, as ``env_withheld`` records a step's."""
        over = self._rec.env_reset(i, None)
        if self.keep_values:
            over |= self.recording.values[i].append(None, None)  # type: ignore[union-attr]  # kept values: a file
        self._after(over)

    def env_withheld(self, i: int, actions: Any, rewards: Any, terminated: Any, truncated: Any) -> None:
        """Record m steps of env ``i`` whose observations the library withheld from the trainer, as it says
        it does (an ending step's final observation under TorchRL's ``auto_reset`` or ``compact_obs``):
        each is recorded with the withheld marker, which compare reports as such, not as a difference."""
        over = self._rec.env_steps(i, actions, None, rewards, terminated, truncated)
        if self.keep_values:
            m = len(np.asarray(rewards).reshape(-1))
            arows = self.act_layout.cast_each(actions, m)
            store = self.recording.values[i]  # type: ignore[union-attr]  # kept values: a file
            for k in range(m):
                over |= store.append(None, arows[k])
        self._after(over)

    def set_fragments(self, fragments: Mapping[int, Sequence[tuple[int, int]]]) -> None:
        """For a recorder that sees slices of its envs' streams, as each of several learners does:
        ``fragments[i]`` is a list of (offset, row) pairs, each saying that stream i's events from its row
        ``row`` on are the env's events from ``offset`` on (an event's place in the env's whole stream, as
        its env ledger has it). compare stitches each env's slices from several trainer files by them, in
        offset order (docs/INDICES.md). Give the pair of a slice before its events."""
        if self.recording is not None:
            self.recording.extra_meta[S.META_FRAGMENTS] = {
                str(int(i)): [[int(o), int(r)] for o, r in pairs] for i, pairs in fragments.items()}

    # ------------------------------------------------------------------ the live check

    def _check_env(self, i: int, m: int, tokens: Sequence[Any]) -> None:
        """Live: env i's last m events, just recorded (read back from its buffer), against their tokens."""
        cols = self._rec.buffers[i].views()
        n = len(cols["kind"])
        kind, h_obs, h_act, h_rew, te, tr = (np.asarray(cols[c][n - m:]).tolist() for c in _EVENT_ORDER)
        events = [(k, o, a, r, t, u and not t) for k, o, a, r, t, u in zip(kind, h_obs, h_act, h_rew, te, tr)]
        self._live.check_env(i, events, tokens)  # type: ignore[union-attr]  # live: set

    @property
    def live_faults(self) -> list[BoundaryFault]:
        """The boundary faults the live check has found so far (BoundaryFault objects)."""
        return self._live.faults if self._live is not None else []

    @property
    def live_later(self) -> dict[int, Any]:
        """Per env (slot) that had a live fault, the mismatches after it: they follow from it, not delivered."""
        return dict(self._live.later) if self._live is not None else {}

    def live_metrics(self) -> dict[str, int]:
        """The live check's counts so far, by their metric names (``live.METRIC_FAULTS``, the boundary faults
        found; ``live.METRIC_CHECKED``, the events checked against their tokens); empty without live."""
        return self._live.metrics() if self._live is not None else {}

    def set_on_fault(self, on_fault: OnFault) -> None:
        """Change what a live mismatch does ("raise", "warn", "record" or a callable)."""
        if self._live is not None:
            self._live.on_fault = check_on_fault(on_fault, self.owner)

    def tokens(self, infos: Any, key: str = S.TOKEN_KEY) -> Any:
        """Each env's value under ``key`` (a live token, or the settings), removed unless keep_tokens.

        ``infos`` is a vector env's info dict (``infos[key][i]``, with its
        ``_key`` mask) or a sequence of per-env dicts (``infos[i][key]``).
        None where there is none.
        """
        if isinstance(infos, dict):
            value = infos.pop(key, None) if self._pop_tokens else infos.get(key)
            if self._pop_tokens:
                infos.pop("_" + key, None)
            return value
        if infos is None:
            return None
        return self._rec.tokens(infos, key, self._pop_tokens)

    def check_settings(self, values: Any) -> None:
        """Refuse (SettingsError) an env side whose settings (``tokens(infos, SETTINGS_KEY)``) differ."""
        if self._live is not None:
            self._live.check_settings(values)

    def check_tokens(self, single: Any, first: Any = None, second: Any = None) -> None:
        """Check the latest call's events against the tokens that came with them: an env with one
        event takes ``single[i]``; an env with two (a step, then a reset) ``first[i]`` and ``second[i]``."""
        if self._live is not None:
            self._live(single, first, second)

    # ------------------------------------------------------------------ writing

    def _after(self, over):
        """Keep memory bounded after a recorded call: spill if due, or empty the live-only buffers."""
        if self.recording is None:
            self._rec.clear_buffers()
        elif over:
            attend()

    def interrupted(self) -> None:
        """An exception escaped the trainer's step or reset: the run did not end cleanly."""
        if self.recording is not None:
            self.recording.interrupted = True

    def flush(self) -> None:
        """Write what is new since the last write (a spill segment, at a cost proportional to it)."""
        if self.recording is not None:
            self.recording.flush()

    def close(self) -> None:
        """Write the trainer ledger and free its memory; recording ends."""
        if self.recording is not None:
            self.recording.close()

    # ------------------------------------------------------------------ kept values (keep_values=True only)

    def _keep_next(self, obs):
        orows = self.obs_layout.cast_each(obs, self.num_envs)
        arows, was_pending = self._kept_actions, self._was_pending
        over = False
        for i, store in enumerate(self.recording.values):
            over |= store.append(orows[i], None if arows is None or was_pending[i] else arows[i])
        return over

    def _keep_same(self, obs, ended, final_obs, final_mask):
        orows = self.obs_layout.cast_each(obs, self.num_envs)
        arows = self._kept_actions
        over = False
        for i, store in enumerate(self.recording.values):
            a = None if arows is None else arows[i]
            if i in ended:
                value = _at(final_obs, final_mask, i)
                over |= store.append(None if value is None else _cast(self.obs_layout, value), a)
                over |= store.append(orows[i], None)
            else:
                over |= store.append(orows[i], a)
        return over


class _InfoColumn:
    """``infos[i][key]`` for each env i (None where absent): a column of per-env info dicts."""
    __slots__ = ("infos", "key")

    def __init__(self, infos, key):
        self.infos, self.key = infos, key

    def __getitem__(self, i):
        info = self.infos[i]
        return info.get(self.key) if isinstance(info, dict) else None


_NO_FINALS: dict[int, Any] = {}  # no episode ended at this step (never written to)


def _at(values, mask, i):
    """``values[i]`` (or ``values(i)``), None where it is absent: no values, masked out, not indexable."""
    if values is None:
        return None
    try:
        if mask is not None and not mask[i]:
            return None
        return values(i) if callable(values) else values[i]
    except Exception:
        return None


def _cast(layout, value):
    try:
        return layout.cast(value)
    except Exception:
        return None
