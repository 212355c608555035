"""EpisodeLogTap: the trainer side's episode log, saved with each episode's env index.

A trainer-side wrapper, as LedgerVectorEnv is: it sits on the trainer's
vector env and writes the file ``stepledger episodes`` reads (its layout:
``_schema.EPISODE_LOG_*``).
"""

from __future__ import annotations

import json
import os
from typing import Any

import gymnasium as gym
import numpy as np

from stepledger.format import schema as S
from stepledger.__about__ import __version__
from stepledger.report.episodes.logs import EpisodeLog
from stepledger.format.ledgerfile import atomic_file


class EpisodeLogTap(gym.vector.VectorWrapper):
    """Saves what a vector ``RecordEpisodeStatistics`` reports, with each episode's env index.

    Put it outermost on the trainer side, around ``RecordEpisodeStatistics``
    (and whatever else the trainer wraps), so that it sees the ``info`` the
    training loop sees. At every step, for each env set in
    ``info["_episode"]``, it keeps ``info["episode"]["r"][i]`` and
    ``["l"][i]``. It changes nothing it passes through. ``close()`` (and
    ``flush()``) write ``path``: an ``.npz`` with ``env`` (int64), ``r``
    (float64), ``l`` (int64), ``vstep`` (int64, the tap's vector step count
    when the episode was reported, from 1) and ``meta`` (a JSON string).

    Example::

        envs = gym.vector.SyncVectorEnv([...])       # LedgerEnv outermost in each env
        envs = RecordEpisodeStatistics(envs)
        envs = EpisodeLogTap(envs, "ledger/episodes.npz")
        ...
        envs.close()
        print(check_episodes("ledger", "ledger/episodes.npz"))
    """

    def __init__(self, env: gym.vector.VectorEnv, path: str | os.PathLike[str], stats_key: str = "episode") -> None:
        super().__init__(env)
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError("EpisodeLogTap: path must be a path, got %r" % (path,))
        self.log_path = os.fspath(path)
        self.stats_key = stats_key
        self._env: list[int] = []
        self._r: list[float] = []
        self._l: list[int] = []
        self._vstep: list[int] = []
        self._vsteps = 0
        self._closed = False

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        self._vsteps += 1
        self._take(infos)
        return obs, rewards, terminations, truncations, infos

    def _take(self, infos: Any) -> None:
        stats = infos.get(self.stats_key) if isinstance(infos, dict) else None
        mask = infos.get("_" + self.stats_key) if stats is not None else None
        if stats is None or mask is None:
            return
        for i in np.flatnonzero(np.asarray(mask)):
            self._env.append(int(i))
            self._r.append(float(np.asarray(stats["r"])[i]))
            self._l.append(int(np.asarray(stats["l"])[i]))
            self._vstep.append(self._vsteps)

    @property
    def episodes(self) -> EpisodeLog:
        """The entries kept so far, as an EpisodeLog."""
        return EpisodeLog(self._r, self._l, self._env, "tap", self.log_path)

    def flush(self) -> None:
        """Write the log file now; tapping goes on."""
        mode = self.env.metadata.get("autoreset_mode") if isinstance(self.env.metadata, dict) else None
        meta = {S.META_FORMAT: S.EPISODE_LOG_FORMAT, S.META_FORMAT_VERSION: S.EPISODE_LOG_VERSION,
                "stats_key": self.stats_key,
                "num_envs": int(self.num_envs),
                "autoreset_mode": getattr(mode, "name", None if mode is None else str(mode)),
                "gymnasium_version": gym.__version__, "stepledger_version": __version__}
        with atomic_file(self.log_path) as f:
            np.savez(f, env=np.asarray(self._env, dtype=np.int64), r=np.asarray(self._r, dtype=np.float64),
                     l=np.asarray(self._l, dtype=np.int64), vstep=np.asarray(self._vstep, dtype=np.int64),
                     meta=np.array(json.dumps(meta, sort_keys=True)))

    def close(self, **kwargs: Any) -> None:

        """Write the log file, then close the wrapped env."""
        try:
            if not self._closed:
                self.flush()
                self._closed = True
        finally:
            super().close(**kwargs)
