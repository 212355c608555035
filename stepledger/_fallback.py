"""The pure-Python core: the readable reference for the compiled one.

``_core.pyx`` implements the same names with the same results, bit for bit;
``tests/core/test_core_parity.py`` holds the two to that. Set
``STEPLEDGER_PUREPYTHON=1`` to use this module even where the compiled core is
built.

Digest of a value (see docs/FORMAT.md): BLAKE2b with ``digest_size=8`` over the
concatenated encodings of the value's leaves, each encoded as
``[len(tag)] tag [ndim] dims... data`` where ``tag`` is the dtype's kind and
item size in ASCII (``f4``, ``u1``, ``b1``, ``i8``), ``ndim`` one byte, each dim
an unsigned 64-bit little-endian integer, and ``data`` the leaf's bytes in C
order, little-endian.
"""

import ctypes
import hashlib
import operator
import struct
import time

import numpy as np

from stepledger.format import schema as S

IMPLEMENTATION = "python"

_BUDGET = {"limit": S.DEFAULT_MEMORY_LIMIT, "used": 0, "deadline": float("inf"), "hold": False}


def set_memory_limit(nbytes):
    """Set the bytes of event buffers this process may hold before spilling."""
    _BUDGET["limit"] = int(nbytes)


def memory_limit():
    return _BUDGET["limit"]


def memory_in_use():
    """Bytes of event data held in this process's stream buffers."""
    return _BUDGET["used"]


def account(nbytes):
    """Count ``nbytes`` more (or fewer) of recorded data; True when over the limit."""
    _BUDGET["used"] = max(0, _BUDGET["used"] + int(nbytes))
    return _due()


def set_deadline(when, hold=False):
    """Make recording calls report True from ``when`` (time.monotonic() seconds) on.

    With ``hold``, being over the memory limit does not count until then: a spill
    failed, and the next try waits for the deadline.
    """
    _BUDGET["deadline"] = float(when)
    _BUDGET["hold"] = bool(hold)


def deadline():
    return _BUDGET["deadline"]


def _due():
    """Over the memory limit, or past the deadline: the recordings want attention."""
    if _BUDGET["used"] > _BUDGET["limit"] and not _BUDGET["hold"]:
        return True
    return time.monotonic() >= _BUDGET["deadline"]


def set_memory_in_use(nbytes):
    """Reset the count of recorded bytes, as a forked child does."""
    _BUDGET["used"] = int(nbytes)


def blake2b64(data):
    """The 8-byte BLAKE2b of ``data``, as an unsigned little-endian integer."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=S.DIGEST_SIZE).digest(), "little")


MISSING_DIGEST = blake2b64(S.MISSING_MESSAGE)
INVALID_DIGEST = blake2b64(S.INVALID_MESSAGE)
WITHHELD_DIGEST = blake2b64(S.WITHHELD_MESSAGE)


def dtype_tag(dtype):
    """The ASCII tag of a dtype in a leaf header: kind letter and item size."""
    dtype = np.dtype(dtype)
    return ("%s%d" % (dtype.kind, dtype.itemsize)).encode("ascii")


def leaf_header(tag, shape):
    """The header of one leaf: tag length, tag, ndim, dims as <u8."""
    return bytes((len(tag),)) + tag + bytes((len(shape),)) + struct.pack("<%dQ" % len(shape), *shape)


def encode_leaves(leaves):
    """The message a value's digest is taken over: each leaf's header, then its bytes."""
    parts = []
    for arr in leaves:
        arr = np.asarray(arr)
        parts.append(leaf_header(dtype_tag(arr.dtype), arr.shape))
        parts.append(arr.tobytes(order="C"))
    return b"".join(parts)


def decode_leaves(data):
    """The leaves of an encoded value (encode_leaves' inverse); ValueError if it is not one."""
    try:
        return _decode_leaves(memoryview(bytes(data)))
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise ValueError("not an encoded value (%s)" % exc) from None


def _decode_leaves(data):
    out, pos = [], 0
    while pos < len(data):
        n = data[pos]
        tag = bytes(data[pos + 1: pos + 1 + n]).decode("ascii")
        pos += 1 + n
        ndim = data[pos]
        shape = struct.unpack_from("<%dQ" % ndim, data, pos + 1)
        pos += 1 + 8 * ndim
        dtype = canonical_tag_dtype(tag)
        size = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        if pos + size > len(data):
            raise ValueError("an encoded value ends early")
        out.append(np.frombuffer(data[pos: pos + size], dtype=dtype).reshape(shape))
        pos += size
    return out


def canonical_tag_dtype(tag):
    """The little-endian dtype of a leaf header's tag (``f4``, ``u1``, ``b1``...)."""
    kind, size = tag[0], int(tag[1:])
    if kind not in "biufc" or size not in (1, 2, 4, 8, 16):
        raise ValueError("not a leaf dtype tag: %r" % tag)
    dtype = np.dtype("?" if kind == "b" else "%s%d" % (kind, size))
    return dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype


def _update(h, arr, row_shape, data):
    h.update(leaf_header(dtype_tag(arr.dtype), row_shape))
    h.update(data)


def digest_leaves(leaves):
    """Digest of one value given as its cast leaves (canonical, C-ordered arrays)."""
    if leaves is None:
        return INVALID_DIGEST
    h = hashlib.blake2b(digest_size=S.DIGEST_SIZE)
    for arr in leaves:
        arr = np.asarray(arr)  # not ascontiguousarray: it turns a 0-d leaf into shape (1,)
        _update(h, arr, arr.shape, arr.tobytes(order="C"))
    return int.from_bytes(h.digest(), "little")


def digest_rows(leaves, out):
    """Digest each row of a batch: ``leaves`` are arrays of shape (n, ...).

    Row ``i`` digests like ``digest_leaves([leaf[i] for leaf in leaves])``.
    """
    leaves = [np.ascontiguousarray(a) for a in leaves]
    n = out.shape[0]
    for i in range(n):
        h = hashlib.blake2b(digest_size=S.DIGEST_SIZE)
        for arr in leaves:
            _update(h, arr, arr.shape[1:], arr[i].tobytes())
        out[i] = int.from_bytes(h.digest(), "little")
    return out


def _as_double(x):
    """``x`` as a C double the way CPython's PyFloat_AsDouble takes it.

    Unlike ``float(x)``, a str, bytes or other buffer is not parsed: only
    ``__float__`` and then ``__index__`` count.
    """
    if isinstance(x, float):
        return float(x)
    cls = type(x)
    if hasattr(cls, "__float__"):
        return float(x)
    if hasattr(cls, "__index__"):
        return float(operator.index(x))
    raise TypeError("must be real number, not %s" % cls.__name__)


def reward_bits(reward, is_f32):
    """The raw bits of a reward cast to the reward dtype, as an unsigned integer.

    Goes through a C double the way the compiled core does, so that a
    float64 or Python float rounds once, to nearest even.
    """
    try:
        value = _as_double(reward)
    except Exception:  # not a real number, or too large for a double
        return INVALID_DIGEST
    if is_f32:
        # a C (float) cast, as the compiled core does: no warning on overflow to inf
        return ctypes.c_uint32.from_buffer(ctypes.c_float(value)).value
    return ctypes.c_uint64.from_buffer(ctypes.c_double(value)).value


def reward_bits_array(rewards, is_f32):
    rewards = np.asarray(rewards, dtype=np.float64)
    if is_f32:
        with np.errstate(over="ignore"):
            rewards = rewards.astype(np.float32)
        return rewards.view(np.uint32).astype(np.uint64)
    return rewards.view(np.uint64).copy()


class StreamBuffer:
    """Growable columns for one stream of events (the reference implementation)."""

    def __init__(self, capacity=1024):
        self._cols = {name: np.empty(max(int(capacity), 16), dtype=dt) for name, dt in S.EVENT_COLUMNS}
        self._size = 0

    def __len__(self):
        return self._size

    @property
    def nbytes(self):
        return self._size * S.BYTES_PER_EVENT

    def append(self, kind, h_obs, h_act, h_rew, terminated, truncated):
        """Append one event. Returns True when the process is over its memory limit."""
        n = self._size
        if n == self._cols["kind"].shape[0]:
            for name in self._cols:
                old = self._cols[name]
                new = np.empty(2 * n, dtype=old.dtype)
                new[:n] = old
                self._cols[name] = new
        c = self._cols
        c["kind"][n] = kind
        c["h_obs"][n] = h_obs
        c["h_act"][n] = h_act
        c["h_rew"][n] = h_rew
        c["terminated"][n] = bool(terminated)
        c["truncated"][n] = bool(truncated) and not bool(terminated)
        self._size = n + 1
        _BUDGET["used"] += S.BYTES_PER_EVENT
        return _due()

    def columns(self):
        """Copies of the recorded columns, keyed by column name (of one length: the events whole when called)."""
        n = self._size  # another thread may append meanwhile: rows below n are complete in every column
        return {name: arr[:n].copy() for name, arr in list(self._cols.items())}

    def views(self):
        """Read-only views of the recorded columns, valid until the buffer next changes."""
        out = {}
        for name, arr in self._cols.items():
            view = arr[: self._size]
            view.flags.writeable = False
            out[name] = view
        return out

    def clear(self):
        _BUDGET["used"] = max(0, _BUDGET["used"] - self._size * S.BYTES_PER_EVENT)
        self._size = 0

    def release(self):
        """Clear and give back this buffer's share of the process budget."""
        self.clear()

    def drop_front(self, k):
        """Forget the first ``k`` events (a segment holds them); the later ones move to the front."""
        k = int(k)
        if k <= 0:
            return
        if k > self._size:
            raise ValueError("drop_front: %d events asked, %d held" % (k, self._size))
        rest = self._size - k
        for arr in self._cols.values():
            arr[:rest] = arr[k:self._size].copy()
        self._size = rest
        _BUDGET["used"] = max(0, _BUDGET["used"] - k * S.BYTES_PER_EVENT)


def _digest_value(layout, value):
    try:
        leaves = layout.cast(value)
    except Exception:
        return INVALID_DIGEST
    return digest_leaves(leaves)


class EventRecorder:
    """Records one env's events into a StreamBuffer: the env side's hot path.

    ``obs_layout`` and ``act_layout`` are ``spaces.LeafLayout`` objects; a
    recorder digests values cast to them. ``keep`` is called with the cast
    leaves of each event when values are kept, else it is None. The recorder
    also knows the last event and its position, from which ``token()``
    builds the live-mode token.
    """

    def __init__(self, buffer, obs_layout, act_layout, reward_is_f32, keep=None):
        self.buffer = buffer
        self.obs_layout = obs_layout
        self.act_layout = act_layout
        self.reward_is_f32 = bool(reward_is_f32)
        self.keep = keep
        self.counter, self.episode, self.step_in_episode = 0, -1, 0
        self._last = (S.KIND_RESET, 0, 0, 0, False, False)

    def _record(self, kind, h_obs, h_act, h_rew, te, tr):
        te, tr = bool(te), bool(tr)
        over = self.buffer.append(kind, h_obs, h_act, h_rew, te, tr)
        self._last = (kind, h_obs, h_act, h_rew, te, tr and not te)
        self.counter += 1
        if kind == S.KIND_RESET:
            self.episode, self.step_in_episode = self.episode + 1, 0
        else:
            self.step_in_episode += 1
        return over

    def reset(self, obs):
        if self.keep is not None:
            return self._keep_event(S.KIND_RESET, None, obs, 0.0, False, False)
        return self._record(S.KIND_RESET, _digest_value(self.obs_layout, obs), S.NO_DIGEST,
                            reward_bits(0.0, self.reward_is_f32), False, False)

    def take_action(self, action, /):
        """Note the action of the step under way as the env receives it, before the env (which
        may change its array in place) sees it. step_taken() then records the step."""
        if self.keep is not None:
            leaves = _cast_or_none(self.act_layout, action)
            self._act = None if leaves is None else [np.array(leaf, copy=True) for leaf in leaves]
        else:
            self._act = _digest_value(self.act_layout, action)

    def step_taken(self, obs, reward, terminated, truncated, /):
        """Record the step whose action take_action() noted."""
        if self.keep is not None:
            return self._keep_event(S.KIND_STEP, self._act, obs, reward, terminated, truncated, action_cast=True)
        return self._record(S.KIND_STEP, _digest_value(self.obs_layout, obs), self._act,
                            reward_bits(reward, self.reward_is_f32), terminated, truncated)

    def step(self, action, obs, reward, terminated, truncated):
        """Record a step whose action is still as the env received it."""
        self.take_action(action)
        return self.step_taken(obs, reward, terminated, truncated)

    def _keep_event(self, kind, action, obs, reward, terminated, truncated, action_cast=False):
        # Everything that can raise comes before keep(), so that a failed
        # event leaves kept values and events aligned. ``action_cast``: the
        # action is already its cast leaves (copied by take_action()).
        te, tr = bool(terminated), bool(truncated)
        obs_leaves = _cast_or_none(self.obs_layout, obs)
        if kind == S.KIND_RESET:
            act_leaves = None
        else:
            act_leaves = action if action_cast else _cast_or_none(self.act_layout, action)
        h_act = S.NO_DIGEST if kind == S.KIND_RESET else digest_leaves(act_leaves)
        h_obs = digest_leaves(obs_leaves)
        over = self.keep(obs_leaves, act_leaves)
        return self._record(kind, h_obs, h_act, reward_bits(reward, self.reward_is_f32), te, tr) or bool(over)

    def token(self, index):
        """The live token of the last event, for env ``index`` (bytes)."""
        kind, h_obs, h_act, h_rew, te, tr = self._last
        return struct.pack(S.TOKEN_FORMAT, S.TOKEN_VERSION, index, self.counter - 1, self.episode,
                           self.step_in_episode, kind, h_obs, h_act, h_rew, _token_flags(te, tr))


def _token_flags(terminated, truncated):
    """The flags byte of a live token."""
    return (S.TOKEN_TERMINATED if terminated else 0) | (S.TOKEN_TRUNCATED if truncated else 0)


def _cast_or_none(layout, value):
    try:
        return layout.cast(value)
    except Exception:
        return None


def first_difference(a, b, start=0):
    """Index of the first event where two sets of event columns differ, or -1.

    ``a`` and ``b`` are dicts of equal-length arrays keyed by event column
    name; the search starts at ``start``.
    """
    n = len(a["kind"])
    for name in S.EVENT_COLUMN_NAMES:
        if len(b[name]) != n:
            raise ValueError("columns of different length")
    best = -1
    for name in S.EVENT_COLUMN_NAMES:
        stop = n if best < 0 else best
        if stop <= start:
            continue
        diff = np.flatnonzero(a[name][start:stop] != b[name][start:stop])
        if diff.size:
            best = start + int(diff[0])
    return best


class VectorRecorder:
    """Records the events of a vector env's envs, one call per vector step.

    The reference for the compiled VectorRecorder: same methods, same events.
    """

    def __init__(self, buffers, obs_layout, act_layout, reward_is_f32, stream_ids=None):
        self.buffers = list(buffers)
        self.n = len(self.buffers)
        # the env index each env's tokens must name: its own, or the stream_ids given (one per env)
        self.stream_ids = np.array(range(self.n) if stream_ids is None else stream_ids, dtype=np.int64).reshape(-1)
        if self.stream_ids.shape[0] != self.n:
            raise ValueError("stream_ids: %d ids for %d envs" % (self.stream_ids.shape[0], self.n))
        self.obs_layout = obs_layout
        self.act_layout = act_layout
        self.is_f32 = bool(reward_is_f32)
        self.pending = np.zeros(self.n, dtype=np.bool_)
        self.last_obs = np.zeros(self.n, dtype=np.uint64)
        self.last_act = np.zeros(self.n, dtype=np.uint64)
        self.counts = np.zeros(self.n, dtype=np.int64)
        # this call's events per env, for the live check
        self._events: list[list[tuple[int, int, int, int, bool, bool]]] = [[] for _ in range(self.n)]
        self.token_seen = np.zeros(self.n, dtype=np.bool_)
        self.token_episode = np.full(self.n, -1, dtype=np.int64)
        self.token_step = np.zeros(self.n, dtype=np.int64)

    def _push(self, i, kind, h_obs, h_act, h_rew, te, tr):
        te, tr = bool(te), bool(tr)
        self._events[i].append((kind, int(h_obs), int(h_act), int(h_rew), te, tr and not te))
        self.counts[i] += 1
        return self.buffers[i].append(kind, h_obs, h_act, h_rew, te, tr)

    def _new_call(self):
        self._events = [[] for _ in range(self.n)]

    def event(self, i, j):
        """Env i's j-th event of the latest call: (kind, h_obs, h_act, h_rew, terminated, truncated)."""
        return self._events[i][j]

    def events_in_call(self, i):
        return len(self._events[i])

    def check(self, single, first=None, second=None):
        """Check the live tokens of the latest call's events (see the compiled core)."""
        problems = []
        for i in range(self.n):
            c = len(self._events[i])
            for j in range(c):
                src = single if c == 1 else (first if j == 0 else second)
                tok = None if src is None else src[i]
                if type(tok) is not bytes or len(tok) != S.TOKEN_SIZE:
                    problems.append((i, j, tok if type(tok) is bytes else None))
                    continue
                version, index, counter, episode, step, kind, h_obs, h_act, h_rew, flags = struct.unpack(
                    S.TOKEN_FORMAT, tok)
                ek, eo, ea, er, ete, etr = self._events[i][j]
                if (version != S.TOKEN_VERSION or index != self.stream_ids[i] or counter != self.counts[i] - c + j or kind != ek
                        or h_obs != eo or h_act != ea or h_rew != er or flags != _token_flags(ete, etr)):
                    problems.append((i, j, tok))
                else:
                    self.token_seen[i] = True
                    self.token_episode[i], self.token_step[i] = episode, step
        return problems

    def tokens(self, dicts, key, pop):
        """The token under ``key`` in each of n dicts (None where absent), popped if asked."""
        out = [None] * self.n
        for i in range(min(self.n, len(dicts))):
            d = dicts[i]
            if type(d) is dict:
                out[i] = d.pop(key, None) if pop else d.get(key)
        return out

    def clear_buffers(self):
        for b in self.buffers:
            b.clear()

    def digest_obs(self, value):
        return _digest_value(self.obs_layout, value)

    def _rows(self, layout, batch, out):
        """Digest each row of ``batch`` into ``out`` (one row per element of out)."""
        n = len(out)
        if layout.variable:  # values of varying size: each row's value cast and digested on its own
            for i, leaves in enumerate(layout.cast_each(batch, n)):
                out[i] = digest_leaves(leaves)
            return
        try:
            leaves = layout.cast_rows(batch, n)
        except Exception:
            out[:] = INVALID_DIGEST
            return
        digest_rows(leaves, out)

    def _flags(self, arr, what):
        """A bool array of one flag per env, checked for its length."""
        arr = np.asarray(arr, dtype=np.bool_).reshape(-1)
        if arr.shape[0] != self.n:
            raise ValueError("expected %d values of %s, got %d" % (self.n, what, arr.shape[0]))
        return arr

    def _rewards(self, rewards):
        rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
        if rewards.shape[0] != self.n:
            raise ValueError("expected %d rewards, got %d" % (self.n, rewards.shape[0]))
        return rewards

    def ended(self, a, b=None):
        """Indices of the envs where ``a`` or ``b`` is true (b may be None)."""
        a = self._flags(a, "flags")
        if b is not None:
            a = a | self._flags(b, "flags")
        return [int(i) for i in np.flatnonzero(a)]

    def reset(self, obs, mask=None):
        """Record a reset for every env, or for the envs where ``mask`` is true."""
        if mask is not None:
            mask = self._flags(mask, "reset_mask")
        self._rows(self.obs_layout, obs, self.last_obs)
        self._new_call()
        zero = reward_bits(0.0, self.is_f32)
        over = False
        for i in range(self.n):
            if mask is None or mask[i]:
                over |= self._push(i, S.KIND_RESET, int(self.last_obs[i]), S.NO_DIGEST, zero, False, False)
                self.pending[i] = False
        return over

    def actions(self, actions):
        """Digest the actions sent to the envs, before they are handed over.

        ``actions`` is a batch in Gymnasium's layout: one array per space leaf,
        with a leading env dimension (a dict of arrays for a Dict space).
        """
        self._rows(self.act_layout, actions, self.last_act)

    def actions_per_env(self, actions):
        """Digest the actions sent to the envs, given as one value per env.

        SB3's layout: env i is sent ``actions[i]`` (a row of an array, or the
        i-th dict or tuple of a list), and that value is digested as the env
        will receive it. An env whose value cannot be taken is recorded as
        invalid; the others keep their own digests.
        """
        out = self.last_act
        for i in range(self.n):
            try:
                value = actions[i]
            except Exception:
                out[i] = INVALID_DIGEST
                continue
            out[i] = _digest_value(self.act_layout, value)

    def step_next(self, obs, rewards, terminated, truncated):
        """A vector step under next-step autoreset: an env whose episode ended at
        its previous step is reset now, and its action is not recorded."""
        terminated = self._flags(terminated, "terminated")
        truncated = self._flags(truncated, "truncated")
        rewards = self._rewards(rewards)
        self._rows(self.obs_layout, obs, self.last_obs)
        self._new_call()
        over = False
        for i in range(self.n):
            bits = reward_bits(rewards[i], self.is_f32)
            te, tr = bool(terminated[i]), bool(truncated[i])
            if self.pending[i]:
                self.last_act[i] = S.NO_DIGEST
                over |= self._push(i, S.KIND_RESET, int(self.last_obs[i]), S.NO_DIGEST, bits, te, tr)
                self.pending[i] = False
            else:
                over |= self._push(i, S.KIND_STEP, int(self.last_obs[i]), int(self.last_act[i]), bits, te, tr)
                self.pending[i] = te or tr
        return over

    def step_same(self, obs, rewards, finals):
        """A vector step under same-step autoreset (Gymnasium SAME_STEP, SB3).

        ``finals`` maps each env whose episode ended to (final obs digest,
        terminated, truncated); those envs record the step with the final obs,
        then a reset with the returned obs. The others record a step with
        both flags false.
        """
        rewards = self._rewards(rewards)
        self._rows(self.obs_layout, obs, self.last_obs)
        self._new_call()
        zero = reward_bits(0.0, self.is_f32)
        over = False
        for i in range(self.n):
            bits = reward_bits(rewards[i], self.is_f32)
            if i in finals:
                h_final, te, tr = finals[i]
                over |= self._push(i, S.KIND_STEP, h_final, int(self.last_act[i]), bits, te, tr)
                over |= self._push(i, S.KIND_RESET, int(self.last_obs[i]), S.NO_DIGEST, zero, False, False)
            else:
                over |= self._push(i, S.KIND_STEP, int(self.last_obs[i]), int(self.last_act[i]), bits, False, False)
        return over

    def step_next_results(self, results):
        """``step_next`` of a vector env's step results, the (obs, rewards, terminated,
        truncated, info) it returned, in one call (the trainer side's hot path)."""
        obs, rewards, terminated, truncated, _ = results
        return self.step_next(obs, rewards, terminated, truncated)

    def step_same_results(self, results):
        """``step_same`` of a vector env's step results, the (obs, rewards, terminated, truncated,
        info) it returned, when no env's episode ended; None, with nothing recorded, when one did
        (its final observation is for ``step_same`` with its finals)."""
        obs, rewards, terminated, truncated, _ = results
        if (self._flags(terminated, "terminated") | self._flags(truncated, "truncated")).any():
            return None
        return self.step_same(obs, rewards, {})

    def env_reset(self, i, obs):
        """Record a reset of env i that returned ``obs`` (None: withheld from the trainer, WITHHELD_DIGEST)."""
        if not 0 <= i < self.n:
            raise IndexError("env %d is not one of the %d envs" % (i, self.n))
        h = WITHHELD_DIGEST if obs is None else _digest_value(self.obs_layout, obs)
        self.last_obs[i], self.pending[i] = h, False
        self.counts[i] += 1
        return self.buffers[i].append(S.KIND_RESET, h, S.NO_DIGEST, reward_bits(0.0, self.is_f32), False, False)

    def env_steps(self, i, actions, obs, rewards, terminated, truncated):
        """Record m steps of env i: ``actions`` and ``obs`` batched over the m steps
        (a leading axis of m), ``rewards``, ``terminated`` and ``truncated`` of m each;
        ``obs`` None: the library withheld the observations (each gets WITHHELD_DIGEST)."""
        rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
        m = rewards.shape[0]
        if not 0 <= i < self.n:
            raise IndexError("env %d is not one of the %d envs" % (i, self.n))
        flags = []
        for arr, what in ((terminated, "terminated"), (truncated, "truncated")):
            arr = np.asarray(arr, dtype=np.bool_).reshape(-1)
            if arr.shape[0] != m:
                raise ValueError("expected %d values of %s, got %d" % (m, what, arr.shape[0]))
            flags.append(arr)
        if m == 0:
            return _due()
        h_act, h_obs = np.empty(m, dtype=np.uint64), np.empty(m, dtype=np.uint64)
        self._rows(self.act_layout, actions, h_act)
        if obs is None:
            h_obs.fill(WITHHELD_DIGEST)
        else:
            self._rows(self.obs_layout, obs, h_obs)
        over = False
        for k in range(m):
            over |= self.buffers[i].append(S.KIND_STEP, int(h_obs[k]), int(h_act[k]),
                                           reward_bits(rewards[k], self.is_f32), flags[0][k], flags[1][k])
        self.last_obs[i] = h_obs[m - 1]
        self.counts[i] += m
        return over
