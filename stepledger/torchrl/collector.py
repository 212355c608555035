"""The trainer side for TorchRL: ``LedgerCollector``, which records each batch a collector hands out.

Where it reads: the TensorDict the collector yields (``for batch in
collector``), after the collector's ``postproc``, as the learning code gets
it. A batch has shape ``[*batch_size, T]``, time last; each row is one env's T
consecutive steps, and ``INDEX_KEY`` (put there by the env side's
``LedgerIndex``) says which env. So it works the same for ``Collector``,
``MultiSyncCollector`` (the workers' batches concatenated) and
``MultiAsyncCollector`` (one worker's batch at a time).

An env's stream from its rows, in order: the first row's root
``observation`` at t=0 is the reset's; a step t is ``action[t]`` and
``("next", "observation")[t]``, ``("next", "reward")[t]``, ``("next",
"terminated")[t]``, ``("next", "truncated")[t]``; after a step that ended
the episode, the root observation at t+1 (or at t=0 of the env's next row)
is the next reset's.

The final observation is *withheld* where the library says so:
``("next", "observation")`` absent (``compact_obs=True``: then a step's
observation is the root observation of the step after it) or filled with
NaN at an ending step (``auto_reset=True``, native autoreset). The step is
recorded with the withheld marker (``format/schema.py``), and compare reports
it as a step whose final observation the trainer never had, not as a
difference. ``withheld=True`` says the same of any value (a fill of zeros).

Per batch, per env, one call into the engine per episode (``env_steps``),
whatever the number of steps.
"""

from typing import Any

import numpy as np

from stepledger.recording.trainer import TrainerLedger
from stepledger.torchrl.envs import INDEX_KEY

__all__ = ["LedgerCollector", "spaces_of"]

_NEXT_OBS = ("next", "observation")


def spaces_of(env_fns):
    """One env's Gymnasium (observation_space, action_space), from a ``LedgerEnvFn`` (it builds the user's env
    once in this process, without a ledger, and closes it)."""
    fn = env_fns[0] if isinstance(env_fns, (list, tuple)) else env_fns
    env = fn.make_env(fn.index) if fn.pass_index else fn.make_env()
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


class LedgerCollector:
    """Records the trainer side's ledger from a TorchRL collector's batches; iterate it as the collector.

    Example::

        env = ParallelEnv(4, ledger_env_fns(make_env, 4, "ledger"))           # env side, in each worker
        collector = LedgerCollector(Collector(env, policy, frames_per_batch=200, total_frames=2000),
                                    path="ledger/trainer.npz", env_fns=ledger_env_fns(make_env, 4, "ledger"))
        for batch in collector:   # each batch is recorded before it is handed out
            ...
        collector.shutdown()      # writes ledger/trainer.npz, then shuts the collector (and its envs) down

    Everything but iterating, ``next()``, ``shutdown()`` and ``flush()`` is the collector's own.

    Args:
        collector: a TorchRL ``Collector``, ``MultiSyncCollector`` or ``MultiAsyncCollector`` whose envs
            were built by ``ledger_env_fns`` (their batches carry ``INDEX_KEY``); ``split_trajs=False``.
        path: the trainer ledger file (a path or an fsspec URL).
        env_fns: the envs' ``LedgerEnvFn``s: the number of envs and their spaces are read from them; or give
            ``num_envs``, ``observation_space`` and ``action_space``.
        withheld: True where the library fills an ending step's final observation with a value of its
            own that is not NaN (the ledger cannot tell it from an observation otherwise).
        reward_dtype, flush_interval: as for ``TrainerLedger``; the same ``reward_dtype`` on the env side.
    """

    def __init__(self, collector, path, env_fns=None, *, num_envs=None, observation_space=None, action_space=None,
                 withheld=False, reward_dtype=np.float32, flush_interval=None):
        if env_fns is not None:
            num_envs = len(env_fns) if isinstance(env_fns, (list, tuple)) else num_envs
            if observation_space is None or action_space is None:
                observation_space, action_space = spaces_of(env_fns)
        if num_envs is None or observation_space is None or action_space is None:
            raise ValueError("LedgerCollector: give env_fns (the envs' LedgerEnvFn), or num_envs, observation_space "
                             "and action_space")
        if getattr(collector, "split_trajs", False):
            raise ValueError("LedgerCollector: split_trajs=True pads and regroups the batch by trajectory; the "
                             "ledger reads each env's rows in order: use split_trajs=False (the default)")
        if getattr(collector, "replay_buffer", None) is not None:
            raise ValueError("LedgerCollector: this collector writes its batches into its replay_buffer and hands "
                             "out none, so the trainer ledger would stay empty; build the collector without "
                             "replay_buffer= and extend the buffer in the loop (rb.extend(batch)), after the "
                             "ledger has the batch")
        limit = getattr(collector, "max_frames_per_traj", 0) or 0
        if limit > 0:
            raise ValueError("LedgerCollector: max_frames_per_traj=%d ends episodes in the collector, outside the env "
                             "ledger (the env never truncated them: each cut would read as a truncated difference); "
                             "give the env its limit inside the ledger instead: gym.make(..., max_episode_steps=%d) "
                             "in make_env" % (limit, limit))
        self.collector = collector
        self.ledger = TrainerLedger(path, num_envs, observation_space, action_space, reward_dtype=reward_dtype,
                                    flush_interval=flush_interval, owner="LedgerCollector")
        self._book = _Book(self.ledger, num_envs, observation_space, action_space, bool(withheld),
                           bool(getattr(collector, "reset_at_each_iter", False)))

    def __getattr__(self, name):
        return getattr(self.__dict__["collector"], name)

    @property
    def ledger_path(self):
        """Where the trainer ledger is written."""
        return self.ledger.path

    def __iter__(self):
        it = iter(self.collector)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except BaseException:
                self.ledger.interrupted()
                raise
            self.record(batch)
            yield batch

    def next(self):
        """The collector's next batch, recorded."""
        try:
            batch = self.collector.next()
        except BaseException:
            self.ledger.interrupted()
            raise
        if batch is not None:
            self.record(batch)
        return batch

    def record(self, batch):
        """Record one batch as the collector handed it out (``__iter__`` and ``next`` do)."""
        self._book.record(batch)

    def flush(self):
        """Write what is new in the trainer ledger; recording goes on."""
        self.ledger.flush()

    def shutdown(self, *args, **kwargs):
        """Write the trainer ledger (each env's last step), then shut the collector down (its envs' ledgers)."""
        try:
            self._book.finish()
            self.ledger.close()
        finally:
            self.collector.shutdown(*args, **kwargs)

    close = shutdown

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is not None:
            self.ledger.interrupted()
        self.shutdown()


class _Book:
    """Each env's state between batches: whether its reset is recorded, and a step whose observation is due."""

    def __init__(self, ledger, n, obs_space, act_space, withheld, reset_each=False):
        import gymnasium as gym
        self.ledger, self.n, self.force_withheld, self.reset_each = ledger, n, withheld, reset_each
        self.started = np.zeros(n, dtype=bool)
        self.reset_due = np.zeros(n, dtype=bool)  # the env's next row starts with a reset observation
        self.pending: list[Any] = [None] * n  # compact_obs: (action, reward, terminated, truncated) of a step awaiting its obs
        self.one_hot = isinstance(act_space, gym.spaces.Discrete)
        self.obs_keys = list(obs_space.spaces) if isinstance(obs_space, gym.spaces.Dict) else None

    def _obs(self, td):
        if self.obs_keys is None:
            return td.get("observation").numpy()
        return {k: td.get(k).numpy() for k in self.obs_keys}

    def record(self, batch):
        batch = batch.detach().cpu() if batch.device not in (None, "cpu") else batch
        if batch.batch_dims == 1:
            batch = batch.unsqueeze(0)
        rows = batch.reshape(-1, batch.shape[-1])
        index = rows.get(INDEX_KEY, None)
        if index is None:
            raise ValueError("LedgerCollector: the batch has no %r: build the envs with stepledger.torchrl."
                             "ledger_env_fns (the env side tells each row's env)" % (INDEX_KEY,))
        envs = index[:, 0, 0].numpy()
        obs = self._obs(rows)
        nxt = rows.get("next")
        compact = _NEXT_OBS[1] not in nxt.keys() if self.obs_keys is None else self.obs_keys[0] not in nxt.keys()
        next_obs = None if compact else self._obs(nxt)
        action = rows.get("action").numpy()
        if self.one_hot and action.ndim == 3:
            action = action.argmax(-1)
        reward = nxt.get("reward").numpy().reshape(action.shape[0], -1)
        term = nxt.get("terminated").numpy().reshape(action.shape[0], -1)
        trunc = nxt.get("truncated").numpy().reshape(action.shape[0], -1)
        for r, i in enumerate(envs):
            self._row(int(i), _take(obs, r), None if compact else _take(next_obs, r), action[r], reward[r],
                      term[r], trunc[r])

    def _row(self, i, obs, next_obs, action, reward, term, trunc):
        ledger = self.ledger
        T = len(reward)
        if self.reset_each:
            self._reset_before_row(i)
        if self.pending[i] is not None:  # compact_obs: the last step of the env's previous row, its obs is obs[0]
            a, rw, te, tr = self.pending[i]
            self.pending[i] = None
            ledger.env_steps(i, a, _take(obs, slice(0, 1)), rw, te, tr)
        if not self.started[i] or self.reset_due[i]:
            ledger.env_reset(i, _take(obs, 0))
            self.started[i], self.reset_due[i] = True, False
        ends = np.flatnonzero(term | trunc)
        start = 0
        for d in list(ends) + ([T - 1] if not len(ends) or ends[-1] != T - 1 else []):
            d = int(d)
            ended = bool(term[d] or trunc[d])
            stop = d + 1
            if next_obs is None:  # compact_obs: a step's obs is the next root obs
                upto = stop - 1 if ended or stop == T else stop
                if upto > start:
                    ledger.env_steps(i, action[start:upto], _take(obs, slice(start + 1, upto + 1)),
                                     reward[start:upto], term[start:upto], trunc[start:upto])
                if ended:
                    ledger.env_withheld(i, action[d:stop], reward[d:stop], term[d:stop], trunc[d:stop])
                elif upto < stop:
                    self.pending[i] = (action[d:stop], reward[d:stop], term[d:stop], trunc[d:stop])
            else:
                final = _take(next_obs, d)
                if ended and (self.force_withheld or _all_nan(final)):
                    if d > start:
                        ledger.env_steps(i, action[start:d], _take(next_obs, slice(start, d)), reward[start:d],
                                         term[start:d], trunc[start:d])
                    ledger.env_withheld(i, action[d:stop], reward[d:stop], term[d:stop], trunc[d:stop])
                else:
                    ledger.env_steps(i, action[start:stop], _take(next_obs, slice(start, stop)), reward[start:stop],
                                     term[start:stop], trunc[start:stop])
            if ended:
                if stop < T:
                    ledger.env_reset(i, _take(obs, stop))
                else:
                    self.reset_due[i] = True
            start = stop

    def _reset_before_row(self, i):
        """``reset_at_each_iter``: the collector resets every env before each batch, so each row starts with a
        reset the trainer gets (its root observation at t=0). What that reset cut short was never handed out: the
        collector's own first reset, in its constructor (before the first batch), the reset after an episode
        that ended with the last batch, and the observation of a compact_obs step awaiting it. Recorded as
        withheld."""
        ledger = self.ledger
        if self.pending[i] is not None:
            a, rw, te, tr = self.pending[i]
            self.pending[i] = None
            ledger.env_withheld(i, a, rw, te, tr)
        if not self.started[i] or self.reset_due[i]:
            ledger.env_reset_withheld(i)
            self.started[i] = True
        self.reset_due[i] = True

    def finish(self):
        """At the end, what no batch brought: a compact_obs step's observation, and the observation of a reset after an
        env's last step (the collector resets an env as soon as its episode ends): recorded as withheld."""
        for i in range(self.n):
            if self.reset_due[i]:  # the env was reset after its last step, and the run stopped before a batch had it
                self.ledger.env_reset_withheld(i)
            if self.pending[i] is not None:
                a, rw, te, tr = self.pending[i]
                self.pending[i] = None
                self.ledger.env_withheld(i, a, rw, te, tr)


def _take(value, where):
    if isinstance(value, dict):
        return {k: v[where] for k, v in value.items()}
    return value[where]


def _all_nan(value):
    leaves = value.values() if isinstance(value, dict) else (value,)
    return all(np.issubdtype(v.dtype, np.floating) and v.size and np.isnan(v).all() for v in leaves)
