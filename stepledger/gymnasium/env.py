"""The env side: ``LedgerEnv``, outermost in the environment's own process."""

from __future__ import annotations

import os
import time
import warnings
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from stepledger import core
from stepledger.format import storage
from stepledger import wording
from stepledger.format import schema as S
from stepledger.format.schema import SETTINGS_KEY, TOKEN_KEY
from stepledger.errors import LedgerError
from stepledger.recording.adapters import EnvAdapter
from stepledger.recording.live import settings_message
from stepledger.recording.checks import check_directory, check_path, check_reward_dtype
from stepledger.recording.checks import flush_interval as resolve_flush_interval
from stepledger.recording.hooks import attend
from stepledger.recording.recording import Recording
from stepledger.recording.spiller import open_recording
from stepledger.format.spaces import LeafLayout


class LedgerEnv(EnvAdapter, gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Records what an environment took and gave, for comparison with the trainer's record.

    Place it outermost in the env's own process: after TimeLimit, Monitor and
    any other env-side wrapper, as the last thing before the env is handed to
    the vector env, worker or bridge. Everything inside it counts as the
    environment; everything outside as the boundary. ``index`` is the env's
    position in the trainer's vector env; it may be given later, before the
    first event: ``set_index(i)``, or the trainer-side ledger tells each env
    its position (docs/INDICES.md).

    It returns exactly what the inner env returned and adds nothing to info.
    Each event is digested when it happens, so an env that reuses its arrays,
    or a vector env that edits returned values in place, cannot change the
    record. The ledger is written to ``directory/env-{index}.npz`` on
    ``close()``, on ``flush()``, on SIGTERM and when the process exits without
    ``close()`` (worker processes too); every ``flush_interval`` seconds, and
    past the process's memory limit (64 MB by default), events spill to disk
    next to it, so that even a killed worker leaves its ledger.

    Example::

        >>> import gymnasium as gym
        >>> from stepledger import LedgerEnv
        >>> env = LedgerEnv(gym.make("CartPole-v1"), "ledger", index=0)
        >>> _ = env.reset(seed=0)
        >>> _ = env.step(env.action_space.sample())
        >>> env.close()  # writes ledger/env-0.npz

    Args:
        env: the environment to record.
        directory: where the ledger file is written: a path, or an fsspec URL
            (``s3://bucket/run1``, needs the ``remote`` extra; see storage.py).
        index: the env's index in the trainer's vector env (a non-negative int),
            or None to give it later (``set_index``, ``set_attr("stepledger_index", ...)``
            per env of a vector env, or the trainer side's link). The first
            event fixes it; an env with none then records to
            ``env-unindexed-{random}.npz``, which compare names but does not pair.
        reward_dtype: np.float32 (default) or np.float64; the same on both sides.
        keep_values: also keep the cast observations and actions, so that a
            report can print both sides' values; the same on both sides.
        live: attach each event's token to the info it returns, under the key
            ``"stepledger"``, for a trainer-side ledger with ``live=True`` to
            check as the run goes. With ``directory=None`` no file is written
            and memory stays constant.
        flush_interval: seconds between periodic spills to disk (default 5,
            or ``$STEPLEDGER_FLUSH_INTERVAL``): a process killed with SIGKILL
            loses at most about this much of its record.
    """

    #: how this LedgerEnv is a copy of a recorded env (S.COPIES: unpickled or deep-copied, or rebuilt while
    #: the original records in this process), or None; a copy records ``env-N.copy-{random}.npz``
    _copy: str | None = None

    def __init__(self, env: gym.Env[Any, Any], directory: str | os.PathLike[str] | None, index: int | None = None,
                 reward_dtype: Any = np.float32, keep_values: bool = False, live: bool = False,
                 flush_interval: float | None = None) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, directory=directory, index=index,
                                                 reward_dtype=reward_dtype, keep_values=keep_values, live=live,
                                                 flush_interval=flush_interval)
        gym.Wrapper.__init__(self, env)
        if directory is not None or not live:
            directory = check_path(directory, "LedgerEnv", "directory")
        if index is not None:
            _check_index(index, "LedgerEnv: index")
        if keep_values and directory is None:
            raise ValueError("LedgerEnv: keep_values=True needs a directory to write the values to")
        self._dtype = check_reward_dtype(reward_dtype, "LedgerEnv")
        self._interval = resolve_flush_interval(flush_interval, "LedgerEnv")
        if directory is not None and not storage.is_remote(directory):
            if os.path.splitext(directory)[1].lower() == ".npz" and not os.path.isdir(directory):
                raise LedgerError("LedgerEnv: directory %r looks like a ledger file; give the directory the env "
                                  "ledgers go to (LedgerEnv writes env-N.npz inside it)" % (directory,))
            check_directory(directory, "LedgerEnv")
        elif directory is not None and index is None:
            # the URL's one-line errors now, not at the first event (the Recording checks again then)
            storage.check_writable(storage.join(directory, S.UNINDEXED_PREFIX + "probe.npz"))
        self._obs_layout = LeafLayout(env.observation_space, "LedgerEnv: observation_space")
        self._act_layout = LeafLayout(env.action_space, "LedgerEnv: action_space")
        self._directory = directory
        self._keep_values = bool(keep_values)
        self.live = bool(live)
        self.index = None      # the env's index once given: index=, set_index() or the trainer side's link
        self._index_from = None
        self._link: tuple[str | None, int] | None = None  # (run, position) the trainer side told before the recording began
        self._recording = None
        self._rec = _FirstEvent(self)  # stands in for the recorder until the index is known or an event comes
        self._started = False
        self._warned_position = False
        if index is not None:
            self._start(int(index), "index=")

    def _start(self, index, source):
        """Set up the recording of env ``index`` (None: no index at the first event, see _begin)."""
        directory = self._directory
        if directory is None:
            # live check only: no file, and a buffer emptied at every event, so memory stays constant
            recording, buffer = None, core.StreamBuffer(16)
        else:
            # a URL stays a URL
            name = "env-%d.npz" % index if index is not None else S.UNINDEXED_PREFIX + os.urandom(4).hex() + ".npz"
            path = storage.join(directory, name)
            if source not in ("index=", None) and self._copy is None:
                # given later, so never a throwaway env built only for its spaces: a second LedgerEnv of this
                # index in this process is a mistake (a vector env's call() gives every env the same index)
                other = open_recording(path)
                if other is not None:
                    raise LedgerError(wording.index_taken(index, other.path))
            elif index is not None and self._copy is None and open_recording(path) is not None:
                # built while another LedgerEnv of this process records this env (env.spec.make(),
                # gym.make(env.spec), gymnasium's check_env, an evaluation env from the training env's factory)
                self._copy = S.COPY_REBUILT
            if self._copy is not None and index is not None:
                path = storage.join(directory, "env-%d%s%s.npz" % (index, S.COPY_INFIX, os.urandom(4).hex()))
            recording = Recording(path, "env", [0 if index is None else index], self._obs_layout,
                                  self._act_layout, self._dtype, self._keep_values, interval=self._interval,
                                  owner="LedgerEnv", extra_meta=None if self._copy is None else {S.META_COPY: self._copy})
            recording.deferred = source not in ("index=", None)
            buffer = recording.buffers[0]
            if self._link is not None:
                recording.link(*self._link)
        keep = recording.values[0].append if self._keep_values else None
        self._rec = core.EventRecorder(buffer, self._obs_layout, self._act_layout, self._dtype == np.float32, keep)
        self._recording, self._buffer = recording, buffer
        self.index, self._index_from, self._started = index, source, True
        if index is not None:
            self._saved_kwargs["index"] = index  # env.spec (gym.make(env.spec), check_env) builds this env again
        self._started_ns = time.time_ns()  # to notice another writer of the same file
        # sent once, with the first event's token, so that the trainer side can refuse other settings at once
        self._settings = settings_message(self._dtype.name, self._obs_layout, self._act_layout) if self.live \
            else None

    def _begin(self):
        """The first event is here: its index is fixed now. With none given, the events are not lost:
        they are recorded to ``env-unindexed-{random}.npz``, which compare names."""
        if not self._started:
            if self.live:
                raise LedgerError(wording.live_without_index())
            self._start(None, None)
            if self._recording is not None:
                warnings.warn(wording.unindexed_warning(self._recording.path), RuntimeWarning, stacklevel=4)
        return self._rec

    def _events(self):
        return self._rec.counter if self._started else 0

    def set_index(self, index: int) -> None:
        """Give this env its index (its position in the trainer's vector env), if ``index=`` was not given.

        Before its first event: that event fixes the index. Through wrappers:
        ``env.get_wrapper_attr("set_index")(i)``; each env of a vector env:
        ``envs.set_attr("stepledger_index", [i0, i1, ...])`` (Gymnasium) or
        ``venv.env_method("set_wrapper_attr", "stepledger_index", i, indices=[i])``
        (SB3). Giving the index it already has does nothing; another index,
        or any index after the first event, raises LedgerError.
        """
        _check_index(index, "LedgerEnv.set_index: index")
        index = int(index)
        if self._started:
            if index == self.index:
                return
            if self.index is None or self._events():
                raise LedgerError(wording.index_after_events(index, self.index, self._events(), self.ledger_path))
            raise LedgerError(wording.index_given_twice(self.index, self._index_from, index))
        self._start(index, "set_index()")

    @property
    def stepledger_index(self) -> int | None:
        """The env's index (None until given): setting it calls ``set_index``, so a vector env's
        ``set_attr("stepledger_index", [...])`` gives each env its own."""
        return self.index

    @stepledger_index.setter
    def stepledger_index(self, index: int) -> None:
        self.set_index(index)

    @property
    def stepledger_link(self) -> tuple[str | None, int] | None:
        """(run, position): what the trainer-side ledger told this env (None until it does)."""
        rec = self._recording
        if rec is None:
            return self._link
        return None if rec.run is None else (rec.run, rec.position)

    @stepledger_link.setter
    def stepledger_link(self, value: tuple[str | None, int]) -> None:
        # Set by the trainer side through the vector env's set_attr (or SB3's env_method):
        # the run this ledger belongs to, and this env's position in the vector env. It never
        # raises: the trainer side cannot tell a refusal from a vector env without LedgerEnvs.
        try:
            run, position = value
            position = int(position)
        except (TypeError, ValueError):
            return
        self._link = (run, position)
        if not self._started:
            # no index yet: the trainer side's position is the index
            try:
                self._start(position, "the trainer side's link")
            except LedgerError as exc:
                warnings.warn("stepledger: %s" % exc, RuntimeWarning, stacklevel=2)
                return
        elif position != self.index and not self._warned_position:
            self._warned_position = True
            if self.index is None:
                warnings.warn(wording.unindexed_linked(position, self.ledger_path), RuntimeWarning, stacklevel=2)
            else:
                warnings.warn("stepledger: LedgerEnv(index=%d) is env %d of the trainer's vector env; its ledger "
                              "will not line up with the trainer's stream for env %d: give each env its position "
                              "in the vector env as index=" % (self.index, position, self.index), RuntimeWarning,
                              stacklevel=2)
        if self._recording is not None:
            self._recording.link(run, position)

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if not self._started:
            self._begin()  # before the env is reset: with live=True and no index, it refuses
        try:  # in place, not through _call: a vector env's autoreset calls this within its step
            obs, info = self.env.reset(seed=seed, options=options)
        except BaseException:
            self._interrupted()
            raise
        try:
            over = self._rec.reset(obs)
        except Exception as exc:  # the env's reset never raises because of the ledger
            over = self._failed("reset", exc)
        if self.live:
            info = self._with_token(info)
        if over:
            self._spill()
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        # The action is noted as received, before the env sees it: an env that changes its
        # action array in place must not make the ledger disagree with what was sent.
        rec = self._rec
        rec.take_action(action)
        try:
            result = self.env.step(action)
            obs, reward, terminated, truncated, info = result
        except BaseException:  # Ctrl-C or an error inside the env: the run did not end cleanly
            self._interrupted()
            raise
        try:
            over = rec.step_taken(obs, reward, terminated, truncated)
        except Exception:
            over = self._step_again(obs, reward, terminated, truncated)
        if self.live:
            result = obs, reward, terminated, truncated, self._with_token(info)
        if over:
            self._spill()
        return result  # the inner env's own tuple: building another costs more than the recording

    def __reduce__(self) -> str | tuple[Any, ...]:
        """Pickling and ``copy.deepcopy`` carry the inner env and the ledger's arguments (its index once
        given), not the recording: what is loaded (or the deep copy) is a copy of this env, which records
        ``env-N.copy-{random}.npz`` of its own (docs/INDICES.md), never into this one's ledger."""
        if type(self) is not LedgerEnv:
            return super().__reduce__()
        return _copy_of_ledger_env, (self.env, dict(self._saved_kwargs))

    def _step_again(self, obs, reward, terminated, truncated):
        # Values that cannot be digested are recorded as invalid inside the
        # recorder; what is left is flags with no truth value (an array).
        # Record them as best we can rather than fail the env's step.
        try:
            return self._rec.step_taken(obs, reward, _flag(terminated), _flag(truncated))
        except Exception as exc:
            return self._failed("step", exc, stacklevel=4)  # the warning names the caller of step()

    def _with_token(self, info):
        # A copy: the env's own dict is left as it was (it may reuse it).
        info = dict(info)
        info[TOKEN_KEY] = self._rec.token(self.index)
        if self._settings is not None:
            info[SETTINGS_KEY], self._settings = self._settings, None
        if self._recording is None:
            self._buffer.clear()
        return info

    def _failed(self, what, exc, stacklevel=3):
        warnings.warn("stepledger: LedgerEnv(index=%s) could not record a %s: %s" % (self.index, what, exc),
                      RuntimeWarning, stacklevel=stacklevel)
        return False

    def _spill(self):
        if self._recording is None:
            self._buffer.clear()
            return
        attend()  # spills what is due; a failed write warns once and backs off, never raises

    # ledger_path (``env-N.dup-*.npz`` if another live process records env N), flush() and close():
    # EnvAdapter's
    # Two LedgerEnvs given the same index write one file, the last one's: say so when it happens.
    def _file_stat(self):
        if storage.is_remote(self.ledger_path):
            return None
        try:
            st = os.stat(self.ledger_path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    def _warn_if_overwriting(self):
        if self.index is None:
            return  # a name of its own
        stat = self._file_stat()
        # this recording's own writes (flush() from another thread, a SIGTERM) are not another writer's
        if stat is not None and stat[1] >= self._started_ns and stat != self._recording.written:
            warnings.warn(wording.overwritten_ledger(self.ledger_path, self.index), RuntimeWarning, stacklevel=3)

    _closing = _warn_if_overwriting  # EnvAdapter.close calls it before the recording is closed


def _copy_of_ledger_env(env: gym.Env[Any, Any], arguments: dict[str, Any]) -> LedgerEnv:
    """A pickled or deep-copied LedgerEnv, loaded: a copy (S.COPY_PICKLED) around ``env``."""
    copy = LedgerEnv.__new__(LedgerEnv)
    copy._copy = S.COPY_PICKLED
    LedgerEnv.__init__(copy, env, **arguments)
    return copy


class _FirstEvent:
    """The recorder's stand-in until the index is known: the first event fixes it (LedgerEnv._begin),
    then the real recorder takes this one's place, so the step path pays nothing for a deferred index."""

    def __init__(self, env):
        self._env = env

    def reset(self, obs):
        return self._env._begin().reset(obs)

    def take_action(self, action):
        return self._env._begin().take_action(action)

    def step_taken(self, obs, reward, terminated, truncated):
        return self._env._begin().step_taken(obs, reward, terminated, truncated)


def _check_index(index, what):
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
        raise ValueError("%s must be the env's position in the vector env (a non-negative int), got %r"
                         % (what, index))


def _flag(value):
    """A flag with no plain truth value (an array of several): true if any element is."""
    try:
        return bool(np.any(np.asarray(value)))
    except Exception:
        return True
