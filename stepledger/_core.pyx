# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled core: digests, stream buffers and recorders.

Same names and results as ``_fallback.py``, which is the readable reference;
see that module and docs/FORMAT.md for the digest's definition.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_AsDouble
from cpython.long cimport PyLong_AsLongLong
from cpython.object cimport PyObject_IsTrue
from cpython.ref cimport Py_INCREF
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.math cimport INFINITY
from libc.string cimport memcpy, memmove, memset
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

cimport numpy as cnp
import math

import numpy as np

from stepledger.format import schema as S

cnp.import_array()

cdef extern from "_blake2b.h":
    ctypedef struct sl_blake2b_state:
        pass
    void sl_blake2b_init(sl_blake2b_state *S, size_t outlen) nogil
    void sl_blake2b_update(sl_blake2b_state *S, const void *data, size_t length) nogil
    uint64_t sl_blake2b_final64(sl_blake2b_state *S) nogil
    int sl_have_avx2() nogil
    int sl_have_avx512() nogil
    void sl_blake2b64_x4(const uint8_t **msg, size_t length, uint64_t *out) nogil
    void sl_blake2b64_x8(const uint8_t *base, size_t stride, size_t length, uint64_t *out) nogil
    void sl_blake2b64_x4_laid(const uint8_t *base, size_t stride, size_t length, uint64_t *out) nogil
    void sl_blake2b64_x2_padded(const uint8_t *b0, size_t len0, const uint8_t *b1, size_t len1,
                                uint64_t *out) nogil

IMPLEMENTATION = "cython"
cdef bint _HAVE_AVX2 = sl_have_avx2()
cdef bint _HAVE_AVX512 = sl_have_avx512()

cdef Py_ssize_t _used = 0
cdef Py_ssize_t _limit = S.DEFAULT_MEMORY_LIMIT
# When the process's recordings next want attention (a periodic spill), on the clock of
# time.monotonic(); and whether the memory limit is held off until then (a spill failed).
cdef double _deadline = INFINITY
cdef bint _hold = False
cdef Py_ssize_t BYTES_PER_EVENT = S.BYTES_PER_EVENT
cdef uint8_t KIND_RESET = S.KIND_RESET
cdef uint8_t KIND_STEP = S.KIND_STEP
cdef uint64_t NO_DIGEST = S.NO_DIGEST
cdef uint8_t TOKEN_VERSION = S.TOKEN_VERSION
# The live token's layout: compile-time constants that setup.py writes into _layout.pxi from
# format/schema.py's TOKEN_FIELDS (T_* where each field starts, W_* the widths, T_SIZE its size, F_* the
# flag bits), so that the hot path reads tokens at constant offsets. A core built before the schema
# changed refuses to load (core.py then takes the pure-Python core).
include "_layout.pxi"
COMPILED_LAYOUT = {"size": T_SIZE, "offsets": {"version": T_VERSION, "index": T_INDEX, "counter": T_COUNTER,
                                               "episode": T_EPISODE, "step": T_STEP, "kind": T_KIND,
                                               "h_obs": T_H_OBS, "h_act": T_H_ACT, "h_rew": T_H_REW,
                                               "flags": T_FLAGS},
                   "widths": {"version": W_VERSION, "index": W_INDEX, "counter": W_COUNTER,
                              "episode": W_EPISODE, "step": W_STEP, "kind": W_KIND,
                              "h_obs": W_H_OBS, "h_act": W_H_ACT, "h_rew": W_H_REW, "flags": W_FLAGS},
                   "terminated": F_TERMINATED, "truncated": F_TRUNCATED}
if COMPILED_LAYOUT != {"size": S.TOKEN_SIZE, "offsets": S.TOKEN_OFFSETS, "widths": S.TOKEN_WIDTHS,
                       "terminated": S.TOKEN_TERMINATED, "truncated": S.TOKEN_TRUNCATED}:
    raise ImportError("stepledger._core was built for another token layout than _schema.py's: rebuild it")


def set_memory_limit(nbytes):
    """Set the bytes of event buffers this process may hold before spilling."""
    global _limit
    _limit = int(nbytes)


def memory_limit():
    return _limit


def memory_in_use():
    """Bytes of event data held in this process's stream buffers."""
    return _used


def account(nbytes):
    """Count ``nbytes`` more (or fewer) of recorded data; True when over the limit."""
    global _used
    _used = max(0, _used + int(nbytes))
    return _due()


def set_deadline(when, hold=False):
    """Make recording calls report True from ``when`` (time.monotonic() seconds) on.

    With ``hold``, being over the memory limit does not count until then: a spill
    failed, and the next try waits for the deadline.
    """
    global _deadline, _hold
    _deadline = float(when)
    _hold = bool(hold)


def deadline():
    return _deadline


cdef inline bint _due() noexcept nogil:
    """Over the memory limit, or past the deadline: the recordings want attention."""
    cdef timespec ts
    if _used > _limit and not _hold:
        return True
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + 1e-9 * ts.tv_nsec >= _deadline


def set_memory_in_use(nbytes):
    """Reset the count of recorded bytes, as a forked child does."""
    global _used
    _used = int(nbytes)


cdef uint64_t _hash_bytes(const uint8_t *data, size_t n) nogil:
    cdef sl_blake2b_state st
    sl_blake2b_init(&st, 8)
    sl_blake2b_update(&st, data, n)
    return sl_blake2b_final64(&st)


def blake2b64(data):
    """The 8-byte BLAKE2b of ``data``, as an unsigned little-endian integer."""
    cdef const uint8_t[::1] view = memoryview(data).cast("B")
    cdef size_t n = view.shape[0]
    cdef uint64_t h
    if n == 0:
        return _hash_bytes(NULL, 0)
    with nogil:
        h = _hash_bytes(&view[0], n)
    return h


MISSING_DIGEST = blake2b64(S.MISSING_MESSAGE)
INVALID_DIGEST = blake2b64(S.INVALID_MESSAGE)
WITHHELD_DIGEST = blake2b64(S.WITHHELD_MESSAGE)
cdef uint64_t C_INVALID = INVALID_DIGEST
cdef object _float64 = np.float64  # a float subclass: its value is read without a call


cdef inline void _update_header(sl_blake2b_state *st, cnp.ndarray arr, int skip) noexcept:
    """Feed a leaf header for ``arr``'s shape without its first ``skip`` dims."""
    cdef uint8_t buf[4 + 1 + 8 * 64]
    sl_blake2b_update(st, buf, _header_bytes(arr, skip, buf))


cdef inline cnp.ndarray _contiguous(object arr):
    """``arr`` as a C-ordered ndarray, keeping its shape (also a 0-d one)."""
    cdef cnp.ndarray a
    if not isinstance(arr, np.ndarray):
        arr = np.asarray(arr)
    a = <cnp.ndarray>arr
    if not cnp.PyArray_IS_C_CONTIGUOUS(a):
        # ascontiguousarray never sees a 0-d array here: those are contiguous.
        a = np.ascontiguousarray(a)
    return a


def digest_leaves(leaves):
    """Digest of one value given as its cast leaves (canonical, C-ordered arrays)."""
    if leaves is None:
        return INVALID_DIGEST
    return _digest_leaves(leaves)


cdef uint64_t _digest_leaves(list leaves) except? 0:
    cdef sl_blake2b_state st
    cdef cnp.ndarray a
    sl_blake2b_init(&st, 8)
    for obj in leaves:
        a = _contiguous(obj)
        _update_header(&st, a, 0)
        sl_blake2b_update(&st, cnp.PyArray_DATA(a), <size_t>cnp.PyArray_NBYTES(a))
    return sl_blake2b_final64(&st)


def digest_rows(leaves, cnp.ndarray out):
    """Digest each row of a batch: ``leaves`` are arrays of shape (n, ...)."""
    _digest_rows(list(leaves), <uint64_t *>cnp.PyArray_DATA(out), cnp.PyArray_DIMS(out)[0])
    return out


cdef Py_ssize_t _header_bytes(cnp.ndarray arr, int skip, uint8_t *buf) noexcept:
    """Write the leaf header of ``arr`` without its first ``skip`` dims into buf."""
    cdef cnp.dtype d = <cnp.dtype>cnp.PyArray_DESCR(arr)
    cdef int itemsize = <int>cnp.PyArray_ITEMSIZE(arr)
    cdef int ndim = cnp.PyArray_NDIM(arr) - skip
    cdef cnp.npy_intp *dims = cnp.PyArray_DIMS(arr)
    cdef Py_ssize_t pos = 1
    cdef int i, b
    cdef uint64_t v
    buf[pos] = <uint8_t>d.kind
    pos += 1
    if itemsize >= 10:
        buf[pos] = <uint8_t>(48 + itemsize // 10)
        pos += 1
    buf[pos] = <uint8_t>(48 + itemsize % 10)
    pos += 1
    buf[0] = <uint8_t>(pos - 1)
    buf[pos] = <uint8_t>ndim
    pos += 1
    for i in range(ndim):
        v = <uint64_t>dims[i + skip]
        for b in range(8):
            buf[pos] = <uint8_t>(v >> (8 * b))
            pos += 1
    return pos


cdef enum:
    _STACK_SCRATCH = 8192  # bytes of rows laid out on the stack; more are allocated
    _NOGIL_BYTES = 65536   # below this the GIL is kept: releasing it costs more than the digests


cdef struct _Rows:
    # the rows of a batch to digest: leaf j's row k is rowbytes[j] bytes at data[j] + k * rowbytes[j]
    Py_ssize_t n
    Py_ssize_t nleaves
    const uint8_t *data[64]
    size_t rowbytes[64]
    uint8_t headers[64][4 + 1 + 8 * 32]
    Py_ssize_t hlen[64]
    size_t msg_len


# One scratch buffer for batches too large for the stack, kept between calls: a buffer malloc'ed afresh
# for each call of a megabyte or more comes from new pages (glibc maps large blocks, or the heap has
# shrunk), and faulting them in cost several times the digests (8 frames of 224x224x3: 556 page faults,
# 1.3 ms a call against 0.3 ms with the pages kept). Taken and given back with the GIL held; a thread
# that finds it taken (another is digesting with the GIL released) allocates its own.
cdef uint8_t *_scratch_kept = NULL
cdef size_t _scratch_kept_size = 0
cdef enum:
    _SCRATCH_KEEP_MAX = 64 << 20  # a larger one is given back to the system after its call


cdef uint8_t *_take_scratch(size_t need, size_t *size):
    global _scratch_kept, _scratch_kept_size
    cdef uint8_t *p
    if _scratch_kept != NULL and _scratch_kept_size >= need:
        p, size[0] = _scratch_kept, _scratch_kept_size
        _scratch_kept, _scratch_kept_size = NULL, 0
        return p
    size[0] = need
    return <uint8_t *>malloc(need)


cdef void _give_scratch(uint8_t *p, size_t size):
    global _scratch_kept, _scratch_kept_size
    if p == NULL:
        return
    if size > _SCRATCH_KEEP_MAX or (_scratch_kept != NULL and _scratch_kept_size >= size):
        free(p)
        return
    if _scratch_kept != NULL:
        free(_scratch_kept)
    _scratch_kept, _scratch_kept_size = p, size


cdef Py_ssize_t _digest_laid(_Rows *r, uint8_t *scratch, size_t stride, uint64_t *out, bint wide,
                             bint lanes4) noexcept nogil:
    """Lay the rows' messages out side by side, each padded with zeros to ``stride``, and digest
    them eight (AVX-512) or four (AVX2) at a time. Returns how many rows were digested."""
    cdef Py_ssize_t i = 0, j, k, pos
    cdef const uint8_t *lanes[4]
    for k in range(r.n):
        pos = k * stride
        for j in range(r.nleaves):
            memcpy(scratch + pos, r.headers[j], r.hlen[j])
            pos += r.hlen[j]
            memcpy(scratch + pos, r.data[j] + k * r.rowbytes[j], r.rowbytes[j])
            pos += r.rowbytes[j]
        memset(scratch + pos, 0, stride - (pos - k * stride))
    if wide:
        while i + 8 <= r.n:
            sl_blake2b64_x8(scratch + i * stride, stride, r.msg_len, out + i)
            i += 8
    if lanes4:
        while i + 4 <= r.n:
            for k in range(4):
                lanes[k] = scratch + (i + k) * stride
            sl_blake2b64_x4(lanes, r.msg_len, out + i)
            i += 4
    return i


cdef void _digest_each(_Rows *r, Py_ssize_t i, uint64_t *out) noexcept nogil:
    """Digest rows i .. n-1 one at a time."""
    cdef sl_blake2b_state st
    cdef Py_ssize_t j
    while i < r.n:
        sl_blake2b_init(&st, 8)
        for j in range(r.nleaves):
            sl_blake2b_update(&st, r.headers[j], r.hlen[j])
            sl_blake2b_update(&st, r.data[j] + i * r.rowbytes[j], r.rowbytes[j])
        out[i] = sl_blake2b_final64(&st)
        i += 1


cdef int _digest_rows(list leaves, uint64_t *out, Py_ssize_t n) except -1:
    """Digest row i of every leaf as one message, for each of the n rows.

    The rows' messages (all of one length) are laid out side by side, each
    padded with zeros to whole 128-byte blocks, and digested eight at a time
    with AVX-512, four at a time with AVX2; the rest one at a time. The GIL
    is released only for large batches.
    """
    cdef _Rows r
    cdef Py_ssize_t i = 0, j
    cdef cnp.ndarray a
    cdef list arrays = []
    cdef size_t stride, scratch_size = 0
    cdef uint8_t stack_scratch[_STACK_SCRATCH]
    cdef uint8_t *scratch = NULL
    cdef bint wide = n >= 8 and _HAVE_AVX512
    cdef bint lanes4 = n >= 4 and _HAVE_AVX2
    cdef bint release
    r.n = n
    r.nleaves = len(leaves)
    r.msg_len = 0
    if r.nleaves > 64:
        # Rare: many leaves. Digest row by row through the generic path.
        for i in range(n):
            out[i] = _digest_leaves([arr[i] for arr in leaves])
        return 0
    for j in range(r.nleaves):
        a = _contiguous(leaves[j])
        if cnp.PyArray_NDIM(a) == 0 or cnp.PyArray_DIMS(a)[0] != n or cnp.PyArray_NDIM(a) > 33:
            raise ValueError("batch leaf has the wrong number of rows")
        arrays.append(a)  # keeps each contiguous copy alive while its data is read
        r.data[j] = <const uint8_t *>cnp.PyArray_DATA(a)
        r.rowbytes[j] = <size_t>(cnp.PyArray_NBYTES(a) // n) if n else 0
        r.hlen[j] = _header_bytes(a, 1, r.headers[j])
        r.msg_len += r.hlen[j] + r.rowbytes[j]
    release = <size_t>n * r.msg_len >= _NOGIL_BYTES
    if wide or lanes4:
        stride = ((r.msg_len + 127) // 128) * 128 if r.msg_len else 128
        if <size_t>n * stride <= _STACK_SCRATCH:
            scratch = &stack_scratch[0]
        else:
            scratch = _take_scratch(<size_t>n * stride, &scratch_size)
        if scratch != NULL:
            if release:
                with nogil:
                    i = _digest_laid(&r, scratch, stride, out, wide, lanes4)
            else:
                i = _digest_laid(&r, scratch, stride, out, wide, lanes4)
            if scratch != &stack_scratch[0]:
                _give_scratch(scratch, scratch_size)
    if release:
        with nogil:
            _digest_each(&r, i, out)
    else:
        _digest_each(&r, i, out)
    return 0


cdef inline uint64_t _bits(double value, bint is_f32) noexcept:
    cdef float f
    cdef uint32_t u32
    cdef uint64_t u64
    if is_f32:
        f = <float>value
        memcpy(&u32, &f, 4)
        return u32
    memcpy(&u64, &value, 8)
    return u64


def reward_bits(reward, is_f32):
    """The raw bits of a reward cast to the reward dtype, as an unsigned integer."""
    return _reward_bits(reward, is_f32)


cdef uint64_t _reward_bits(object reward, bint is_f32):
    cdef double value
    # Anything that is not a real number (a str, None, an int too large for a
    # double) is recorded as invalid: the env's step never raises because of
    # the ledger.
    try:
        value = PyFloat_AsDouble(reward)
    except Exception:
        return C_INVALID
    return _bits(value, is_f32)


def reward_bits_array(rewards, is_f32):
    rewards = np.asarray(rewards, dtype=np.float64)
    if is_f32:
        with np.errstate(over="ignore"):
            rewards = rewards.astype(np.float32)
        return rewards.view(np.uint32).astype(np.uint64)
    return rewards.view(np.uint64).copy()


cdef object _view(void *data, cnp.npy_intp n, int typenum, object owner):
    cdef cnp.ndarray arr = cnp.PyArray_SimpleNewFromData(1, &n, typenum, data)
    Py_INCREF(owner)  # the array keeps the buffer alive
    cnp.PyArray_SetBaseObject(arr, owner)
    cnp.PyArray_CLEARFLAGS(arr, cnp.NPY_ARRAY_WRITEABLE)
    return arr


cdef void *_resized(void *p, size_t nbytes) except NULL:
    """``p`` reallocated to ``nbytes``; MemoryError if that fails (``p`` is then left as it was)."""
    cdef void *q = realloc(p, nbytes)
    if q == NULL:
        raise MemoryError()
    return q


cdef class StreamBuffer:
    """Growable columns for one stream of events, _schema.BYTES_PER_EVENT bytes an event."""

    cdef uint8_t *kind
    cdef uint64_t *h_obs
    cdef uint64_t *h_act
    cdef uint64_t *h_rew
    cdef uint8_t *term
    cdef uint8_t *trunc
    cdef Py_ssize_t size
    cdef Py_ssize_t capacity

    def __cinit__(self, capacity=1024):
        self.size = 0
        self.capacity = 0
        self._grow(max(int(capacity), 16))

    def __dealloc__(self):
        global _used
        _used = max(0, _used - self.size * BYTES_PER_EVENT)
        free(self.kind)
        free(self.h_obs)
        free(self.h_act)
        free(self.h_rew)
        free(self.term)
        free(self.trunc)

    cdef int _grow(self, Py_ssize_t capacity) except -1:
        self.kind = <uint8_t *>_resized(self.kind, capacity)
        self.h_obs = <uint64_t *>_resized(self.h_obs, capacity * 8)
        self.h_act = <uint64_t *>_resized(self.h_act, capacity * 8)
        self.h_rew = <uint64_t *>_resized(self.h_rew, capacity * 8)
        self.term = <uint8_t *>_resized(self.term, capacity)
        self.trunc = <uint8_t *>_resized(self.trunc, capacity)
        self.capacity = capacity
        return 0

    cdef inline int push(self, uint8_t kind, uint64_t h_obs, uint64_t h_act, uint64_t h_rew,
                         bint terminated, bint truncated) except -1:
        """Append one event; returns 1 when the recordings want attention (memory or time, see _due)."""
        self.put(kind, h_obs, h_act, h_rew, terminated, truncated)
        return _due()

    cdef inline int put(self, uint8_t kind, uint64_t h_obs, uint64_t h_act, uint64_t h_rew,
                        bint terminated, bint truncated) except -1:
        """Append one event without asking whether the recordings want attention (the caller asks once)."""
        global _used
        cdef Py_ssize_t n = self.size
        if n == self.capacity:
            self._grow(2 * n)
        self.kind[n] = kind
        self.h_obs[n] = h_obs
        self.h_act[n] = h_act
        self.h_rew[n] = h_rew
        self.term[n] = terminated
        self.trunc[n] = truncated and not terminated
        self.size = n + 1
        _used += BYTES_PER_EVENT
        return 0

    def append(self, kind, h_obs, h_act, h_rew, terminated, truncated):
        """Append one event. Returns True when the process is over its memory limit."""
        return bool(self.push(kind, h_obs, h_act, h_rew, bool(terminated), bool(truncated)))

    def __len__(self):
        return self.size

    @property
    def nbytes(self):
        return self.size * BYTES_PER_EVENT

    def columns(self):
        """Copies of the recorded columns, keyed by column name."""
        cdef Py_ssize_t n = self.size
        out = {}
        for name, dt in S.EVENT_COLUMNS:
            out[name] = np.empty(n, dtype=dt)
        if n:
            memcpy(cnp.PyArray_DATA(out["kind"]), self.kind, n)
            memcpy(cnp.PyArray_DATA(out["h_obs"]), self.h_obs, n * 8)
            memcpy(cnp.PyArray_DATA(out["h_act"]), self.h_act, n * 8)
            memcpy(cnp.PyArray_DATA(out["h_rew"]), self.h_rew, n * 8)
            memcpy(cnp.PyArray_DATA(out["terminated"]), self.term, n)
            memcpy(cnp.PyArray_DATA(out["truncated"]), self.trunc, n)
        return out

    def views(self):
        """Read-only arrays over the recorded columns, without a copy.

        They are valid until the buffer next changes (an append, clear or
        release); spills and final writes use them, so that writing a
        buffer out does not need memory for a second copy of it.
        """
        cdef cnp.npy_intp n = self.size
        return {"kind": _view(self.kind, n, cnp.NPY_UINT8, self),
                "h_obs": _view(self.h_obs, n, cnp.NPY_UINT64, self),
                "h_act": _view(self.h_act, n, cnp.NPY_UINT64, self),
                "h_rew": _view(self.h_rew, n, cnp.NPY_UINT64, self),
                "terminated": _view(self.term, n, cnp.NPY_BOOL, self),
                "truncated": _view(self.trunc, n, cnp.NPY_BOOL, self)}

    def clear(self):
        global _used
        _used = max(0, _used - self.size * BYTES_PER_EVENT)
        self.size = 0

    def release(self):
        """Clear, and give the memory of a grown buffer back."""
        self.clear()
        if self.capacity > 1024:
            self._grow(1024)

    def drop_front(self, Py_ssize_t k):
        """Forget the first ``k`` events (a segment holds them); the later ones move to the front."""
        global _used
        cdef Py_ssize_t rest
        if k <= 0:
            return
        if k > self.size:
            raise ValueError("drop_front: %d events asked, %d held" % (k, self.size))
        rest = self.size - k
        memmove(self.kind, self.kind + k, rest)
        memmove(self.h_obs, self.h_obs + k, rest * 8)
        memmove(self.h_act, self.h_act + k, rest * 8)
        memmove(self.h_rew, self.h_rew + k, rest * 8)
        memmove(self.term, self.term + k, rest)
        memmove(self.trunc, self.trunc + k, rest)
        self.size = rest
        _used = max(0, _used - k * BYTES_PER_EVENT)


cdef inline void _int64_message(int64_t iv, uint8_t *buf) noexcept:
    """The 12-byte message of an int64 scalar leaf: tag "i8", ndim 0, then its 8 bytes."""
    cdef int b
    buf[0] = 2
    buf[1] = 105  # 'i'
    buf[2] = 56   # '8'
    buf[3] = 0
    for b in range(8):
        buf[4 + b] = <uint8_t>((<uint64_t>iv) >> (8 * b))


cdef class _Digester:
    """Digests single values of one LeafLayout, with a fast path for lone leaves."""

    cdef object layout
    cdef int fast_type
    cdef int fast_ndim
    cdef cnp.npy_intp fast_shape[32]
    cdef bint discrete
    cdef bint variable
    # A fast leaf whose whole message fits one block: its header (fixed by its dtype and shape), the
    # length of its data, and 0; else fast_nbytes is -1.
    cdef uint8_t fast_header[4 + 1 + 8 * 32]
    cdef Py_ssize_t fast_hlen
    cdef Py_ssize_t fast_nbytes

    def __init__(self, layout):
        self.layout = layout
        self.fast_type = -1
        self.fast_nbytes = -1
        self.discrete = bool(layout.discrete)
        self.variable = bool(layout.variable)
        if layout.fast_leaf is not None:
            dtype, shape = layout.fast_leaf
            if dtype.isnative and len(shape) <= 32:
                self.fast_type = dtype.num
                self.fast_ndim = len(shape)
                for i, d in enumerate(shape):
                    self.fast_shape[i] = d
                # the type number fixes kind and itemsize only for these kinds (not for str or void)
                nbytes = dtype.itemsize * math.prod(shape)
                if dtype.kind in "biufc" and 5 + 8 * len(shape) + nbytes <= 128:
                    self.fast_hlen = _header_bytes(np.empty(shape, dtype), 0, self.fast_header)
                    if self.fast_hlen + nbytes <= 128:
                        self.fast_nbytes = nbytes

    cdef inline bint _fits(self, object value):
        cdef cnp.ndarray a
        cdef int i
        if type(value) is not cnp.ndarray:
            return False
        a = <cnp.ndarray>value
        if cnp.PyArray_TYPE(a) != self.fast_type or not cnp.PyArray_IS_C_CONTIGUOUS(a):
            return False
        if not cnp.PyArray_ISNOTSWAPPED(a) or cnp.PyArray_NDIM(a) != self.fast_ndim:
            return False
        for i in range(self.fast_ndim):
            if cnp.PyArray_DIMS(a)[i] != self.fast_shape[i]:
                return False
        return True

    cdef Py_ssize_t padded_message(self, object value, uint8_t *block) except -2:
        """Write the whole digest message of ``value`` into block (128 bytes), zero-padded to its
        end, when it takes the fast path and fits one BLAKE2b block; return its length, or -1 (use
        digest())."""
        cdef Py_ssize_t n
        cdef int64_t iv
        if self.fast_nbytes >= 0 and self._fits(value):
            n = self.fast_hlen + self.fast_nbytes
            memcpy(block, self.fast_header, self.fast_hlen)
            memcpy(block + self.fast_hlen, cnp.PyArray_DATA(<cnp.ndarray>value), self.fast_nbytes)
            memset(block + n, 0, 128 - n)
            return n
        if self.discrete and (type(value) is int or isinstance(value, np.integer)):
            try:
                iv = PyLong_AsLongLong(value)
            except OverflowError:
                return -1
            _int64_message(iv, block)
            memset(block + 12, 0, 128 - 12)
            return 12
        return -1

    cdef uint64_t digest(self, object value) except? 0:
        cdef sl_blake2b_state st
        cdef cnp.ndarray a
        cdef int64_t iv
        cdef uint8_t buf[13]
        if self.fast_type >= 0 and self._fits(value):
            a = <cnp.ndarray>value
            sl_blake2b_init(&st, 8)
            _update_header(&st, a, 0)
            sl_blake2b_update(&st, cnp.PyArray_DATA(a), <size_t>cnp.PyArray_NBYTES(a))
            return sl_blake2b_final64(&st)
        if self.discrete and (type(value) is int or isinstance(value, np.integer)):
            try:
                iv = PyLong_AsLongLong(value)
            except OverflowError:
                # out of int64: cast() decides (an np.uint64 wraps, an int is invalid)
                return self._digest_cast(value)
            _int64_message(iv, buf)
            sl_blake2b_init(&st, 8)
            sl_blake2b_update(&st, buf, 12)
            return sl_blake2b_final64(&st)
        return self._digest_cast(value)

    cdef uint64_t _digest_cast(self, object value) except? 0:
        try:
            leaves = self.layout.cast(value)
        except Exception:
            return C_INVALID
        return _digest_leaves(leaves)


cdef inline void _put(uint8_t *buf, Py_ssize_t pos, uint64_t v, int nbytes) noexcept:
    cdef int b
    for b in range(nbytes):
        buf[pos + b] = <uint8_t>(v >> (8 * b))


cdef inline uint64_t _get(const uint8_t *buf, Py_ssize_t pos, int nbytes) noexcept:
    cdef uint64_t v = 0
    cdef int b
    for b in range(nbytes):
        v |= (<uint64_t>buf[pos + b]) << (8 * b)
    return v


cdef class EventRecorder:
    """Records one env's events into a StreamBuffer: the env side's hot path.

    ``keep`` is called with the cast leaves of each event when values are
    kept, else it is None. The recorder also knows the last event and its
    position (event counter, episode, step), from which ``token()`` builds the
    live-mode token (see ``_schema.TOKEN_FORMAT``).
    """

    cdef public StreamBuffer buffer
    cdef _Digester obs
    cdef _Digester act
    cdef bint is_f32
    cdef public object keep
    cdef readonly object obs_layout
    cdef readonly object act_layout
    cdef readonly long long counter
    cdef readonly long long episode
    cdef readonly long long step_in_episode
    cdef uint8_t last_kind
    cdef uint64_t last_obs, last_act, last_rew
    cdef bint last_te, last_tr
    # The action of the step under way, taken before the env could touch it: its whole
    # message when small (digested later together with the obs), else its digest.
    cdef uint8_t act_msg[128]
    cdef Py_ssize_t act_len
    cdef uint64_t act_digest
    cdef object act_leaves

    def __init__(self, StreamBuffer buffer, obs_layout, act_layout, reward_is_f32, keep=None):
        self.buffer = buffer
        self.obs_layout = obs_layout
        self.act_layout = act_layout
        self.obs = _Digester(obs_layout)
        self.act = _Digester(act_layout)
        self.is_f32 = bool(reward_is_f32)
        self.keep = keep
        self.counter = 0
        self.episode = -1
        self.step_in_episode = 0

    cdef inline int _record(self, uint8_t kind, uint64_t h_obs, uint64_t h_act, uint64_t h_rew,
                            bint te, bint tr) except -1:
        cdef int over = self.buffer.push(kind, h_obs, h_act, h_rew, te, tr)
        self.last_kind, self.last_obs, self.last_act, self.last_rew = kind, h_obs, h_act, h_rew
        self.last_te, self.last_tr = te, tr and not te
        self.counter += 1
        if kind == KIND_RESET:
            self.episode += 1
            self.step_in_episode = 0
        else:
            self.step_in_episode += 1
        return over

    def reset(self, obs):
        if self.keep is not None:
            return self._keep_event(KIND_RESET, None, obs, 0.0, False, False)
        return self._record(KIND_RESET, self.obs.digest(obs), NO_DIGEST, _bits(0.0, self.is_f32), False, False) == 1

    # Positional arguments only (as in the pure-Python core): take_action is then METH_O, which the
    # interpreter calls with no argument parsing, and step_taken parses no keywords.
    @cython.always_allow_keywords(False)
    def take_action(self, action):
        """Note the action of the step under way as the env receives it, before the env (which
        may change its array in place) sees it. step_taken() then records the step."""
        self._take_action(action)

    cdef int _take_action(self, object action) except -1:
        if self.keep is not None:
            leaves = _cast_or_none(self.act_layout, action)
            self.act_leaves = None if leaves is None else [np.array(leaf, copy=True) for leaf in leaves]
            return 0
        # a small action's whole message is copied (it is digested with the obs in step_taken)
        self.act_len = self.act.padded_message(action, self.act_msg) if _HAVE_AVX2 else -1
        if self.act_len < 0:
            self.act_digest = self.act.digest(action)
        return 0

    def step_taken(self, obs, reward, terminated, truncated, /):
        """Record the step whose action take_action() noted."""
        return self._step_taken(obs, reward, terminated, truncated) == 1

    cdef int _step_taken(self, object obs, object reward, object terminated, object truncated) except -1:
        # 1 when the recordings want attention, else 0. Everything that can raise (flags with no truth
        # value) comes before the event is recorded, so that a failed call records nothing and can be
        # made again: take_action()'s action is kept until the next one.
        cdef uint8_t mo[128]
        cdef uint64_t out[2]
        cdef uint64_t h_rew
        cdef bint te, tr
        cdef Py_ssize_t lo
        if self.keep is not None:
            return self._keep_event(KIND_STEP, self.act_leaves, obs, reward, terminated, truncated, True)
        if type(reward) is float or type(reward) is _float64:
            h_rew = _bits(PyFloat_AS_DOUBLE(reward), self.is_f32)
        else:
            h_rew = _reward_bits(reward, self.is_f32)
        te = PyObject_IsTrue(terminated)
        tr = PyObject_IsTrue(truncated)
        if self.act_len >= 0:
            # a small action and a small observation: digested together (sl_blake2b64_x2_padded)
            lo = self.obs.padded_message(obs, mo)
            if lo >= 0:
                sl_blake2b64_x2_padded(mo, lo, self.act_msg, self.act_len, out)
            else:  # a large observation: digested alone
                sl_blake2b64_x2_padded(self.act_msg, self.act_len, self.act_msg, self.act_len, out)
                out[0] = self.obs.digest(obs)
            return self._record(KIND_STEP, out[0], out[1], h_rew, te, tr)
        return self._record(KIND_STEP, self.obs.digest(obs), self.act_digest, h_rew, te, tr)

    def step(self, action, obs, reward, terminated, truncated):
        """Record a step whose action is still as the env received it."""
        self.take_action(action)
        return self.step_taken(obs, reward, terminated, truncated)

    def _keep_event(self, uint8_t kind, action, obs, reward, terminated, truncated, bint action_cast=False):
        # Everything that can raise comes before keep(), so that a failed
        # event leaves kept values and events aligned. ``action_cast``: the
        # action is already its cast leaves (copied by take_action()).
        cdef bint te = PyObject_IsTrue(terminated)
        cdef bint tr = PyObject_IsTrue(truncated)
        obs_leaves = _cast_or_none(self.obs_layout, obs)
        if kind == KIND_RESET:
            act_leaves = None
        else:
            act_leaves = action if action_cast else _cast_or_none(self.act_layout, action)
        h_act = NO_DIGEST if kind == KIND_RESET else digest_leaves(act_leaves)
        h_obs = digest_leaves(obs_leaves)
        over = self.keep(obs_leaves, act_leaves)
        return (self._record(kind, h_obs, h_act, _reward_bits(reward, self.is_f32), te, tr) == 1) or bool(over)

    def token(self, unsigned int index):
        """The live token of the last event, for env ``index`` (bytes)."""
        cdef uint8_t buf[T_SIZE]
        buf[T_VERSION] = TOKEN_VERSION
        _put(buf, T_INDEX, index, W_INDEX)
        _put(buf, T_COUNTER, <uint64_t>(self.counter - 1), W_COUNTER)
        _put(buf, T_EPISODE, <uint64_t>self.episode, W_EPISODE)
        _put(buf, T_STEP, <uint64_t>self.step_in_episode, W_STEP)
        buf[T_KIND] = self.last_kind
        _put(buf, T_H_OBS, self.last_obs, W_H_OBS)
        _put(buf, T_H_ACT, self.last_act, W_H_ACT)
        _put(buf, T_H_REW, self.last_rew, W_H_REW)
        buf[T_FLAGS] = (F_TERMINATED if self.last_te else 0) | (F_TRUNCATED if self.last_tr else 0)
        return PyBytes_FromStringAndSize(<char *>buf, T_SIZE)


def _cast_or_none(layout, value):
    try:
        return layout.cast(value)
    except Exception:
        return None


def first_difference(a, b, Py_ssize_t start=0):
    """Index of the first event where two sets of event columns differ, or -1."""
    cdef Py_ssize_t n = len(a["kind"])
    cdef Py_ssize_t i
    for name in S.EVENT_COLUMN_NAMES:
        if len(b[name]) != n:
            raise ValueError("columns of different length")
    cdef const uint8_t[::1] ka = _u8(a["kind"]), kb = _u8(b["kind"])
    cdef const uint8_t[::1] ta = _u8(a["terminated"]), tb = _u8(b["terminated"])
    cdef const uint8_t[::1] ra = _u8(a["truncated"]), rb = _u8(b["truncated"])
    cdef const uint64_t[::1] oa = _u64(a["h_obs"]), ob = _u64(b["h_obs"])
    cdef const uint64_t[::1] aa = _u64(a["h_act"]), ab = _u64(b["h_act"])
    cdef const uint64_t[::1] wa = _u64(a["h_rew"]), wb = _u64(b["h_rew"])
    cdef Py_ssize_t found = -1
    with nogil:
        for i in range(start, n):
            if (ka[i] != kb[i] or oa[i] != ob[i] or aa[i] != ab[i] or wa[i] != wb[i]
                    or ta[i] != tb[i] or ra[i] != rb[i]):
                found = i
                break
    return found


cdef inline object _u8(object arr):
    return np.ascontiguousarray(arr).view(np.uint8)


cdef inline object _u64(object arr):
    return np.ascontiguousarray(arr).view(np.uint64)


cdef struct _Laid:
    # A VectorRecorder's batch of one-leaf rows, kept laid out between calls: row k's message
    # (the leaf header, then the row's bytes) at buf + k * stride, followed by zeros up to the
    # stride (a multiple of 128 bytes). The headers are written once and the zeros never touched
    # again, so a call copies only the rows' bytes, and the digests read every block in place.
    uint8_t *buf
    size_t stride
    size_t hlen
    size_t rowbytes
    size_t msg_len
    int state  # 0: not laid out yet; 1: laid out; -1: too large to keep (laid out per call instead)


cdef inline void _copy_row(uint8_t *dst, const uint8_t *src, size_t n) noexcept nogil:
    """memcpy of one row; the small sizes of vector env rows as two fixed-size (overlapping) moves."""
    cdef size_t i
    if n > 16:
        memcpy(dst, src, n)
    elif n >= 8:
        memcpy(dst, src, 8)
        memcpy(dst + n - 8, src + n - 8, 8)
    elif n >= 4:
        memcpy(dst, src, 4)
        memcpy(dst + n - 4, src + n - 4, 4)
    else:
        for i in range(n):
            dst[i] = src[i]


cdef int _laid_build(_Laid *L, cnp.ndarray a, Py_ssize_t n) except -1:
    """Lay out the rows of batches like ``a`` (n C-ordered rows of one leaf), or mark them too large."""
    cdef uint8_t header[4 + 1 + 8 * 32]
    cdef size_t hlen = <size_t>_header_bytes(a, 1, header)
    cdef size_t rowbytes = <size_t>(cnp.PyArray_NBYTES(a) // n)
    cdef size_t stride = ((hlen + rowbytes + 127) // 128) * 128
    cdef Py_ssize_t k
    if <size_t>n * stride >= _NOGIL_BYTES:  # digested without the GIL, laid out per call
        L.state = -1
        return 0
    L.buf = <uint8_t *>calloc(<size_t>n, stride)
    if L.buf == NULL:
        raise MemoryError()
    for k in range(n):
        memcpy(L.buf + k * stride, header, hlen)
    L.stride, L.hlen, L.rowbytes, L.msg_len = stride, hlen, rowbytes, hlen + rowbytes
    L.state = 1
    return 0


cdef void _laid_digest(_Laid *L, const uint8_t *data, Py_ssize_t n, uint64_t *out) noexcept nogil:
    """Digest the n rows at ``data`` (laid out by _laid_build): the same digests as _digest_rows."""
    cdef Py_ssize_t i = 0, k
    cdef size_t stride = L.stride, rowbytes = L.rowbytes
    cdef uint8_t *rows = L.buf + L.hlen
    for k in range(n):
        _copy_row(rows + k * stride, data + k * rowbytes, rowbytes)
    if _HAVE_AVX512:
        while i + 8 <= n:
            sl_blake2b64_x8(L.buf + i * stride, stride, L.msg_len, out + i)
            i += 8
    if _HAVE_AVX2:
        while i + 4 <= n:
            sl_blake2b64_x4_laid(L.buf + i * stride, stride, L.msg_len, out + i)
            i += 4
    while i < n:
        out[i] = _hash_bytes(L.buf + i * stride, L.msg_len)
        i += 1


cdef dict _NO_FINALS = {}  # no episode ended at this step (never written to)


cdef inline const uint8_t *_bool_data(object arr, list keep) except NULL:
    cdef cnp.ndarray a
    if type(arr) is not np.ndarray or cnp.PyArray_TYPE(<cnp.ndarray>arr) != cnp.NPY_BOOL \
            or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>arr):
        arr = np.ascontiguousarray(arr, dtype=np.bool_)
    a = <cnp.ndarray>arr
    keep.append(a)
    return <const uint8_t *>cnp.PyArray_DATA(a)


cdef class VectorRecorder:
    """Records the events of a vector env's envs, one call per vector step.

    ``buffers`` holds one StreamBuffer per env. Each method records the events
    of all envs with no Python loop over them and returns True when the
    recordings want attention: the process is over its memory limit, or a
    periodic spill is due (asked once a call, not once an event).

    ``env_reset`` and ``env_steps`` record one env's events instead, many
    steps at once (trainers that receive episodes or chunks); they do not
    feed the live check.
    """

    cdef public list buffers
    cdef Py_ssize_t n
    cdef _Digester obs
    cdef _Digester act
    cdef readonly object obs_layout
    cdef readonly object act_layout
    cdef bint is_f32
    cdef public cnp.ndarray pending
    cdef public cnp.ndarray last_obs
    cdef public cnp.ndarray last_act
    # The events of the latest call, per env (at most two: a step, then a
    # reset), and each env's event counter, for the live check.
    cdef public cnp.ndarray counts
    cdef cnp.ndarray ev_count, ev_kind, ev_obs, ev_act, ev_rew, ev_flags
    # per env: whether a good token has arrived, and the position of the last one
    cdef public cnp.ndarray token_seen, token_episode, token_step
    # per env: the env index its live tokens must name (env i's own by default; a multi-agent slot's stream)
    cdef readonly cnp.ndarray stream_ids
    # the observation and action batches of one-leaf spaces, kept laid out for their digests
    cdef _Laid obs_laid, act_laid

    def __init__(self, list buffers, obs_layout, act_layout, reward_is_f32, stream_ids=None):
        self.buffers = buffers
        self.n = len(buffers)
        # the env index each env's tokens must name: its own, or the stream_ids given (one per env)
        self.stream_ids = np.array(range(self.n) if stream_ids is None else stream_ids, dtype=np.int64).reshape(-1)
        if self.stream_ids.shape[0] != self.n:
            raise ValueError("stream_ids: %d ids for %d envs" % (self.stream_ids.shape[0], self.n))
        self.obs_layout = obs_layout
        self.act_layout = act_layout
        self.obs = _Digester(obs_layout)
        self.act = _Digester(act_layout)
        self.is_f32 = bool(reward_is_f32)
        self.pending = np.zeros(self.n, dtype=np.bool_)
        self.last_obs = np.zeros(self.n, dtype=np.uint64)
        self.last_act = np.zeros(self.n, dtype=np.uint64)
        self.counts = np.zeros(self.n, dtype=np.int64)
        self.ev_count = np.zeros(self.n, dtype=np.uint8)
        self.ev_kind = np.zeros((self.n, 2), dtype=np.uint8)
        self.ev_obs = np.zeros((self.n, 2), dtype=np.uint64)
        self.ev_act = np.zeros((self.n, 2), dtype=np.uint64)
        self.ev_rew = np.zeros((self.n, 2), dtype=np.uint64)
        self.ev_flags = np.zeros((self.n, 2), dtype=np.uint8)
        self.token_seen = np.zeros(self.n, dtype=np.bool_)
        self.token_episode = np.full(self.n, -1, dtype=np.int64)
        self.token_step = np.zeros(self.n, dtype=np.int64)

    def __dealloc__(self):
        free(self.obs_laid.buf)
        free(self.act_laid.buf)

    cdef inline int _push(self, Py_ssize_t i, uint8_t kind, uint64_t h_obs, uint64_t h_act, uint64_t h_rew,
                          bint te, bint tr) except -1:
        """Append env i's event to its buffer, and note it as one of this call's events."""
        cdef Py_ssize_t j = (<uint8_t *>cnp.PyArray_DATA(self.ev_count))[i]
        cdef Py_ssize_t k = 2 * i + j
        (<uint8_t *>cnp.PyArray_DATA(self.ev_kind))[k] = kind
        (<uint64_t *>cnp.PyArray_DATA(self.ev_obs))[k] = h_obs
        (<uint64_t *>cnp.PyArray_DATA(self.ev_act))[k] = h_act
        (<uint64_t *>cnp.PyArray_DATA(self.ev_rew))[k] = h_rew
        (<uint8_t *>cnp.PyArray_DATA(self.ev_flags))[k] = ((F_TERMINATED if te else 0)
                                                           | (F_TRUNCATED if tr and not te else 0))
        (<uint8_t *>cnp.PyArray_DATA(self.ev_count))[i] = j + 1
        (<int64_t *>cnp.PyArray_DATA(self.counts))[i] += 1
        return (<StreamBuffer>self.buffers[i]).put(kind, h_obs, h_act, h_rew, te, tr)

    cdef inline void _new_call(self) noexcept:
        memset(cnp.PyArray_DATA(self.ev_count), 0, self.n)

    def event(self, Py_ssize_t i, Py_ssize_t j):
        """Env i's j-th event of the latest call: (kind, h_obs, h_act, h_rew, terminated, truncated)."""
        cdef Py_ssize_t k = 2 * i + j
        flags = self.ev_flags.reshape(-1)[k]
        return (int(self.ev_kind.reshape(-1)[k]), int(self.ev_obs.reshape(-1)[k]), int(self.ev_act.reshape(-1)[k]),
                int(self.ev_rew.reshape(-1)[k]), bool(flags & F_TERMINATED), bool(flags & F_TRUNCATED))

    def events_in_call(self, Py_ssize_t i):
        return int(self.ev_count[i])

    def check(self, single, first=None, second=None):
        """Check the live tokens of the latest call's events against them.

        An env with one event takes its token from ``single[i]``; an env with
        two (a step, then a reset) from ``first[i]`` and ``second[i]``. Each
        source is a sequence of n tokens (None where absent) or None.
        Returns [(env, j, token or None)] for every event whose token is
        absent (None) or disagrees; empty when all is well.
        """
        cdef Py_ssize_t i, j, c, k
        cdef const uint8_t *t
        cdef uint64_t counter
        cdef bint bad
        cdef uint8_t *evc = <uint8_t *>cnp.PyArray_DATA(self.ev_count)
        cdef int64_t *cnt = <int64_t *>cnp.PyArray_DATA(self.counts)
        cdef uint8_t *ek = <uint8_t *>cnp.PyArray_DATA(self.ev_kind)
        cdef uint64_t *eo = <uint64_t *>cnp.PyArray_DATA(self.ev_obs)
        cdef uint64_t *ea = <uint64_t *>cnp.PyArray_DATA(self.ev_act)
        cdef uint64_t *er = <uint64_t *>cnp.PyArray_DATA(self.ev_rew)
        cdef uint8_t *ef = <uint8_t *>cnp.PyArray_DATA(self.ev_flags)
        cdef uint8_t *seen = <uint8_t *>cnp.PyArray_DATA(self.token_seen)
        cdef int64_t *tep = <int64_t *>cnp.PyArray_DATA(self.token_episode)
        cdef int64_t *tst = <int64_t *>cnp.PyArray_DATA(self.token_step)
        cdef int64_t *sid = <int64_t *>cnp.PyArray_DATA(self.stream_ids)
        problems = []
        for i in range(self.n):
            c = evc[i]
            for j in range(c):
                src = single if c == 1 else (first if j == 0 else second)
                tok = None if src is None else src[i]
                if type(tok) is not bytes or PyBytes_GET_SIZE(tok) != T_SIZE:
                    problems.append((i, j, None if tok is None or type(tok) is not bytes else tok))
                    continue
                t = <const uint8_t *>PyBytes_AS_STRING(tok)
                k = 2 * i + j
                counter = <uint64_t>(cnt[i] - c + j)
                bad = (t[T_VERSION] != TOKEN_VERSION or _get(t, T_INDEX, W_INDEX) != <uint64_t>sid[i]
                       or _get(t, T_COUNTER, W_COUNTER) != counter or t[T_KIND] != ek[k]
                       or _get(t, T_H_OBS, W_H_OBS) != eo[k] or _get(t, T_H_ACT, W_H_ACT) != ea[k]
                       or _get(t, T_H_REW, W_H_REW) != er[k] or t[T_FLAGS] != ef[k])
                if bad:
                    problems.append((i, j, tok))
                else:
                    seen[i] = 1
                    tep[i] = <int64_t>_get(t, T_EPISODE, W_EPISODE)
                    tst[i] = <int64_t>_get(t, T_STEP, W_STEP)
        return problems

    def tokens(self, dicts, key, bint pop):
        """The token under ``key`` in each of n dicts (None where absent), popped if asked."""
        cdef Py_ssize_t i
        out = [None] * self.n
        for i in range(min(self.n, len(dicts))):
            d = dicts[i]
            if type(d) is dict:
                out[i] = (<dict>d).pop(key, None) if pop else (<dict>d).get(key)
        return out

    def clear_buffers(self):
        """Empty every stream buffer (live check without files: constant memory)."""
        cdef Py_ssize_t i
        for i in range(self.n):
            (<StreamBuffer>self.buffers[i]).clear()

    def digest_obs(self, value):
        return self.obs.digest(value)

    cdef bint _batch_fits(self, _Digester d, object batch, Py_ssize_t n):
        """True when ``batch`` is already the cast batch of a one-leaf space:
        an array of the leaf's dtype and of shape (n,) + the leaf's shape."""
        cdef cnp.ndarray a
        cdef int i
        if d.fast_type < 0 or not cnp.PyArray_CheckExact(batch):
            return False
        a = <cnp.ndarray>batch
        if cnp.PyArray_TYPE(a) != d.fast_type or not cnp.PyArray_ISNOTSWAPPED(a):
            return False
        if cnp.PyArray_NDIM(a) != d.fast_ndim + 1 or cnp.PyArray_DIMS(a)[0] != n:
            return False
        for i in range(d.fast_ndim):
            if cnp.PyArray_DIMS(a)[i + 1] != d.fast_shape[i]:
                return False
        return True

    cdef int _rows(self, _Digester d, object batch, cnp.ndarray out, _Laid *laid) except -1:
        """Digest each row of ``batch`` into ``out`` (one row per element of out);
        invalid for all if it cannot be cast. ``laid``: where a batch of all n envs' rows
        is kept laid out (NULL for other batches)."""
        cdef uint64_t *o = <uint64_t *>cnp.PyArray_DATA(out)
        cdef Py_ssize_t n = cnp.PyArray_DIMS(out)[0]
        cdef Py_ssize_t i
        if self._batch_fits(d, batch, n):
            # no cast needed: skips the Python layout code
            if laid != NULL and laid.state >= 0 and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>batch) and n > 0:
                if laid.state == 0:
                    _laid_build(laid, <cnp.ndarray>batch, n)
                if laid.state == 1:
                    _laid_digest(laid, <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>batch), n, o)
                    return 0
            _digest_rows([batch], o, n)
            return 0
        if d.variable:  # values of varying size: each row's value cast and digested on its own
            i = 0
            for leaves in d.layout.cast_each(batch, n):
                o[i] = C_INVALID if leaves is None else _digest_leaves(leaves)
                i += 1
            return 0
        try:
            leaves = d.layout.cast_rows(batch, n)
        except Exception:
            for i in range(n):
                o[i] = C_INVALID
            return 0
        _digest_rows(leaves, o, n)
        return 0

    cdef cnp.ndarray _rewards(self, object rewards):
        cdef cnp.ndarray rew
        if cnp.PyArray_CheckExact(rewards) and cnp.PyArray_TYPE(<cnp.ndarray>rewards) == cnp.NPY_DOUBLE \
                and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>rewards) \
                and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>rewards):
            rew = <cnp.ndarray>rewards
        else:
            rew = np.ascontiguousarray(rewards, dtype=np.float64).reshape(-1)
        if cnp.PyArray_SIZE(rew) != self.n:
            raise ValueError("expected %d rewards, got %d" % (self.n, cnp.PyArray_SIZE(rew)))
        return rew

    cdef cnp.ndarray _flags(self, object arr, str what):
        """``arr`` as a C-ordered bool array (itself when it is one) of one flag per env, checked for its length."""
        cdef cnp.ndarray a
        if not cnp.PyArray_CheckExact(arr) or cnp.PyArray_TYPE(<cnp.ndarray>arr) != cnp.NPY_BOOL \
                or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>arr):
            arr = np.ascontiguousarray(arr, dtype=np.bool_)
        a = <cnp.ndarray>arr
        if cnp.PyArray_SIZE(a) != self.n:
            raise ValueError("expected %d values of %s, got %d" % (self.n, what, cnp.PyArray_SIZE(a)))
        return a

    def ended(self, a, b=None):
        """Indices of the envs where ``a`` or ``b`` is true (b may be None)."""
        cdef cnp.ndarray fa = self._flags(a, "flags")
        cdef cnp.ndarray fb
        cdef const uint8_t *pa = <const uint8_t *>cnp.PyArray_DATA(fa)
        cdef const uint8_t *pb = NULL
        cdef Py_ssize_t i
        if b is not None:
            fb = self._flags(b, "flags")
            pb = <const uint8_t *>cnp.PyArray_DATA(fb)
        out = []
        for i in range(self.n):
            if pa[i] or (pb != NULL and pb[i]):
                out.append(i)
        return out

    def reset(self, obs, mask=None):
        """Record a reset for every env, or for the envs where ``mask`` is true."""
        cdef cnp.ndarray fm
        cdef const uint8_t *pm = NULL
        cdef uint8_t *pend = <uint8_t *>cnp.PyArray_DATA(self.pending)
        cdef uint64_t *ho = <uint64_t *>cnp.PyArray_DATA(self.last_obs)
        cdef uint64_t zero = _bits(0.0, self.is_f32)
        cdef Py_ssize_t i
        if mask is not None:
            fm = self._flags(mask, "reset_mask")
            pm = <const uint8_t *>cnp.PyArray_DATA(fm)
        self._rows(self.obs, obs, self.last_obs, &self.obs_laid)
        self._new_call()
        for i in range(self.n):
            if pm == NULL or pm[i]:
                self._push(i, KIND_RESET, ho[i], NO_DIGEST, zero, False, False)
                pend[i] = 0
        return _due()

    def actions(self, actions):
        """Digest the actions sent to the envs, before they are handed over (Gymnasium's batch layout)."""
        self._rows(self.act, actions, self.last_act, &self.act_laid)

    @cython.boundscheck(True)  # actions[i] indexes the caller's object: it may be too short
    @cython.wraparound(True)
    def actions_per_env(self, actions):
        """Digest the actions sent to the envs, given as one value per env (SB3's layout:
        env i is sent ``actions[i]``); an env whose value cannot be taken is recorded as invalid."""
        cdef uint64_t *o = <uint64_t *>cnp.PyArray_DATA(self.last_act)
        cdef Py_ssize_t i
        if self._batch_fits(self.act, actions, self.n):
            # an array of rows already of the leaf's dtype and shape: row i is actions[i]
            self._rows(self.act, actions, self.last_act, &self.act_laid)
            return
        for i in range(self.n):
            try:
                value = actions[i]
            except Exception:
                o[i] = C_INVALID
                continue
            o[i] = self.act.digest(value)

    def step_next(self, obs, rewards, terminated, truncated):
        """A vector step under next-step autoreset: an env whose episode ended at
        its previous step is reset now, and its action is not recorded."""
        return self._step_next(obs, rewards, terminated, truncated)

    def step_next_results(self, results):
        """``step_next`` of a vector env's step results, the (obs, rewards, terminated,
        truncated, info) it returned, in one call (the trainer side's hot path)."""
        obs, rewards, terminated, truncated, _ = results
        return self._step_next(obs, rewards, terminated, truncated)

    cdef bint _step_next(self, obs, rewards, terminated, truncated) except -1:
        cdef cnp.ndarray fte = self._flags(terminated, "terminated")
        cdef cnp.ndarray ftr = self._flags(truncated, "truncated")
        cdef cnp.ndarray rew = self._rewards(rewards)
        cdef const uint8_t *te = <const uint8_t *>cnp.PyArray_DATA(fte)
        cdef const uint8_t *tr = <const uint8_t *>cnp.PyArray_DATA(ftr)
        cdef const double *pr = <const double *>cnp.PyArray_DATA(rew)
        cdef uint8_t *pend = <uint8_t *>cnp.PyArray_DATA(self.pending)
        cdef uint64_t *ho = <uint64_t *>cnp.PyArray_DATA(self.last_obs)
        cdef uint64_t *ha = <uint64_t *>cnp.PyArray_DATA(self.last_act)
        # every env has one event this call: the call's event arrays are written here directly
        cdef uint8_t *ek = <uint8_t *>cnp.PyArray_DATA(self.ev_kind)
        cdef uint64_t *eo = <uint64_t *>cnp.PyArray_DATA(self.ev_obs)
        cdef uint64_t *ea = <uint64_t *>cnp.PyArray_DATA(self.ev_act)
        cdef uint64_t *er = <uint64_t *>cnp.PyArray_DATA(self.ev_rew)
        cdef uint8_t *ef = <uint8_t *>cnp.PyArray_DATA(self.ev_flags)
        cdef int64_t *cnt = <int64_t *>cnp.PyArray_DATA(self.counts)
        cdef list buffers = self.buffers
        cdef bint is_f32 = self.is_f32
        cdef Py_ssize_t i, n = self.n
        cdef uint8_t kind
        cdef uint64_t h_act, bits
        cdef bint t, r
        self._rows(self.obs, obs, self.last_obs, &self.obs_laid)
        memset(cnp.PyArray_DATA(self.ev_count), 1, n)
        for i in range(n):
            bits = _bits(pr[i], is_f32)
            t, r = te[i] != 0, tr[i] != 0
            if pend[i]:
                kind, h_act = KIND_RESET, NO_DIGEST
                ha[i] = NO_DIGEST
                pend[i] = 0
            else:
                kind, h_act = KIND_STEP, ha[i]
                pend[i] = t or r
            ek[2 * i] = kind
            eo[2 * i] = ho[i]
            ea[2 * i] = h_act
            er[2 * i] = bits
            ef[2 * i] = (F_TERMINATED if t else 0) | (F_TRUNCATED if r and not t else 0)
            cnt[i] += 1
            (<StreamBuffer>buffers[i]).put(kind, ho[i], h_act, bits, t, r)
        return _due()

    def step_same(self, obs, rewards, dict finals):
        """A vector step under same-step autoreset (Gymnasium SAME_STEP, SB3).

        ``finals`` maps each env whose episode ended to (final obs digest,
        terminated, truncated); those envs record the step with the final obs,
        then a reset with the returned obs. The others record a step with
        both flags false.
        """
        return self._step_same(obs, rewards, finals)

    cdef bint _step_same(self, obs, rewards, dict finals) except -1:
        cdef cnp.ndarray rew = self._rewards(rewards)
        cdef const double *pr = <const double *>cnp.PyArray_DATA(rew)
        cdef uint64_t *ho = <uint64_t *>cnp.PyArray_DATA(self.last_obs)
        cdef uint64_t *ha = <uint64_t *>cnp.PyArray_DATA(self.last_act)
        cdef uint64_t zero = _bits(0.0, self.is_f32)
        cdef Py_ssize_t i
        self._rows(self.obs, obs, self.last_obs, &self.obs_laid)
        self._new_call()
        for i in range(self.n):
            if finals and i in finals:
                h_final, te, tr = finals[i]
                self._push(i, KIND_STEP, h_final, ha[i], _bits(pr[i], self.is_f32), te, tr)
                self._push(i, KIND_RESET, ho[i], NO_DIGEST, zero, False, False)
            else:
                self._push(i, KIND_STEP, ho[i], ha[i], _bits(pr[i], self.is_f32), False, False)
        return _due()

    def step_same_results(self, results):
        """``step_same`` of a vector env's step results, the (obs, rewards, terminated, truncated,
        info) it returned, when no env's episode ended; None, with nothing recorded, when one did
        (its final observation is for ``step_same`` with its finals)."""
        obs, rewards, terminated, truncated, _ = results
        cdef cnp.ndarray fte = self._flags(terminated, "terminated")
        cdef cnp.ndarray ftr = self._flags(truncated, "truncated")
        cdef const uint8_t *te = <const uint8_t *>cnp.PyArray_DATA(fte)
        cdef const uint8_t *tr = <const uint8_t *>cnp.PyArray_DATA(ftr)
        cdef Py_ssize_t i
        for i in range(self.n):
            if te[i] or tr[i]:
                return None
        return self._step_same(obs, rewards, _NO_FINALS)

    def env_reset(self, Py_ssize_t i, obs):
        """Record a reset of env i that returned ``obs`` (None: withheld from the trainer, WITHHELD_DIGEST)."""
        cdef uint64_t h
        if i < 0 or i >= self.n:
            raise IndexError("env %d is not one of the %d envs" % (i, self.n))
        h = WITHHELD_DIGEST if obs is None else self.obs.digest(obs)
        (<uint64_t *>cnp.PyArray_DATA(self.last_obs))[i] = h
        (<uint8_t *>cnp.PyArray_DATA(self.pending))[i] = 0
        (<int64_t *>cnp.PyArray_DATA(self.counts))[i] += 1
        (<StreamBuffer>self.buffers[i]).put(KIND_RESET, h, NO_DIGEST, _bits(0.0, self.is_f32), False, False)
        return _due()

    def env_steps(self, Py_ssize_t i, actions, obs, rewards, terminated, truncated):
        """Record m steps of env i: ``actions`` and ``obs`` batched over the m steps
        (a leading axis of m), ``rewards``, ``terminated`` and ``truncated`` of m each;
        ``obs`` None: the library withheld the observations (each gets WITHHELD_DIGEST)."""
        cdef list keep = []
        cdef cnp.ndarray rew = np.ascontiguousarray(rewards, dtype=np.float64).reshape(-1)
        cdef Py_ssize_t m = cnp.PyArray_SIZE(rew)
        cdef cnp.ndarray h_obs = np.empty(m, dtype=np.uint64)
        cdef cnp.ndarray h_act = np.empty(m, dtype=np.uint64)
        cdef const uint8_t *te
        cdef const uint8_t *tr
        cdef const double *pr = <const double *>cnp.PyArray_DATA(rew)
        cdef uint64_t *po
        cdef uint64_t *pa
        cdef StreamBuffer buf
        cdef Py_ssize_t k
        if i < 0 or i >= self.n:
            raise IndexError("env %d is not one of the %d envs" % (i, self.n))
        te = _bool_data(terminated, keep)
        if cnp.PyArray_SIZE(<cnp.ndarray>keep[len(keep) - 1]) != m:
            raise ValueError("expected %d values of terminated, got %d"
                             % (m, cnp.PyArray_SIZE(<cnp.ndarray>keep[len(keep) - 1])))
        tr = _bool_data(truncated, keep)
        if cnp.PyArray_SIZE(<cnp.ndarray>keep[len(keep) - 1]) != m:
            raise ValueError("expected %d values of truncated, got %d"
                             % (m, cnp.PyArray_SIZE(<cnp.ndarray>keep[len(keep) - 1])))
        if m == 0:
            return _due()
        self._rows(self.act, actions, h_act, NULL)
        if obs is None:
            h_obs.fill(WITHHELD_DIGEST)
        else:
            self._rows(self.obs, obs, h_obs, NULL)
        po = <uint64_t *>cnp.PyArray_DATA(h_obs)
        pa = <uint64_t *>cnp.PyArray_DATA(h_act)
        buf = <StreamBuffer>self.buffers[i]
        for k in range(m):
            buf.put(KIND_STEP, po[k], pa[k], _bits(pr[k], self.is_f32), te[k], tr[k])
        (<uint64_t *>cnp.PyArray_DATA(self.last_obs))[i] = po[m - 1]
        (<int64_t *>cnp.PyArray_DATA(self.counts))[i] += m
        return _due()
