"""The trainer side for Stable-Baselines3: ``LedgerVecEnv``, innermost around the VecEnv.

Needs the ``[sb3]`` extra: ``pip install "plugrl-stepledger[sb3]"``.
"""

import warnings

import numpy as np

try:
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnvWrapper
except ImportError as exc:  # pragma: no cover - exercised in a venv without SB3
    raise ImportError("stepledger.sb3 needs stable-baselines3: pip install \"plugrl-stepledger[sb3]\" "
                      "(or pip install stable-baselines3)") from exc

from . import core
from ._schema import LINK_ATTR, SETTINGS_KEY, TOKEN_KEY
from .live import BoundaryFault, check_on_fault
from .recording import TrainerSide
from .stack import warn_inner_wrappers

__all__ = ["BoundaryFault", "LedgerVecEnv", "StopOnBoundaryFault"]

_TIME_LIMIT = "TimeLimit.truncated"
_TERMINAL_OBS = "terminal_observation"


class LedgerVecEnv(VecEnvWrapper):
    """Records what an SB3 trainer sent and received through a VecEnv.

    Place it innermost: directly around SubprocVecEnv or DummyVecEnv, inside
    VecNormalize, VecFrameStack and VecMonitor. It takes the actions in
    ``step_async``; on a done it records the step with
    ``infos[i]["terminal_observation"]`` and truncated =
    ``infos[i]["TimeLimit.truncated"]``, then the reset. It writes one file
    with every env's stream on ``close()``, ``flush()`` and at exit.

    :param venv: the VecEnv to record.
    :param path: the trainer ledger file to write: a path, or an fsspec URL.
    :param reward_dtype: np.float32 (default) or np.float64; the same on both sides.
    :param keep_values: also keep observations and actions; the same on both sides.
    :param live: check each env's live token (from ``LedgerEnv(live=True)``) as it arrives: the step's in
        ``infos[i]``, the reset's in the VecEnv's ``reset_infos[i]``. With ``path=None`` no file is written.
    :param on_fault: with live, what a mismatch does: "raise" a BoundaryFault (default), "warn", "record"
        (keep it in ``live_faults``), or a callable; see also ``StopOnBoundaryFault``.
    :param keep_tokens: leave the tokens in the infos (by default they are removed).
    :param flush_interval: seconds between periodic spills to disk (default 5).
    :param check_wrappers: warn once when VecNormalize, VecFrameStack, VecTransposeImage or another wrapper
        that changes values on purpose sits between this ledger and the VecEnv; False if you mean it.
    """

    def __init__(self, venv, path, reward_dtype=np.float32, keep_values=False, live=False, on_fault="raise",
                 keep_tokens=False, check_wrappers=True, flush_interval=None):
        super().__init__(venv)
        warn_inner_wrappers(venv, "LedgerVecEnv", check_wrappers)
        self._side = TrainerSide("LedgerVecEnv", path, venv.num_envs, venv.observation_space, venv.action_space,
                                 reward_dtype, keep_values, "sb3", live, on_fault, flush_interval)
        self._link_envs()
        self._recording, self._rec, self._live = self._side.recording, self._side.recorder, self._side.live
        self._keep = keep_values
        self._actions = None
        self._warned_missing = False
        self.live = bool(live)
        self._pop_tokens = not keep_tokens

    @property
    def ledger_path(self):
        """Where the trainer ledger is written (None in live-only mode)."""
        return self._side.path

    def _link_envs(self):
        """Tell each env-side ledger the run and its position (see vector.link_envs), one env at a time:
        SB3's set_attr gives every env the same value, so this goes through each env's set_wrapper_attr."""
        if self._side.run is None or type(self.venv) not in (DummyVecEnv, SubprocVecEnv):
            return
        try:
            for i, link in enumerate(self._side.links(self.num_envs)):
                self.venv.env_method("set_wrapper_attr", LINK_ATTR, link, indices=[i])
        except Exception:
            pass

    @property
    def live_faults(self):
        """The boundary faults the live check has found so far (BoundaryFault objects)."""
        return self._live.faults if self._live is not None else []

    def set_on_fault(self, on_fault):
        """Change what a live mismatch does ("raise", "warn", "record" or a callable)."""
        if self._live is not None:
            self._live.on_fault = check_on_fault(on_fault, "LedgerVecEnv")

    def _inner_reset_infos(self):
        # the innermost VecEnv fills reset_infos; wrappers in between keep lists of their own
        return getattr(self.venv, "unwrapped", self.venv).reset_infos

    @property
    def reset_infos(self):
        """The inner VecEnv's reset infos: SB3's VecEnvWrapper keeps its own empty list instead."""
        return self.venv.reset_infos

    @reset_infos.setter
    def reset_infos(self, value):
        pass  # VecEnv.__init__ assigns an empty list; the inner VecEnv's list is the one it fills

    def reset(self):
        try:
            obs = self.venv.reset()
        except BaseException:  # Ctrl-C or an error: the run did not end cleanly
            self._side.interrupted()
            raise
        over = self._rec.reset(obs)
        if self._keep:
            rows = self._rows(self._rec.obs_layout, obs)
            for i, store in enumerate(self._recording.values):
                over |= store.append(rows[i], None)
        self._after(over)
        if self._live is not None:
            # each env's first event is this reset: its settings come with it
            self._live.check_settings(self._rec.tokens(self._inner_reset_infos(), SETTINGS_KEY, self._pop_tokens))
            tokens = self._rec.tokens(self._inner_reset_infos(), TOKEN_KEY, self._pop_tokens)
            self._live(tokens)
        return obs

    def step_async(self, actions):
        # SB3's VecEnvs send env i actions[i]: a row of an array, or the i-th dict or
        # tuple of a list. Each is digested as its env will receive it, before it is sent.
        self._rec.actions_per_env(actions)
        if self._keep:
            self._actions = self._rec.act_layout.cast_per_env(actions, self.num_envs)
        self.venv.step_async(actions)

    def step_wait(self):
        try:
            obs, rewards, dones, infos = self.venv.step_wait()
        except BaseException:  # Ctrl-C or an error: the run did not end cleanly
            self._side.interrupted()
            raise
        rec = self._rec
        ended = rec.ended(dones)
        finals = {}
        for i in ended:  # the envs that are done at this step only
            info = infos[i]
            truncated = bool(info.get(_TIME_LIMIT, False))
            final = info.get(_TERMINAL_OBS)
            if final is not None:
                h = rec.digest_obs(final)
            else:
                h = core.MISSING_DIGEST
                self._warn_missing(i)
            finals[i] = (h, not truncated, truncated)
        over = rec.step_same(obs, rewards, finals)
        if self._keep:
            over |= self._keep_step(obs, ended, infos)
        self._after(over)
        if self._live is not None:
            steps = rec.tokens(infos, TOKEN_KEY, self._pop_tokens)
            resets = rec.tokens(self._inner_reset_infos(), TOKEN_KEY, self._pop_tokens) if ended else None
            self._live(steps, steps, resets)
        return obs, rewards, dones, infos

    def _after(self, over):
        self._side.after_step(over)

    def _warn_missing(self, i):
        if not self._warned_missing:
            self._warned_missing = True
            warnings.warn("LedgerVecEnv: env %d is done without infos[%d]['terminal_observation']; its "
                          "final observation is recorded as missing and will show as an obs difference"
                          % (i, i), stacklevel=3)

    def _rows(self, layout, batch):
        """Each env's cast observation leaves (None where they cannot be cast)."""
        return layout.cast_each(batch, self.num_envs)

    def _keep_step(self, obs, ended, infos):
        orows = self._rows(self._rec.obs_layout, obs)
        arows = self._actions
        over = False
        for i, store in enumerate(self._recording.values):
            o = orows[i]
            a = None if arows is None else arows[i]
            if i in ended:
                final = infos[i].get(_TERMINAL_OBS)
                try:
                    f = None if final is None else self._rec.obs_layout.cast(final)
                except Exception:
                    f = None
                over |= store.append(f, a)
                over |= store.append(o, None)
            else:
                over |= store.append(o, a)
        return over

    def flush(self):
        """Write the trainer ledger now; recording goes on."""
        self._side.flush()

    def close(self):
        """Write the trainer ledger, then close the VecEnv."""
        try:
            self._side.close()
        finally:
            self.venv.close()


class StopOnBoundaryFault(BaseCallback):
    """Stops ``learn()`` cleanly at the first boundary fault the live check finds.

    The run's LedgerVecEnv must have ``live=True``; the callback makes it
    keep faults instead of raising them, and ends training after the step
    where the first one was seen, so the model and logs up to that step can
    be saved. The fault is in ``callback.fault``.

    Example::

        venv = LedgerVecEnv(SubprocVecEnv(fns), None, live=True)
        stop = StopOnBoundaryFault()
        model.learn(1_000_000, callback=stop)
        if stop.fault:
            print(stop.fault)  # env 2, episode 14, step 101: reward differs (...)
    """

    def __init__(self, verbose=0):
        super().__init__(verbose)
        self.fault = None
        self.ledger = None

    def _init_callback(self):
        env = self.training_env
        while env is not None and not isinstance(env, LedgerVecEnv):
            env = getattr(env, "venv", None)
        if env is None or not env.live:
            raise ValueError("StopOnBoundaryFault: the model's VecEnv has no LedgerVecEnv(..., live=True) in it")
        self.ledger = env
        env.set_on_fault("record")

    def _on_step(self):
        faults = self.ledger.live_faults
        if faults:
            self.fault = faults[0]
            if self.verbose:
                print("stepledger: stopping training at a boundary fault: %s" % self.fault)
            return False
        return True
