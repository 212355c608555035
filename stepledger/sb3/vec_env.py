"""The trainer side for Stable-Baselines3: ``LedgerVecEnv``, innermost around the VecEnv.

Needs the ``[sb3]`` extra: ``pip install "plugrl-stepledger[sb3]"``.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

try:
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecEnvWrapper
    from stable_baselines3.common.vec_env.base_vec_env import VecEnvObs, VecEnvStepReturn
except ImportError as exc:  # pragma: no cover - exercised in a venv without SB3
    raise ImportError("stepledger.sb3 needs stable-baselines3: pip install \"plugrl-stepledger[sb3]\" "
                      "(or pip install stable-baselines3)") from exc

from stepledger.format.schema import LINK_ATTR, RESET_TOKEN_KEY, SETTINGS_KEY
from stepledger.recording.live import BoundaryFault
from stepledger.recording.placement import check_placement, slot_infos
from stepledger.recording.adapters import TrainerAdapter
from stepledger.recording.trainer import DONE_FLAGS, OnFault

__all__ = ["BoundaryFault", "LedgerVecEnv", "LogLiveCheck", "StopOnBoundaryFault"]

_TIME_LIMIT = "TimeLimit.truncated"
_TERMINAL_OBS = "terminal_observation"


class LedgerVecEnv(TrainerAdapter, VecEnvWrapper):
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
        ``infos[i]``, the reset's in the VecEnv's ``reset_infos[i]`` (``stepledger.pettingzoo``'s under SuperSuit:
        in the ending step's ``infos[i]``, a key of its own). With ``path=None`` no file is written.
    :param on_fault: with live, what a mismatch does: "raise" a BoundaryFault (default), "warn", "record"
        (keep it in ``live_faults``), or a callable; see also ``StopOnBoundaryFault``.
    :param keep_tokens: leave the tokens in the infos (by default they are removed).
    :param flush_interval: seconds between periodic spills to disk (default 5).
    :param check_wrappers: warn once when a wrapper sits between this ledger and the VecEnv (or around
        LedgerEnv in a DummyVecEnv's envs): VecNormalize, VecFrameStack and others that change values on purpose
        (or declared so) named as such, any other VecEnvWrapper as on the checked side, its differences its
        doing; False silences it.
    :param deliberate_wrappers: wrapper classes (or class names) of your own that change values on purpose
        (or the class attribute ``stepledger_changes_values = True``; False for one that only watches).
    :param streams: the env stream each env of the VecEnv carries (default env i: stream i); for SuperSuit's
        vector envs of a PettingZoo env, the (env copy, agent) map ``stepledger.pettingzoo.slot_map`` gives.
    """

    def __init__(self, venv: VecEnv, path: str | os.PathLike[str] | None, reward_dtype: Any = np.float32,
                 keep_values: bool = False, live: bool = False, on_fault: OnFault = "raise",
                 keep_tokens: bool = False, check_wrappers: bool = True, flush_interval: float | None = None,
                 streams: Sequence[int] | None = None, deliberate_wrappers: Any = None) -> None:
        super().__init__(venv)
        between = check_placement(venv, "LedgerVecEnv", check_wrappers, deliberate_wrappers)
        self._open_ledger(venv, path, venv.num_envs, venv.observation_space, venv.action_space,
                          autoreset_mode=DONE_FLAGS, reward_dtype=reward_dtype, keep_values=keep_values, live=live,
                          on_fault=on_fault, keep_tokens=keep_tokens, flush_interval=flush_interval,
                          streams=streams, owner="LedgerVecEnv", final_obs_name="infos[{i}]['%s']" % _TERMINAL_OBS)
        self.ledger.note_wrappers(between)
        self._link_envs()

    def _link_envs(self) -> None:
        """Tell each env-side ledger the run and its position (see vector.link_envs), one env at a time:
        SB3's set_attr gives every env the same value, so this goes through each env's set_wrapper_attr."""
        if self.ledger.run is None or type(self.venv) not in (DummyVecEnv, SubprocVecEnv):
            return
        try:
            for i, link in enumerate(self.ledger.links()):
                self.venv.env_method("set_wrapper_attr", LINK_ATTR, link, indices=[i])
        except Exception:
            pass

    def _inner_reset_infos(self):
        # the innermost VecEnv fills reset_infos; wrappers in between keep lists of their own (SuperSuit's
        # SB3 wrapper fills its own: what it wraps is no SB3 VecEnv)
        infos = getattr(getattr(self.venv, "unwrapped", self.venv), "reset_infos", None)
        return self.venv.reset_infos if infos is None else infos

    @property
    def reset_infos(self) -> list[dict[str, Any]]:
        """The inner VecEnv's reset infos: SB3's VecEnvWrapper keeps its own empty list instead."""
        return self.venv.reset_infos

    @reset_infos.setter
    def reset_infos(self, value: list[dict[str, Any]]) -> None:
        pass  # VecEnv.__init__ assigns an empty list; the inner VecEnv's list is the one it fills

    def reset(self) -> VecEnvObs:
        obs = self._call(self.venv.reset)
        led = self.ledger
        led.reset(obs)
        if self.live:
            # each env's first event is this reset: its settings come with it
            infos = slot_infos(self.venv, self._inner_reset_infos())
            led.check_settings(led.tokens(infos, SETTINGS_KEY))
            tokens = led.tokens(infos, RESET_TOKEN_KEY)  # stepledger.pettingzoo's reset tokens have their own key
            led.check_tokens(tokens if any(tokens) else led.tokens(infos))
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        # SB3's VecEnvs send env i actions[i]: a row of an array, or the i-th dict or
        # tuple of a list. Each is digested as its env will receive it, before it is sent.
        self.ledger.actions_per_env(actions)
        self.venv.step_async(actions)

    def step_wait(self) -> VecEnvStepReturn:
        try:
            obs, rewards, dones, infos = self.venv.step_wait()
        except BaseException:  # Ctrl-C or an error: the run did not end cleanly
            self.ledger.interrupted()
            raise
        led = self.ledger
        led.step_dones(obs, rewards, dones, infos, _TERMINAL_OBS, _TIME_LIMIT)
        if self.live:
            steps = led.tokens(infos)
            resets = None
            if led.ended:
                # stepledger.pettingzoo's: SuperSuit merges an autoreset's info into the ending step's (and
                # never refreshes reset_infos then)
                resets = led.tokens(infos, RESET_TOKEN_KEY)
                if not any(resets):
                    resets = led.tokens(self._inner_reset_infos())
            led.check_tokens(steps, steps, resets)
        return obs, rewards, dones, infos



def _live_ledger(training_env: Any, owner: str) -> LedgerVecEnv:
    """The LedgerVecEnv(live=True) in a model's VecEnv; ValueError where there is none."""
    env: Any = training_env
    while env is not None and not isinstance(env, LedgerVecEnv):
        env = getattr(env, "venv", None)
    if env is None or not env.live:
        raise ValueError("%s: the model's VecEnv has no LedgerVecEnv(..., live=True) in it" % owner)
    return env


class LogLiveCheck(BaseCallback):
    """Puts the live check's counts in the model's logger, where training is watched (TensorBoard, CSV, JSON or
    any SB3 output format): the boundary faults found so far and the events checked against their live tokens
    so far, under the names ``stepledger.recording.live.METRIC_FAULTS`` and ``METRIC_CHECKED`` (docs/LIVE.md),
    recorded at the end of each rollout, so that each of the logger's rows has them. It changes nothing else: what a fault does is still the LedgerVecEnv's ``on_fault`` ("warn" or
    "record" to train on past faults; ``StopOnBoundaryFault`` logs them too, and stops).

    Example::

        venv = LedgerVecEnv(SubprocVecEnv(fns), None, live=True, on_fault="warn")
        model = PPO("MlpPolicy", venv, tensorboard_log="runs")
        model.learn(1_000_000, callback=LogLiveCheck())
    """

    def __init__(self, verbose: int = 0) -> None:
        super().__init__(verbose)
        self.ledger: LedgerVecEnv | None = None

    def _init_callback(self) -> None:
        self.ledger = _live_ledger(self.training_env, type(self).__name__)

    def _record(self) -> None:
        for key, value in self.ledger.live_metrics().items():  # type: ignore[union-attr]  # _init_callback set it
            self.logger.record(key, value)

    def _on_rollout_end(self) -> None:
        self._record()

    def _on_step(self) -> bool:
        return True


class StopOnBoundaryFault(LogLiveCheck):
    """Stops ``learn()`` cleanly at the first boundary fault the live check finds.

    The run's LedgerVecEnv must have ``live=True``; the callback makes it
    keep faults instead of raising them, and ends training after the step
    where the first one was seen, so the model and logs up to that step can
    be saved. The fault is in ``callback.fault``. As ``LogLiveCheck`` does, it
    puts the live check's counts in the model's logger at the end of each
    rollout, and once more when it stops (a last row of the logger's output).

    Example::

        venv = LedgerVecEnv(SubprocVecEnv(fns), None, live=True)
        stop = StopOnBoundaryFault()
        model.learn(1_000_000, callback=stop)
        if stop.fault:
            print(stop.fault)  # env 2, episode 14, step 101: reward differs (...)
    """

    def __init__(self, verbose: int = 0) -> None:
        super().__init__(verbose)
        self.fault: BoundaryFault | None = None

    def _init_callback(self) -> None:
        super()._init_callback()
        self.ledger.set_on_fault("record")  # type: ignore[union-attr]  # just set

    def _on_step(self) -> bool:
        faults = self.ledger.live_faults  # type: ignore[union-attr]  # _init_callback set it
        if faults:
            self.fault = faults[0]
            if self.verbose:
                print("stepledger: stopping training at a boundary fault: %s" % self.fault)
            self._record()
            # learn() ends before it would write this rollout's row: written here, at the step it stopped at
            self.logger.record("time/total_timesteps", self.num_timesteps)
            self.logger.dump(self.num_timesteps)
            return False
        return True
