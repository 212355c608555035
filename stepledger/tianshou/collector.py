"""The trainer side for Tianshou: ``LedgerCollector``, a Collector that records what its buffer hands out.

Where it reads (docs/TIANSHOU.md has the reasons):

- the actions the collector *sent* to the vector env (``act_normalized``,
  after ``policy.map_action``), the env ids it stepped and reset, and each
  reset's observation, from its vector env's ``step`` and ``reset`` (the
  collector's own view of its env, ``collector.env``, a thin tap);
- every transition, read back from the replay buffer after each
  ``collect()``, through the buffer's own ``__getitem__``: the path
  ``buffer.sample()`` takes to hand batches to the policy's update. So a
  user's ``on_step_hook``, the buffer's storage (its dtypes), a rebuilt
  ``obs_next`` (``ignore_obs_next=True``) and a shared-memory alias that
  reached the buffer are all on the checked side.

An env's stream is built from the transitions of its sub-buffer, in order:
the reset observation is the ``obs`` of the episode's first transition; a
step's observation is the ``obs`` of the next transition (what the policy
acted on and what training reads as ``obs``), and at the last step before a
reset, where there is no next transition, its ``obs_next``. A reset that no
transition follows (the collector resets an env after its last episode of
an ``n_episode`` collect, and every env again at its end) is recorded from
the observation the vector env returned.

Per ``collect()``, per env, a few calls into the engine (one per episode),
whatever the number of steps; nothing is done per step but noting the
actions sent.
"""

from typing import Any

import warnings

import numpy as np

from tianshou.data import Batch, CachedReplayBuffer, Collector, ReplayBuffer, ReplayBufferManager

from stepledger.format.schema import LINK_ATTR
from stepledger.recording.trainer import TrainerLedger

__all__ = ["LedgerCollector", "LedgerMultiAgentCollector"]

try:
    from tianshou.data import HERReplayBuffer, HERReplayBufferManager
    _VALUE_CHANGING_BUFFERS: tuple[type, ...] = (HERReplayBuffer, HERReplayBufferManager, CachedReplayBuffer)
except ImportError:  # pragma: no cover
    _VALUE_CHANGING_BUFFERS = (CachedReplayBuffer,)


class LedgerCollector(Collector):
    """A Tianshou ``Collector`` that also records the trainer side's ledger.

    Use it in place of ``Collector``, with the env side's
    ``stepledger.tianshou.ledger_env_fns`` in the vector env::

        envs = SubprocVectorEnv(ledger_env_fns(lambda: gym.make("Pendulum-v1"), 8, "ledger"))
        collector = LedgerCollector(policy, envs, VectorReplayBuffer(20000, 8), path="ledger/trainer.npz")
        collector.reset()
        collector.collect(n_step=2000)
        collector.close()  # writes ledger/trainer.npz, then closes the envs (their ledgers)

    The ledger's action is the one the env received, ``policy.map_action(act)``
    (``act_normalized``); the buffer keeps the policy's ``act``. That change is
    Tianshou's on purpose (action scaling and bounding), so it is not compared.

    Args:
        policy, env, buffer, and the rest: as for ``Collector``. The buffer is
            a ``VectorReplayBuffer`` or ``PrioritizedVectorReplayBuffer`` (or
            any ``ReplayBuffer`` for one env) that holds at least one
            ``collect()``'s transitions of each env; ``stack_num`` 1.
        path: the trainer ledger file (a path or an fsspec URL).
        reward_dtype, flush_interval: as for ``TrainerLedger``; the same
            ``reward_dtype`` on the env side.
    """

    def __init__(self, policy, env, buffer=None, *args, path, reward_dtype=np.float32, flush_interval=None,
                 **kwargs):
        super().__init__(policy, env, buffer, *args, **kwargs)
        _check_buffer(self.buffer)
        venv = self.env
        n = len(venv)
        try:
            obs_space, act_space = _spaces(venv)
        except Exception as exc:
            raise ValueError("LedgerCollector: cannot read the envs' spaces from %s: %s"
                             % (type(venv).__name__, exc)) from None
        if obs_space is None or act_space is None:
            raise ValueError("LedgerCollector: the envs of this %s declare no %s; a ledger digests values by their "
                             "space: give the env its observation_space and action_space"
                             % (type(venv).__name__, "observation_space" if obs_space is None else "action_space"))
        self.ledger = TrainerLedger(path, n, obs_space, act_space, reward_dtype=reward_dtype,
                                    flush_interval=flush_interval, owner="LedgerCollector")
        self._book = _Book(self.ledger, self.buffer, n)
        self.env: Any = _VectorTap(venv, self._book)
        _link_dummy_envs(venv, self.ledger)

    @property
    def ledger_path(self):
        """Where the trainer ledger is written."""
        return self.ledger.path

    def collect(self, *args, **kwargs):
        try:
            return super().collect(*args, **kwargs)
        except BaseException:
            self.ledger.interrupted()
            raise
        finally:
            self._book.record()

    def reset_buffer(self, keep_statistics=False):
        self._book.record()
        super().reset_buffer(keep_statistics=keep_statistics)
        self._book.buffer_was_reset()

    def flush(self):
        """Write what is new in the trainer ledger (the transitions of the collects so far); recording goes on."""
        self._book.record()
        self.ledger.flush()

    def close(self):
        """Write the trainer ledger, then close the vector env (which writes the env ledgers)."""
        try:
            self._book.record(final=True)
            self.ledger.close()
        finally:
            super().close()


class _VectorTap:
    """The collector's vector env, forwarded as it is; ``step`` and ``reset`` note what went out and came back."""

    def __init__(self, venv, book):
        self.venv = venv
        self._book = book

    def __getattr__(self, name):
        return getattr(self.venv, name)

    def __len__(self):
        return len(self.venv)

    def step(self, action, id=None):
        ids = self._book.ids(id)
        sent = _snapshot(action)  # before it is sent: an env may edit its action in place
        try:
            result = self.venv.step(action, id)
        except BaseException:
            self._book.ledger.interrupted()
            raise
        self._book.stepped(ids, sent)
        return result

    def reset(self, env_id=None, **kwargs):
        ids = self._book.ids(env_id)
        try:
            obs, info = self.venv.reset(env_id, **kwargs)
        except BaseException:
            self._book.ledger.interrupted()
            raise
        self._book.was_reset(ids, obs)
        return obs, info


class _Book:
    """What the collector sent and got since the last read of the buffer, and each env's unfinished event."""

    def __init__(self, ledger, buffer, n):
        self.ledger, self.buffer, self.n = ledger, buffer, n
        self._seq = 0
        self._steps = []   # (seq, ids, actions sent) per vector step
        self._resets = []  # (seq, ids, [obs of each]) per reset call
        if isinstance(buffer, ReplayBufferManager):
            self._subs = list(buffer.buffers)
            self._offsets = [int(o) for o in buffer._offset]
        else:
            self._subs, self._offsets = [buffer], [0]
        self._last = [int(b._insertion_idx) for b in self._subs]  # each sub-buffer's insertion point, last read
        self._pending_reset = [None] * n  # obs of a reset no transition has followed yet
        self._pending_step: list[Any] = [None] * n   # (global index, action, reward, terminated, truncated) awaiting its obs
        self._ignore_obs_next = not getattr(buffer, "_save_obs_next", True)
        self.broken = False  # a batch the engine could not take (one reward per agent): recording stopped

    def ids(self, id):
        if id is None:
            return np.arange(self.n)
        return np.atleast_1d(np.asarray(id, dtype=np.int64))

    def stepped(self, ids, actions):
        self._steps.append((self._seq, ids, actions))
        self._seq += 1

    def was_reset(self, ids, obs):
        self._resets.append((self._seq, ids, [_snapshot(_row(obs, k)) for k in range(len(ids))]))
        self._seq += 1

    def buffer_was_reset(self):
        self._last = [0] * len(self._subs)

    # ------------------------------------------------------------ reading the buffer back

    def record(self, final=False):
        """Record the transitions that reached the buffer since the last call (and, at the end, what is pending)."""
        steps, resets = self._steps, self._resets
        self._steps, self._resets = [], []
        if self.broken:
            return
        try:
            if steps or resets:
                self._record(steps, resets)
            if final:
                self._record_pending()
        except _TooSmall as exc:  # the buffer overwrote transitions before they could be read back
            self.broken = True
            self.ledger.interrupted()
            warnings.warn(str(exc), RuntimeWarning, stacklevel=3)
        except Exception as exc:  # training never stops because of the ledger: say so once, record no more
            self.broken = True
            self.ledger.interrupted()
            warnings.warn("LedgerCollector: could not record the buffer's transitions (%s); the trainer ledger ends "
                          "here" % (" ".join(str(exc).split()) or type(exc).__name__), RuntimeWarning, stacklevel=3)

    def _record_pending(self):
        """At the end: each env's last step (its obs is its obs_next) and a reset no transition followed."""
        for i in range(self.n):
            if self._pending_step[i] is not None:
                self._finish_step(i)
            if self._pending_reset[i] is not None:
                self.ledger.env_reset(i, self._pending_reset[i])
                self._pending_reset[i] = None

    def _record(self, steps, resets):
        rows, batch, seqs, actions = self._read(steps)
        # each env's events in order: its resets and the runs of its steps between them
        for i in sorted(set(rows) | {int(j) for _, r_ids, _ in resets for j in r_ids}):
            mine, start, m = rows.get(i, (np.zeros(0, np.int64), 0, 0))
            step_seqs = seqs[mine]
            pieces = []
            for seq, r_ids, r_obs in resets:
                where = np.flatnonzero(r_ids == i)
                if len(where):
                    pieces.append((seq, r_obs[int(where[0])]))
            at = 0
            for seq, obs in pieces:
                upto = int(np.searchsorted(step_seqs, seq))
                if upto > at:
                    self._run(i, batch, actions, mine, start, at, upto)
                self._reset(i, obs)
                at = upto
            if m > at:
                self._run(i, batch, actions, mine, start, at, m)

    def _read(self, steps):
        """The transitions the vector steps ``steps`` added to the buffer: ``rows[i] = (mine, start, m)`` for
        env i (its entries in the steps, its first row in ``batch``, how many), the batch read back through the
        buffer (or None), and each step entry's sequence number and action."""
        if steps:
            ids = np.concatenate([s[1] for s in steps])
            seqs = np.concatenate([np.full(len(s[1]), s[0]) for s in steps])
            actions = _concat([s[2] for s in steps])
        else:
            ids, seqs, actions = np.zeros(0, np.int64), np.zeros(0, np.int64), None
        rows, index, total = {}, [], 0
        for i in np.unique(ids):
            i = int(i)
            mine = np.flatnonzero(ids == i)
            sub = 0 if len(self._subs) == 1 else i
            buf, size = self._subs[sub], self._subs[sub].maxsize
            now = int(buf._insertion_idx)
            added = (now - self._last[sub]) % size
            if added == 0 and len(mine) >= size and len(buf) == size:
                added = size
            if len(mine) > size:
                raise _TooSmall("LedgerCollector: env %d added %d transitions in one collect() but its buffer holds %d, "
                                "so it overwrote some before the trainer side could read them back; the trainer "
                                "ledger ends here: give each env's buffer room for a collect's steps"
                                % (i, len(mine), size))
            if added < len(mine):  # steps the collector made but whose transitions never reached the buffer
                mine = mine[:added]
            elif added > len(mine):
                warnings.warn("LedgerCollector: env %d's buffer got %d transitions that did not come through this "
                              "collector; they are not recorded" % (i, added - len(mine)), RuntimeWarning,
                              stacklevel=3)
            self._last[sub] = now
            local = (now - len(mine) + np.arange(len(mine))) % size
            rows[i] = (mine, total, len(mine))
            total += len(mine)
            index.append(self._offsets[sub] + local)
        batch = None
        if index:
            flat = np.concatenate(index)
            if len(flat):
                batch = _transitions(self.buffer[flat], flat)
        return rows, batch, seqs, actions

    def _reset(self, i, obs):
        if self._pending_step[i] is not None:  # the last step before the reset: its obs is its obs_next
            self._finish_step(i)
        if self._pending_reset[i] is not None:  # a reset that no transition followed
            self.ledger.env_reset(i, self._pending_reset[i])
        self._pending_reset[i] = obs

    def _run(self, i, batch, actions, mine, start, a, b):
        """Record env i's steps a .. b-1 (of its m this time): rows start+a .. start+b-1 of the batch read."""
        lo, hi = start + a, start + b
        act = _take(actions, mine[a:b])
        first = _take(batch["obs"], lo)
        if self._pending_reset[i] is not None:
            self.ledger.env_reset(i, first)  # the episode's first transition holds its reset obs
            self._pending_reset[i] = None
        elif self._pending_step[i] is not None:
            self._finish_step(i, _take(batch["obs"], slice(lo, lo + 1)))
        if hi - lo > 1:
            self.ledger.env_steps(i, _take(act, slice(0, hi - lo - 1)), _take(batch["obs"], slice(lo + 1, hi)),
                                  batch["rew"][lo:hi - 1], batch["terminated"][lo:hi - 1],
                                  batch["truncated"][lo:hi - 1])
        k = hi - 1
        self._pending_step[i] = (int(batch["index"][k]), _take(act, slice(hi - lo - 1, hi - lo)),
                                 batch["rew"][k:k + 1], batch["terminated"][k:k + 1], batch["truncated"][k:k + 1])

    def _finish_step(self, i, obs=None):
        """Record env i's pending step with ``obs`` (the next transition's), or else its own obs_next as the
        buffer hands it out now."""
        index, act, rew, term, trunc = self._pending_step[i]
        self._pending_step[i] = None
        if obs is None:
            obs = _plain(self.buffer[np.array([index])].obs_next)
        self.ledger.env_steps(i, act, obs, rew, term, trunc)


class _TooSmall(ValueError):
    """A buffer that cannot hold one collect()'s transitions of an env: the user's to fix (a warning that says how)."""


def _transitions(batch, index):
    """A buffer's batch as plain arrays (a Dict observation as a dict of arrays), with the indices read."""
    return {"obs": _plain(batch.obs), "obs_next": _plain(batch.obs_next), "rew": np.asarray(batch.rew),
            "terminated": np.asarray(batch.terminated), "truncated": np.asarray(batch.truncated),
            "index": index}


def _plain(value):
    if isinstance(value, Batch):
        return {k: _plain(v) for k, v in value.__dict__.items()}
    return value


def _take(value, where):
    if isinstance(value, dict):
        return {k: _take(v, where) for k, v in value.items()}
    return value[where]


def _row(obs, k):
    """Row k of a vector env's batch of observations (an object array of dicts for a Dict space)."""
    return obs[k]


def _snapshot(value):
    """A copy that no later write into shared memory or in place can change."""
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    if isinstance(value, Batch):
        return _snapshot(_plain(value))
    if isinstance(value, np.ndarray) and value.dtype == object:
        return np.array([_snapshot(v) for v in value] + [None], dtype=object)[:-1]
    return np.array(value, copy=True)


def _concat(parts):
    if isinstance(parts[0], dict):
        return {k: _concat([p[k] for p in parts]) for k in parts[0]}
    return np.concatenate([np.asarray(p) for p in parts])


def _check_buffer(buffer):
    if isinstance(buffer, _VALUE_CHANGING_BUFFERS):
        raise ValueError("LedgerCollector: %s changes or moves transitions on its own (relabelled goals, a cache "
                         "of episodes); use a VectorReplayBuffer or PrioritizedVectorReplayBuffer"
                         % type(buffer).__name__)
    if not isinstance(buffer, ReplayBuffer):
        raise ValueError("LedgerCollector: buffer must be a Tianshou ReplayBuffer, got %r" % (buffer,))
    if buffer.stack_num != 1 or getattr(buffer, "_save_only_last_obs", False):
        raise ValueError("LedgerCollector: a buffer with stack_num=%d or save_only_last_obs stacks frames of "
                         "observations on its own; the ledger compares the env's single observations: use "
                         "stack_num=1" % buffer.stack_num)


def _spaces(venv):
    """One env's observation and action spaces, as the outermost wrapper in env_fns gives them. A
    DummyVectorEnv's ``observation_space`` reads the *unwrapped* env's (Tianshou's DummyEnvWorker looks
    attributes up on ``env.unwrapped``), which a FrameStack around the env changes: read its env itself."""
    env = getattr(next(iter(getattr(venv, "workers", ())), None), "env", None)
    if env is not None:
        return env.observation_space, env.action_space
    return venv.observation_space[0], venv.action_space[0]


def _link_dummy_envs(venv, ledger):
    """Tell each env-side ledger of a DummyVectorEnv the run and its position (Tianshou's set_env_attr sets
    attributes on the unwrapped env, which LedgerEnv never sees; workers in other processes are not told)."""
    for i, worker in enumerate(getattr(venv, "workers", ())):
        env = getattr(worker, "env", None)
        if env is not None and hasattr(type(env), LINK_ATTR):
            setattr(env, LINK_ATTR, (ledger.run, i))


class LedgerMultiAgentCollector(LedgerCollector):
    """A ``LedgerCollector`` for Tianshou's multi-agent path: ``PettingZooEnv`` envs, a ``MultiAgentPolicy``
    (``MultiAgentOffPolicyAlgorithm`` / ``MultiAgentOnPolicyAlgorithm``), one stream an agent.

    Each env's transitions are split by agent as Tianshou's ``MARLDispatcher`` splits them for the
    agents' algorithms: agent ``a``'s transitions are those whose ``obs.agent_id`` is ``a``, and its reward
    is column ``agent_idx[a]`` of their ``rew``. Agent ``a``'s stream is then built as ``LedgerCollector``
    builds an env's: its episode's first transition's ``obs`` is its reset, each transition's ``act`` a step
    closed by the ``obs`` of the agent's next transition, and at its last transition before a reset its
    ``obs_next``. Agent ``k`` of ``possible_agents`` in env ``i`` is stream ``i * len(possible_agents) + k``:
    the env side is ``LedgerAECEnv`` in each env (``stepledger.tianshou.ledger_pettingzoo_env_fns``).
    Tianshou's observation ``{"agent_id", "obs", "mask"}`` is recorded as the env gave it,
    ``{"observation": obs, "action_mask": mask}`` (the mask as the env's dtype), where the env's space is a
    Dict of those two.
    """

    def __init__(self, policy, env, buffer=None, *args, path, reward_dtype=np.float32, flush_interval=None,
                 **kwargs):
        Collector.__init__(self, policy, env, buffer, *args, **kwargs)
        _check_buffer(self.buffer)
        venv = self.env
        first = getattr(next(iter(getattr(venv, "workers", ())), None), "env", None)
        agents = list(getattr(first, "agents", None) or venv.get_env_attr("agents", [0])[0])
        obs_space, act_space = _spaces(venv)
        n = len(venv)
        self.agents = agents
        self.ledger = TrainerLedger(path, n * len(agents), obs_space, act_space, reward_dtype=reward_dtype,
                                    flush_interval=flush_interval, owner="LedgerMultiAgentCollector")
        self._book = _AgentBook(self.ledger, self.buffer, n, agents, obs_space)
        self.env = _VectorTap(venv, self._book)


class _AgentBook(_Book):
    """A ``_Book`` whose env streams are split by agent, as MARLDispatcher hands them to the agents' algorithms."""

    def __init__(self, ledger, buffer, n, agents, obs_space):
        super().__init__(ledger, buffer, n)
        self.agents = list(agents)
        self._index = {a: k for k, a in enumerate(self.agents)}
        masked = getattr(obs_space, "spaces", None)
        self._mask_dtype = (masked["action_mask"].dtype if masked is not None and "action_mask" in masked
                            else None)
        m = n * len(self.agents)
        self._in_play = [False] * m
        self._pending_reset = [None] * m
        self._pending_step = [None] * m

    def _stream(self, i, agent_id):
        return i * len(self.agents) + self._index[agent_id.item() if hasattr(agent_id, "item") else agent_id]

    def _env_obs(self, obs, row):
        """Row ``row`` of Tianshou's observations as the env gave it."""
        if self._mask_dtype is None:
            return _take(obs["obs"], row)
        return {"action_mask": np.asarray(_take(obs["mask"], row)).astype(self._mask_dtype),
                "observation": _take(obs["obs"], row)}

    def _record(self, steps, resets):
        rows, batch, seqs, actions = self._read(steps)
        for i in sorted(set(rows) | {int(j) for _, r_ids, _ in resets for j in r_ids}):
            mine, start, m = rows.get(i, (np.zeros(0, np.int64), 0, 0))
            events = [(int(seqs[mine[j]]), 1, j) for j in range(m)]
            for seq, r_ids, r_obs in resets:
                where = np.flatnonzero(r_ids == i)
                if len(where):
                    events.append((seq, 0, r_obs[int(where[0])]))
            for seq, kind, what in sorted(events, key=lambda e: (e[0], e[1])):
                if kind == 0:
                    self._agent_reset(i, what)
                else:
                    self._agent_step(i, batch, _take(actions, slice(int(mine[what]), int(mine[what]) + 1)),
                                     start + what)

    def _agent_reset(self, i, obs):
        """Env i was reset: every agent's last step is closed by its obs_next, and each starts anew."""
        for s in range(i * len(self.agents), (i + 1) * len(self.agents)):
            if self._pending_step[s] is not None:
                self._finish_step(s)
            if self._pending_reset[s] is not None:  # a reset that none of its transitions followed
                self.ledger.env_reset(s, self._pending_reset[s])
                self._pending_reset[s] = None
            self._in_play[s] = False
        s = self._stream(i, obs["agent_id"])
        self._pending_reset[s] = self._env_obs(obs, slice(None))

    def _agent_step(self, i, batch, act, row):
        s = self._stream(i, batch["obs"]["agent_id"][row])
        obs = self._env_obs(batch["obs"], row)
        if self._pending_step[s] is not None:
            self._finish_step(s, _batch_of_one(obs))
        elif not self._in_play[s]:
            self.ledger.env_reset(s, obs)
        self._pending_reset[s] = None
        self._in_play[s] = True
        k = s % len(self.agents)
        self._pending_step[s] = (int(batch["index"][row]), act, batch["rew"][row:row + 1, k],
                                 batch["terminated"][row:row + 1], batch["truncated"][row:row + 1])

    def _finish_step(self, s, obs=None):
        index, act, rew, term, trunc = self._pending_step[s]
        self._pending_step[s] = None
        if obs is None:
            obs = _batch_of_one(self._env_obs(_plain(self.buffer[np.array([index])].obs_next), 0))
        self.ledger.env_steps(s, act, obs, rew, term, trunc)

    def _record_pending(self):
        for s in range(len(self._pending_step)):
            if self._pending_step[s] is not None:
                self._finish_step(s)
            if self._pending_reset[s] is not None:
                self.ledger.env_reset(s, self._pending_reset[s])
                self._pending_reset[s] = None


def _batch_of_one(value):
    if isinstance(value, dict):
        return {k: _batch_of_one(v) for k, v in value.items()}
    return np.asarray(value)[None]
