"""The trainer side for Stable-Baselines3: ``LedgerVecEnv``, innermost around the VecEnv.

Needs the ``[sb3]`` extra: ``pip install "plugrl-stepledger[sb3]"``.
"""

import warnings

import numpy as np

try:
    from stable_baselines3.common.vec_env import VecEnvWrapper
except ImportError as exc:  # pragma: no cover - exercised in a venv without SB3
    raise ImportError("stepledger.sb3 needs stable-baselines3: pip install \"plugrl-stepledger[sb3]\" "
                      "(or pip install stable-baselines3)") from exc

from . import core
from .recording import Recording, check_path, check_reward_dtype, spill_everything
from .spaces import LeafLayout

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
    :param path: the trainer ledger file to write.
    :param reward_dtype: np.float32 (default) or np.float64; the same on both sides.
    :param keep_values: also keep observations and actions; the same on both sides.
    """

    def __init__(self, venv, path, reward_dtype=np.float32, keep_values=False):
        super().__init__(venv)
        path = check_path(path, "LedgerVecEnv", "path")
        dtype = check_reward_dtype(reward_dtype, "LedgerVecEnv")
        obs_layout = LeafLayout(venv.observation_space, "LedgerVecEnv: observation_space")
        act_layout = LeafLayout(venv.action_space, "LedgerVecEnv: action_space")
        self.ledger_path = path
        self._recording = Recording(path, "trainer", range(venv.num_envs), obs_layout, act_layout, dtype,
                                    keep_values, {"autoreset_mode": "sb3"})
        self._rec = core.VectorRecorder(self._recording.buffers, obs_layout, act_layout, dtype == np.float32)
        self._keep = keep_values
        self._actions = None
        self._warned_missing = False

    @property
    def reset_infos(self):
        """The inner VecEnv's reset infos: SB3's VecEnvWrapper keeps its own empty list instead."""
        return self.venv.reset_infos

    @reset_infos.setter
    def reset_infos(self, value):
        pass  # VecEnv.__init__ assigns an empty list; the inner VecEnv's list is the one it fills

    def reset(self):
        obs = self.venv.reset()
        over = self._rec.reset(obs)
        if self._keep:
            rows = self._rows(self._rec.obs_layout, obs)
            for i, store in enumerate(self._recording.values):
                over |= store.append(None if rows is None else [r[i] for r in rows], None)
        if over:
            spill_everything()
        return obs

    def step_async(self, actions):
        self._rec.actions(actions)
        if self._keep:
            self._actions = self._rows(self._rec.act_layout, actions)
        self.venv.step_async(actions)

    def step_wait(self):
        obs, rewards, dones, infos = self.venv.step_wait()
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
        if over:
            spill_everything()
        return obs, rewards, dones, infos

    def _warn_missing(self, i):
        if not self._warned_missing:
            self._warned_missing = True
            warnings.warn("LedgerVecEnv: env %d is done without infos[%d]['terminal_observation']; its "
                          "final observation is recorded as missing and will show as an obs difference"
                          % (i, i), stacklevel=3)

    def _rows(self, layout, batch):
        try:
            return layout.cast_rows(batch, self.num_envs)
        except Exception:
            return None

    def _keep_step(self, obs, ended, infos):
        orows = self._rows(self._rec.obs_layout, obs)
        arows = self._actions
        over = False
        for i, store in enumerate(self._recording.values):
            o = None if orows is None else [r[i] for r in orows]
            a = None if arows is None else [r[i] for r in arows]
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
        self._recording.write()

    def close(self):
        """Write the trainer ledger, then close the VecEnv."""
        try:
            self._recording.close()
        finally:
            self.venv.close()
