"""A ledger while it is being recorded: buffers, kept values, spills, the final file.

Shared by the env side (one stream) and the trainer side (one stream per env).
It owns what must survive the process, however the process ends:

- Every few seconds (``flush_interval``, 5 s by default) and whenever the
  process goes over its memory limit, the events in memory are written to a
  new spill segment (``PATH.spill/seg-*.npz``). The core signals both: a
  recording call returns True, and the wrapper calls ``attend()``. A spill
  due by time is handed to the process's spiller thread (below), so that no
  step writes or syncs a file for it: the thread writes copies, and the
  recording thread's next call lets go of what they hold (``let_go_written``).
  Past the memory limit, or with kept values, the step spills itself. Small
  segments are merged eight at a time (up to 32 MB), so that a long run keeps
  few files and each event is rewritten a few times at most.
- ``close()`` writes the final file and removes the segments; ``flush()``
  writes the final file and goes on recording.
- A process that exits without ``close()`` writes its ledgers from an atexit
  handler and from a ``multiprocessing.util.Finalize`` callback: worker
  processes leave through ``os._exit``, which skips atexit but not those.
- SIGTERM writes every ledger of the process, then gets its usual effect (the
  previous handler, or death by SIGTERM). A SIGTERM that arrives during a
  write is acted on when the write is done.
- SIGKILL leaves the last segments: everything up to one interval before the
  kill. A process that stops recording (a worker waiting for its next action
  while the trainer updates, a trainer in a long update) is spilled by a daemon
  thread of its own, a tenth of an interval after the spill its recording
  thread did not make (``_IdleSpiller``): the events in memory are copied,
  written to a segment and kept in memory until the recording thread's next
  spill lets go of them, so that nothing is written twice and the step path
  takes no lock.

A write that fails (a full disk, a lost mount) warns once, naming the ledger,
keeps the events in memory and is retried with a growing back-off, so that a
step never pays for a write that cannot succeed. Every file records its run,
its writer and how the recording had ended (the ``META_*`` keys of _schema.py),
so that compare pairs only files of one run and knows an interrupted run from a
boundary fault. It never writes a ledger with no events.
"""

import atexit
import contextlib
import glob
import json
import math
import multiprocessing.util as mp_util
import os
import signal
import tempfile
import threading
import time
import uuid
import warnings

import numpy as np

from stepledger.format import schema as S
from stepledger import core
from stepledger.format import processes
from stepledger.format import storage
from stepledger.__about__ import __version__
from stepledger._fallback import encode_leaves
from stepledger.errors import LedgerError
from stepledger.format.ledgerfile import Segment, segment_from_file, spill_dir, values_member, write_ledger
from stepledger.format.remote import RemoteLedger

_OPEN = {}  # id -> Recording, for the exit handlers; strong refs so nothing is lost to GC
# Reentrant: the SIGTERM handler runs in the main thread between two bytecodes, maybe while that
# thread holds it (a LedgerEnv being built or closed), and closes every recording, taking it again.
_LOCK = threading.RLock()
_HOST = processes.HOST
_MERGE = 8  # segments of one size merged into one
_MERGE_MAX_BYTES = 32 << 20  # but not into one larger than this: big segments are few already
_RETRY = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)  # seconds before retrying a failed write, then every minute
_BUSY = object()  # idle_spill(): another thread holds the recording (it is writing)


class _Process:
    """This process's state: set up once per process (a forked child starts again)."""
    pid = None
    writing = 0            # writes under way (a SIGTERM then waits for them)
    pending_signal = None  # a SIGTERM that arrived during a write
    previous_sigterm = None
    held_sigint = None     # the SIGINT handler set aside while the main thread writes (see _hold_sigint)
    pending_sigint = None  # (signum, frame) of a Ctrl-C that came meanwhile


class _IdleSpiller:
    """This process's daemon thread that spills recordings whose recording thread has gone idle.

    Started at the first event a process records after it has an open
    recording (the core's deadline is set to now until then, so the first
    recording call returns True and calls attend()): a process that only builds
    ledgers, as Gymnasium's AsyncVectorEnv does in the parent for the spaces,
    starts no thread before it forks. It ends when no recording of the process
    is open. Threads do not survive fork: a child starts its own.
    """
    cond = threading.Condition()
    running = False
    failed = False  # could not start a thread (interpreter shutting down): spills stay step-driven

    @classmethod
    def start(cls):
        with cls.cond:
            if cls.running or cls.failed:
                return
            try:
                threading.Thread(target=cls._run, name="stepledger-idle-spill", daemon=True).start()
            except RuntimeError:
                cls.failed = True
                return
            cls.running = True

    @classmethod
    def wake(cls):
        """A recording opened or closed: look at the due times again."""
        with cls.cond:
            cls.cond.notify()

    @classmethod
    def _run(cls):
        cond = cls.cond
        while True:
            with cond:
                mine = _mine()
                if not mine:
                    cls.running = False
                    return
                now = time.monotonic()
                wake = min(rec.idle_due() for rec in mine)
                if wake > now:
                    cond.wait(min(wake - now, 60.0))
                    continue
            busy = False
            for rec in mine:
                if now >= rec.idle_due():
                    busy |= rec.idle_spill() is _BUSY
            _reschedule()
            if busy:  # another thread is writing it: look again in a moment, not in a busy loop
                with cond:
                    cond.wait(0.005)


def _mine():
    pid = os.getpid()
    return [rec for rec in list(_OPEN.values()) if rec.pid == pid and not rec.closed]


def _close_all(state):
    for rec in _mine():
        try:
            rec.close(state=state)
        except Exception as exc:  # at exit or on a signal there is no caller to raise to
            warnings.warn("stepledger could not write %s: %s" % (rec.path, exc), RuntimeWarning)


def _close_all_at_exit():
    _close_all(S.STATE_EXIT)


def _on_sigterm(signum, frame):
    if _Process.writing:
        _Process.pending_signal = signum  # a write is under way: finish it, then act
        return
    _end_by_signal(signum, frame)


def _end_by_signal(signum, frame):
    previous = _Process.previous_sigterm
    if callable(previous):
        # The program handles SIGTERM itself and may go on: write the ledgers, keep recording.
        for rec in _mine():
            try:
                rec.write(state=S.STATE_SIGNAL)
            except Exception as exc:
                warnings.warn("stepledger could not write %s on SIGTERM: %s" % (rec.path, exc), RuntimeWarning)
        previous(signum, frame)
        return
    _close_all(S.STATE_SIGNAL)
    _end_daemonic_children()
    try:
        signal.signal(signum, signal.SIG_DFL)
    except ValueError:  # not the main thread: the default action is all that is left
        pass
    os.kill(os.getpid(), signum)


def _end_daemonic_children(timeout=30.0):
    """Terminate this process's daemonic children (vector env workers), as Python does at any exit.

    Death by SIGTERM skips multiprocessing's exit handler, which would have done
    it: SB3's workers would then wait forever on pipes their siblings hold open.
    Terminated, each writes its own ledgers (its SIGTERM handler) before it goes.
    """
    import multiprocessing
    try:
        children = [p for p in multiprocessing.active_children() if p.daemon]
    except Exception:
        return
    for p in children:
        try:
            p.terminate()
        except Exception:
            pass
    deadline = time.monotonic() + timeout
    for p in children:
        try:
            p.join(max(0.0, deadline - time.monotonic()))
        except Exception:
            pass


@contextlib.contextmanager
def _writing():
    """A write, or a change of what is in memory against what the segments hold: a SIGTERM waits for
    its end, and so does a Ctrl-C in the main thread. A KeyboardInterrupt raised between writing a
    segment and letting go of its events would leave them both in the segment and in memory (written
    twice), or let go of without their count (lost)."""
    holding = _hold_sigint()
    try:
        _Process.writing += 1
        try:
            yield
        finally:
            _Process.writing -= 1
            if _Process.writing == 0 and _Process.pending_signal is not None:
                signum, _Process.pending_signal = _Process.pending_signal, None
                _end_by_signal(signum, None)
    finally:
        if holding:
            _let_sigint_through()


def _hold_sigint():
    """In the main thread, where Python raises KeyboardInterrupt, with a Python handler for SIGINT: set it
    aside until _let_sigint_through(). True if this call did (not already held, not another thread)."""
    if _Process.held_sigint is not None or threading.current_thread() is not threading.main_thread():
        return False
    try:
        previous = signal.getsignal(signal.SIGINT)
        if not callable(previous):
            return False  # ignored, the system's default, or set outside Python: nothing raised meanwhile
        signal.signal(signal.SIGINT, _sigint_held)
    except (ValueError, OSError, TypeError):
        return False
    _Process.held_sigint, _Process.pending_sigint = previous, None
    return True


def _sigint_held(signum, frame):
    _Process.pending_sigint = (signum, frame)


def _let_sigint_through():
    """Put the SIGINT handler back; a Ctrl-C that came meanwhile is handled now (KeyboardInterrupt)."""
    previous, _Process.held_sigint = _Process.held_sigint, None
    pending, _Process.pending_sigint = _Process.pending_sigint, None
    try:
        signal.signal(signal.SIGINT, previous)
    except (ValueError, OSError, TypeError):
        pass
    if pending is not None:
        previous(*pending)


def _hook_process():
    """Exit handlers for this process, once: a Finalize for worker processes, SIGTERM for all."""
    pid = os.getpid()
    if _Process.pid == pid:
        return
    _Process.pid = pid
    mp_util.Finalize(None, _close_all_at_exit, exitpriority=100)
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        previous = signal.getsignal(signal.SIGTERM)
        if previous is _on_sigterm or previous is None or previous == signal.SIG_IGN:
            return  # ours already (inherited through fork), set outside Python, or ignored on purpose
        signal.signal(signal.SIGTERM, _on_sigterm)
        _Process.previous_sigterm = previous
    except (ValueError, OSError):
        pass


def _forget_parent_recordings():
    # A forked child inherits the parent's recordings: never write or spill
    # them from here, and start this process's memory count afresh. The parent's
    # idle spiller is not running here, and its locks may have been held at the fork.
    global _LOCK
    _LOCK = threading.RLock()
    _IdleSpiller.cond, _IdleSpiller.running = threading.Condition(), False
    for key, rec in list(_OPEN.items()):
        if rec.pid != os.getpid():
            _OPEN.pop(key, None)
    core.set_memory_in_use(0)
    core.set_deadline(math.inf)
    _Process.writing, _Process.pending_signal = 0, None
    if _Process.held_sigint is not None:  # forked by another thread while the main one was writing
        _Process.pending_sigint = None  # the parent's Ctrl-C, not this process's
        _let_sigint_through()


atexit.register(_close_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_recordings)


def attend():
    """A recording call returned True: spill what is due (memory over its limit, or an interval past).

    Called by the wrappers on their step path; never raises.
    """
    if not _IdleSpiller.running:
        _IdleSpiller.start()  # the process's first event: spills go on while it is idle
    now = time.monotonic()
    over = core.memory_in_use() > core.memory_limit()
    mine = _mine()
    handed = False
    for rec in mine:
        if rec.let_go_due:
            rec.let_go_written()  # the spiller wrote them: no write here, only memory given back
        if rec.failing():
            continue  # its write failed: the idle spiller tries again, with a back-off, never a step
        if now >= rec.retry_at and (over or now >= rec.due):
            if not over and rec.can_hand_off():
                rec.hand_off(now)  # due by time: the spiller writes, the step goes on
                handed = True
            else:
                rec.tick(now)  # over the memory limit (memory must come back now), or no spiller thread
    if handed:
        _IdleSpiller.wake()
    if core.memory_in_use() > core.memory_limit():
        # Buffers not owned by any open recording (closed, or inherited): do not
        # count them, or every later event would spill again.
        core.set_memory_in_use(sum(rec.nbytes for rec in mine))
    _reschedule()


def spill_everything():
    """Spill every recording of this process now (what attend() does when memory is over)."""
    if not _IdleSpiller.running:
        _IdleSpiller.start()
    mine = _mine()
    for rec in mine:
        rec.spill()
    if core.memory_in_use() > core.memory_limit():
        core.set_memory_in_use(sum(rec.nbytes for rec in mine))  # as attend() does
    _reschedule()


def _reschedule():
    """Tell the core when the recordings of this process next want attention."""
    mine = _mine()
    if not mine:
        core.set_deadline(math.inf)
        return
    if not _IdleSpiller.running and not _IdleSpiller.failed:
        core.set_deadline(0.0)  # the next event calls attend(), which starts the idle spiller
        return
    now = time.monotonic()
    backing_off = any(rec.retry_at > now or rec.failing() for rec in mine)
    due = [max(rec.due, rec.retry_at) for rec in mine if not rec.failing()]
    if any(rec.let_go_due for rec in mine):
        due.append(0.0)  # the spiller wrote: the recording thread's next call lets go of those events
    core.set_deadline(min(due, default=math.inf), hold=backing_off)


def open_recording(path):
    """Another open recording of this process at ``path`` that has recorded, or was given its index
    after construction (LedgerEnv.set_index), else None."""
    target = os.path.abspath(path) if not storage.is_remote(path) else path
    for rec in _mine():
        same = (os.path.abspath(rec.path) if not rec.remote else rec.path) == target
        if same and (rec.n_events() or rec.deferred):
            return rec
    return None


def flush_interval(value, owner):
    """Seconds between periodic spills: ``value``, else $STEPLEDGER_FLUSH_INTERVAL, else the default."""
    if value is None:
        text = os.environ.get(S.ENV_FLUSH_INTERVAL)
        if not text:
            return S.DEFAULT_FLUSH_INTERVAL
        try:
            value = float(text)
        except ValueError:
            raise ValueError("%s: %s must be a number of seconds, got %r" % (owner, S.ENV_FLUSH_INTERVAL, text)) from None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not value > 0:
        raise ValueError("%s: flush_interval must be a positive number of seconds (math.inf: only on memory "
                         "and at the end), got %r" % (owner, value))
    return float(value)


class ValueStore:
    """Kept values of one stream: one growable array per space leaf, and the encodings
    of values that do not fit those arrays (another shape than the space's, or a space
    whose values vary in size). The per-event encoding lengths of a field are allocated
    at its first such value, so that values that always fit cost nothing more."""

    def __init__(self, members):
        self.members = members  # [(name, dtype, row_shape, field, leaf index)]
        self.fields = ("obs", "act")
        self.n_leaves = {f: sum(1 for m in members if m[3] == f) for f in self.fields}
        self.row_bytes = sum(np.dtype(dt).itemsize * int(np.prod(shape, dtype=np.int64))
                             for _, dt, shape, _, _ in members)
        self._empty()

    def _empty(self):
        self.n = 0
        self.capacity = 64
        self.arrays = {name: np.zeros((64,) + tuple(shape), dtype) for name, dtype, shape, _, _ in self.members}
        self.enc_len = dict.fromkeys(self.fields)  # field -> uint32 lengths, once a value needed encoding
        self.enc = {f: np.zeros(0, np.uint8) for f in self.fields}
        self.enc_used = dict.fromkeys(self.fields, 0)

    def nbytes(self):
        """Bytes of kept values held: the rows, the encodings and their lengths."""
        lengths = sum(4 * self.n for f in self.fields if self.enc_len[f] is not None)
        return self.n * self.row_bytes + sum(self.enc_used.values()) + lengths

    def _fits(self, field, leaves):
        if len(leaves) != self.n_leaves[field]:
            return False
        for name, _, shape, f, j in self.members:
            if f == field and leaves[j].shape != tuple(shape):
                return False
        return True

    def append(self, obs_leaves, act_leaves):
        n = self.n
        if n == self.capacity:
            self.capacity = 2 * n
            for name, arr in list(self.arrays.items()):
                new = np.zeros((2 * n,) + arr.shape[1:], arr.dtype)
                new[:n] = arr
                self.arrays[name] = new
            for f in self.fields:
                if self.enc_len[f] is not None:
                    new = np.zeros(2 * n, np.uint32)
                    new[:n] = self.enc_len[f]
                    self.enc_len[f] = new
        extra = 0
        given = {"obs": obs_leaves, "act": act_leaves}
        fits = {}
        for f in self.fields:
            leaves = given.get(f)
            fits[f] = leaves is not None and self._fits(f, leaves)
            if leaves is not None and not fits[f]:
                # another shape than the space's: keep the value itself, as its digest saw it
                if self.enc_len[f] is None:
                    self.enc_len[f] = np.zeros(self.capacity, np.uint32)
                    extra += 4 * n  # the lengths of the rows before, now held too
                extra += self._encode(f, n, leaves)
            elif self.enc_len[f] is not None:
                self.enc_len[f][n] = 0
            if self.enc_len[f] is not None:
                extra += 4
        for name, dtype, shape, field, j in self.members:
            self.arrays[name][n] = given[field][j] if fits[field] else 0
        self.n = n + 1
        return core.account(self.row_bytes + extra)

    def _encode(self, field, n, leaves):
        data = np.frombuffer(encode_leaves(leaves), np.uint8)
        if data.shape[0] >= 1 << 32:
            self.enc_len[field][n] = 0
            return 0  # too large to note: left out, the digest still tells
        used, buf = self.enc_used[field], self.enc[field]
        if used + data.shape[0] > buf.shape[0]:
            new = np.zeros(max(2 * buf.shape[0], used + data.shape[0], 256), np.uint8)
            new[:used] = buf[:used]
            self.enc[field] = buf = new
        buf[used: used + data.shape[0]] = data
        self.enc_used[field] = used + data.shape[0]
        self.enc_len[field][n] = data.shape[0]
        return int(data.shape[0])

    def rows(self, start, stop, copy=False):
        """Kept rows [start, stop) as arrays by member name: views, valid until the store changes, or copies.

        From another thread than the one appending, with ``stop`` at most the
        ``n`` read before: rows below ``n`` are never written again, an array
        that grows is replaced by one that holds them too, and the bytes of a
        row's encoding are in place before its length is.
        """
        take = (lambda a: a.copy()) if copy else (lambda a: a)
        out = {name: take(arr[start:stop]) for name, arr in list(self.arrays.items())}
        for f in self.fields:
            lengths = self.enc_len[f]
            if lengths is None:
                out[S.ENCODED_LENGTH_MEMBER.format(field=f)] = np.zeros(stop - start, np.uint32)
                out[S.ENCODED_MEMBER.format(field=f)] = np.zeros(0, np.uint8)
                continue
            begin = int(lengths[:start].sum(dtype=np.uint64))
            end = begin + int(lengths[start:stop].sum(dtype=np.uint64))
            out[S.ENCODED_LENGTH_MEMBER.format(field=f)] = take(lengths[start:stop])
            out[S.ENCODED_MEMBER.format(field=f)] = take(self.enc[f][begin:end])
        return out

    def clear(self):
        """Forget the kept rows (they are on disk) and give their memory back."""
        core.account(-self.nbytes())
        self._empty()


class _SegmentFile:
    """A spill segment this recording wrote: segment numbers [first, last], its merge level."""

    def __init__(self, first, last, level, path, local):
        self.first, self.last, self.level, self.path, self.local = first, last, level, path, local


def segment_name(first):
    return "seg-%06d.npz" % first


class Recording:
    """The streams of one ledger file while they are recorded."""

    def __init__(self, path, side, stream_ids, obs_layout, act_layout, reward_dtype, keep_values, extra_meta=None,
                 interval=S.DEFAULT_FLUSH_INTERVAL, owner="stepledger"):
        self.path = os.fspath(path)
        # A URL other than file://: files are staged in a local directory, then uploaded (uploader.py).
        self.remote = storage.is_remote(self.path)
        self._remote = None
        if self.remote:
            _check_remote(self.path)
            # one-line errors now (no bucket, refused, unreachable); closed at exit while uploads can run
            self._remote = RemoteLedger(self.path, on_exit=lambda: self.close(S.STATE_EXIT))
        self._flushes = 0
        self.published = True  # False once the final file could not be uploaded (it is kept locally)
        self.side = side
        self.owner = owner
        self.stream_ids = [int(i) for i in stream_ids]
        self.obs_layout, self.act_layout = obs_layout, act_layout
        self.reward_dtype = np.dtype(reward_dtype)
        self.keep_values = bool(keep_values)
        self.value_members = []
        if self.keep_values:
            for field, layout in (("obs", obs_layout), ("act", act_layout)):
                for j, leaf in enumerate(layout.leaves):
                    self.value_members.append((values_member(field, j), leaf.dtype, leaf.shape, field, j))
        self.extra_meta = dict(extra_meta or {})
        self.writer = uuid.uuid4().hex[:16]
        self.run = self.writer if side == "trainer" else None  # the env side learns it from the trainer
        self.position = None
        self.started = time.time()
        self.interrupted = False
        self.pid = os.getpid()
        self.closed = False
        self.interval = float(interval)
        self.due = time.monotonic() + self.interval
        # the idle spiller acts this long after a spill was due and the recording thread did not make it
        self.grace = min(0.1 * self.interval, 1.0)
        self.retry_at = 0.0
        self._failures = 0
        # A periodic spill is handed to the spiller thread (handed), which writes copies; once they
        # are in a segment (let_go_due) the recording thread's next call lets go of them.
        self.handed = False
        self.let_go_due = False
        self._lock = threading.RLock()
        self._thread = threading.get_ident()
        self._segs = []  # _SegmentFile, in order
        self._next_segment = 0
        self._done = [0] * len(self.stream_ids)  # events of each buffer in segments already (idle spills)
        self._written_events = 0
        self.written = None  # (inode, mtime in ns) of the final file as this recording last wrote it
        self._spilled_events = 0
        self._cleaned = False
        self._final_written = False  # close() wrote the final file
        self._lock_path = None
        self.deferred = False  # env side: its index was given after construction (LedgerEnv.set_index)
        if not self.remote:
            self._check_path()
        self.buffers = [core.StreamBuffer() for _ in self.stream_ids]
        self.values = [ValueStore(self.value_members) for _ in self.stream_ids] if self.keep_values else None
        with _LOCK:
            _OPEN[id(self)] = self
        _hook_process()
        _IdleSpiller.wake()
        _reschedule()

    # ------------------------------------------------------------ claiming the path

    def _check_path(self):
        """At construction: the path can be written, and no other open recording of this process is writing it."""
        target = os.path.abspath(self.path)
        for rec in _mine():
            # Only one that has recorded: Gymnasium builds throwaway envs in the parent (for their
            # spaces) and closes them later. Two that both record meet at the first write (_claim).
            if rec is not self and not rec.remote and os.path.abspath(rec.path) == target and rec.n_events():
                raise LedgerError("%s: %s is already being recorded by another open ledger in this process; "
                                  "give each env its own index= (or each trainer ledger its own path)"
                                  % (self.owner, self.path))
        check_writable(self.path, self.owner)

    def _claim(self):
        """Before the first write: claim the path with a lock file naming this process.

        A claim held by another live process (two envs given the same index):
        this one records to ``NAME.dup-{writer}.npz`` instead and warns, so that
        nothing is overwritten and compare can name both. A claim left by a
        process that is gone is taken over. Taken at the first write, not at
        construction, so that a ledger that records nothing leaves nothing.
        """
        if self.remote or self._lock_path is not None:
            return
        for _ in range(5):
            lock = self.path + S.LOCK_SUFFIX
            # Written whole under a temporary name, then linked to the lock's name, which fails if
            # it exists: a lock is never seen empty, half written or by two writers at once.
            tmp = processes.tmp_name(lock)
            try:
                with open(tmp, "w") as f:
                    json.dump(self._holder(), f)
                os.link(tmp, lock)
            except FileExistsError:
                holder = _read_lock(lock)
                if holder is not None and _alive(holder) and holder.get(S.META_WRITER) != self.writer:
                    self._record_beside(holder)
                    continue
                try:
                    os.unlink(lock)  # left by a process that is gone
                except FileNotFoundError:
                    pass
                continue
            except OSError as exc:
                raise LedgerError("%s: cannot write the ledger %s (%s)" % (self.owner, self.path,
                                                                         exc.strerror or exc)) from None
            finally:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            self._lock_path = lock
            earlier = self._same_run_writer()
            if earlier is None:
                return
            # Another recording of this run wrote this file and has closed since: a second env
            # given the same index. Record beside it rather than replace it.
            self._release_claim()
            self._record_beside(earlier)
        raise LedgerError("%s: could not claim %s (its lock file keeps changing)" % (self.owner, self.path))

    def _holder(self):
        """What a lock file says of the recording that holds it: its process (pid and start time, see
        processes.py), host, writer id, when it began and its run."""
        holder = {S.META_PID: self.pid, S.META_HOST: _HOST, S.META_WRITER: self.writer, S.META_STARTED: self.started,
                  S.META_RUN: self.run}
        start = processes.own_start()
        if start is not None:
            holder[S.META_PID_START] = start
        return holder

    def _same_run_writer(self):
        """The meta of the file at this path if another recording of this same run wrote it, else None."""
        if self.run is None or not os.path.exists(self.path):
            return None
        try:
            from stepledger.format.ledgerfile import LedgerFile
            lf = LedgerFile(self.path, verify=False)
        except Exception:
            return None
        try:
            meta = lf.meta
        finally:
            lf.close()
        if meta.get(S.META_RUN) == self.run and meta.get(S.META_WRITER) not in (None, self.writer):
            return meta
        return None

    def claim(self):
        """Claim the path now if this recording is about to write (see _claim); the path may change."""
        with self._lock:
            if self.n_events() and not self.closed and self.pid == os.getpid():
                self._claim()

    def _record_beside(self, holder):
        base, ext = os.path.splitext(self.path)
        beside = "%s%s%s%s" % (base, S.DUPLICATE_INFIX, self.writer[:8], ext)
        warnings.warn("stepledger: %s is being recorded by another ledger (process %s) right now; this one records "
                      "%s instead, and compare will name both: give each env its own index="
                      % (self.path, holder.get(S.META_PID), beside), RuntimeWarning, stacklevel=5)
        self.path = beside

    def _release_claim(self):
        if self._lock_path is not None:
            try:
                os.unlink(self._lock_path)
            except OSError:
                pass
            self._lock_path = None

    # ------------------------------------------------------------ what the wrappers tell it

    def link(self, run, position):
        """The trainer side's run id and this env's position in its vector env (env side)."""
        self.run = None if run is None else str(run)
        self.position = None if position is None else int(position)

    # ------------------------------------------------------------ state

    @property
    def nbytes(self):
        n = sum(len(b) for b in self.buffers) * S.BYTES_PER_EVENT
        if self.values:
            n += sum(v.nbytes() for v in self.values)
        return n

    @property
    def segments(self):
        """The spill segment files on disk now (merged ones cover several spills), in order."""
        return [s.path for s in self._segs]

    @property
    def spills(self):
        """How many times this recording has spilled."""
        return self._next_segment

    def n_events(self):
        return sum(len(b) for b in self.buffers) + self._spilled_events

    def meta(self, state=S.STATE_OPEN, segment=None, through=None):
        meta = {
            S.META_FORMAT: S.FORMAT_NAME,
            S.META_FORMAT_VERSION: S.FORMAT_VERSION,
            S.META_SIDE: self.side,
            S.META_REWARD_DTYPE: self.reward_dtype.name,
            S.META_OBS_SPACE: self.obs_layout.description,
            S.META_ACT_SPACE: self.act_layout.description,
            S.META_VERSION: __version__,
            S.META_KEEP_VALUES: self.keep_values,
            S.META_RUN: self.run,
            S.META_WRITER: self.writer,
            S.META_STARTED: round(self.started, 3),
            S.META_UPDATED: round(time.time(), 3),
            S.META_STATE: state,
            S.META_HOST: _HOST,
            S.META_PID: self.pid,
        }
        start = processes.own_start()  # a file is written only by the process that opened the recording
        if start is not None:
            meta[S.META_PID_START] = start
        if self.position is not None:
            meta[S.META_POSITION] = self.position
        meta.update(self.extra_meta)
        if segment is not None:
            meta[S.META_SEGMENT] = segment
            if through is not None and through != segment:
                meta[S.META_THROUGH] = through
        return meta

    def _memory_segment(self):
        """The events in memory that no segment holds yet, and where each stream's are cut.

        On the recording thread: views, valid until the buffers change. From
        another thread the recording thread may append meanwhile: copies, each
        buffer's made whole in one call of the core (a buffer that grows moves),
        cut where both its events and its kept values are complete.
        """
        other = threading.get_ident() != self._thread
        columns, values, cuts = {}, {}, []
        for k, (s, buf) in enumerate(zip(self.stream_ids, self.buffers)):
            done = self._done[k]
            store = self.values[k] if self.values else None
            kept = store.n if store is not None else None  # before the events: the rows below it stay as they are
            cols = buf.columns() if other else buf.views()
            cut = len(cols["kind"]) if kept is None else min(kept, len(cols["kind"]))
            columns[s] = {n: v[done:cut] for n, v in cols.items()}
            if store is not None:
                values[s] = store.rows(done, cut, copy=other)
            cuts.append(cut)
        return Segment(columns, values), cuts

    def _value_specs(self):
        specs = [(name, dt, shape) for name, dt, shape, _, _ in self.value_members]
        if self.keep_values:  # a row shape of None: a member as long as its segments' arrays together
            for field in ("obs", "act"):
                specs.append((S.ENCODED_LENGTH_MEMBER.format(field=field), np.uint32, ()))
                specs.append((S.ENCODED_MEMBER.format(field=field), np.uint8, None))
        return specs


    # ------------------------------------------------------------ periodic work

    def tick(self, now, spill=None, due=None):
        """Spill now (an interval passed or memory is over); on failure warn once and back off.
        Due again ``due`` (by default one interval from now)."""
        try:
            (spill or self.spill)()
        except Exception as exc:
            if self._failures == 0:
                warnings.warn("stepledger: cannot write the ledger %s (%s); its events stay in memory and the "
                              "write is retried, less and less often" % (self.path, _short(exc)),
                              RuntimeWarning, stacklevel=4)
            self.retry_at = now + _RETRY[min(self._failures, len(_RETRY) - 1)]
            self._failures += 1
        else:
            if self._failures:
                warnings.warn("stepledger: the ledger %s is being written again" % self.path, RuntimeWarning,
                              stacklevel=4)
            self._failures, self.retry_at = 0, 0.0
        self.due = now + self.interval if due is None else due

    def failing(self):
        """Its last write failed, and the idle spiller retries it (off the step path)."""
        return self._failures > 0 and _IdleSpiller.running

    def idle_due(self):
        """When the spiller thread should spill this recording: at once if the recording thread handed
        it a periodic spill, else a little after one was due that the recording thread did not make."""
        if self.handed:
            return self.retry_at
        return max(self.due, self.retry_at) + self.grace

    def can_hand_off(self):
        """A periodic spill of this recording can go to the spiller thread: it runs, this is the recording
        thread, and no values are kept (their store is let go of whole, by the recording thread's spill)."""
        return _IdleSpiller.running and not self.keep_values and threading.get_ident() == self._thread

    def hand_off(self, now):
        """On the recording thread, when a periodic spill is due: no write here. The spiller thread writes
        the events no segment holds (copies), and this thread lets go of them afterwards."""
        self.handed = True
        self.due = now + self.interval

    def let_go_written(self):
        """On the recording thread: forget the events that the spiller's segments hold (the first
        ``_done[k]`` of each buffer); the events recorded since stay. Never waits: if another thread
        holds the recording (the spiller writing again), this is done after its next write."""
        self.let_go_due = False
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self.closed or self.pid != os.getpid() or threading.get_ident() != self._thread or self.keep_values:
                return  # kept values are let go of whole, with their events, by spill()
            with _writing():  # a SIGTERM meanwhile writes the ledger once the buffers and _done agree again
                done = self._done
                for k, buf in enumerate(self.buffers):
                    buf.drop_front(done[k])
                    self._spilled_events += done[k]
                    done[k] = 0
        finally:
            self._lock.release()

    def idle_spill(self):
        """From the idle spiller: the recording thread did not spill when it was due (it is not stepping).

        Writes the events in memory that no segment holds, from copies, to a new
        segment, and keeps them in memory: only the recording thread lets go of
        events (its next spill writes what came after them), so that an event
        appended meanwhile is neither lost nor written twice. Never waits for
        the recording thread: if it is writing, this is left to it.
        """
        if not self._lock.acquire(blocking=False):
            return _BUSY
        try:
            if self.closed or self.pid != os.getpid():
                return
            now = time.monotonic()
            if now < self.idle_due():
                return  # spilled meanwhile
            handed, self.handed = self.handed, False
            if not handed:
                # Due again one interval on, before the write: a step that comes meanwhile does not wait for it.
                self.due = now + self.interval
            self.tick(now, self._spill_copies, self.due if handed else None)
            if not self.keep_values and any(self._done):
                self.let_go_due = True  # _reschedule() then has the recording thread's next call let go
        finally:
            self._lock.release()

    def _spill_copies(self):
        segment, cuts = self._memory_segment()
        if any(c > d for c, d in zip(cuts, self._done)):
            self._write_spill(segment)
            self._done = cuts
            self._merge()

    def _clean_leftovers(self):
        """Before this recording first writes: remove what killed writers of this path left."""
        if self._cleaned:
            return
        self._claim()
        self._cleaned = True
        if self.remote:
            return
        for tmp in glob.glob(glob.escape(self.path) + S.TMP_INFIX + "*") + \
                glob.glob(os.path.join(glob.escape(spill_dir(self.path)), "*" + S.TMP_INFIX + "*")):
            writer = processes.tmp_writer(tmp)
            # this process's own writes in progress (the spiller thread's) run: they stay
            if writer is not None and not processes.running(*writer):
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def flush(self):
        """Write what is new since the last write, as a spill segment: the cost is that of the new
        events, not of the whole history. At a URL, wait for its upload (or the uploader giving up).

        From a thread other than the one that records, events may be appended while the segment is
        written, and a spill would let go of them with the rest: there the final file is written
        instead, from copies (the whole history, as close() writes it), and nothing is let go of.
        """
        if threading.get_ident() != self._thread:
            self.write()
            return
        try:
            self.spill()
        except OSError as exc:  # its events stay in memory: a later spill, or close(), writes them
            raise LedgerError("%s: cannot write the ledger %s (%s)" % (self.owner, self.path, _short(exc))) \
                from None
        if self.remote and not self.closed:
            self._remote.wait()

    def spill(self):
        """Write the events in memory to a new spill segment and free them (the recording thread only)."""
        with self._lock, _writing():
            if self.closed or self.pid != os.getpid():
                return
            n = sum(len(b) for b in self.buffers)
            if n == 0:
                self.due = time.monotonic() + self.interval  # nothing new: due again one interval on
                return
            if n > sum(self._done):
                self._write_spill(self._memory_segment()[0])
            # Only now, with the events safely on disk, are they let go of (and their pages given back).
            for buf in self.buffers:
                buf.release()
            if self.values:
                for store in self.values:
                    store.clear()
            self._done = [0] * len(self.buffers)
            self._spilled_events += n
            self.due = time.monotonic() + self.interval
            self._merge()

    def _write_spill(self, segment):
        """Write ``segment`` (events no segment holds yet) as the next spill segment.

        Once this returns the segment holds them: the caller marks them written before it merges
        (``_merge``), so that a merge that fails (a full disk, a segment that cannot be read back)
        leaves segments unmerged, never events written twice by the retry."""
        self._clean_leftovers()
        first = not self._segs
        k = self._next_segment
        path, local = self._write_segment(k, k, [segment], before=self._remove_earlier_run if first else None)
        self._segs.append(_SegmentFile(k, k, 0, path, local))
        self._next_segment = k + 1
        if first and not self.remote:
            # An earlier run's pieces, and its final file unless this recording
            # wrote it: if this process is killed, read() must find this run's
            # segments, not an older run's ledger. Only now, with this run's first
            # segment in place: a reader meanwhile finds the earlier run's ledger and
            # this one's segment, and takes the recording that began last, never
            # nothing. (At a URL the uploader does it, before the first upload.)
            self._remove_stale_segments()
            if self._written_events == 0:
                _remove(self.path, False)

    def _write_segment(self, first, last, segments, before=None):
        name = segment_name(first)
        meta = self.meta(segment=first, through=last)
        if self.remote:
            # Staged locally, kept there to assemble the final file, and uploaded in the
            # background so that a reader finds this run's events on the storage even if the
            # process is killed; the step does not wait for the network. The earlier run's
            # pieces are removed first, in the same background job.
            path, local = storage.join(spill_dir(self.path), name), self._remote.stage_path(name)
            write_ledger(local, meta, self.stream_ids, segments, self._value_specs(), final=False)
            self._remote.upload_segment(local, path, before=before)
        else:
            os.makedirs(spill_dir(self.path), exist_ok=True)
            path = local = os.path.join(spill_dir(self.path), name)
            write_ledger(path, meta, self.stream_ids, segments, self._value_specs(), final=False)
        return path, local

    def _merge(self):
        """Merge the last _MERGE segments while they are of one size: few files, each event rewritten rarely."""
        # Local ledgers only: at a URL each merge would be another upload of what is uploaded already.
        while not self.remote and len(self._segs) >= _MERGE and len({s.level for s in self._segs[-_MERGE:]}) == 1:
            group = self._segs[-_MERGE:]
            if sum(_size(s.local) for s in group) > _MERGE_MAX_BYTES:
                return
            opened = [segment_from_file(s.local) for s in group]
            try:
                # Replaces the group's first file: a reader meanwhile sees either it alone, or the
                # merged file, whose meta says which segments it covers, next to those it covers.
                path, local = self._write_segment(group[0].first, group[-1].last, [seg for seg, _ in opened])
            finally:
                for _, handle in opened:
                    handle.close()
            for s in group[1:]:
                _remove(s.path, self.remote)
                if self.remote and s.local != s.path:
                    _remove(s.local, False)
            self._segs[-_MERGE:] = [_SegmentFile(group[0].first, group[-1].last, group[0].level + 1, path, local)]

    def _remove_earlier_run(self):
        """At a URL, before the first segment is uploaded: an earlier run's segments, and its final file
        unless this recording wrote it (run by the uploader's thread)."""
        self._remove_stale_segments()
        if self._written_events == 0 and storage.exists(self.path):
            storage.remove(self.path)

    def _unlink_segments(self):
        if self.remote:
            if not self._segs:
                return  # write() has just removed whatever an earlier run left in the spill directory
            # Everything in the spill directory: also segments of an earlier run that a failed
            # upload left there, which would otherwise be read in place of the final file.
            try:
                directory = spill_dir(self.path)
                storage.remove_all([storage.join(directory, n) for n in storage.listdir(directory)
                                    if n.startswith("seg-")])
            except Exception:
                pass
            return
        for s in self._segs:
            _remove(s.path, False)

    def _remove_stale_segments(self):
        """Remove spill segments in this ledger's spill directory that this recording did not write."""
        mine = {s.path for s in self._segs}
        if self.remote:
            if not self._remote.earlier_segments:
                return
            self._remote.earlier_segments = False
            directory = spill_dir(self.path)
            for name in storage.listdir(directory):
                old = storage.join(directory, name)
                if name.startswith("seg-") and old not in mine:
                    _remove(old, True)
            return
        for old in glob.glob(os.path.join(glob.escape(spill_dir(self.path)), "seg-*")):  # also writes cut short
            if old not in mine:
                _remove(old, False)
        if not mine:
            try:
                os.rmdir(spill_dir(self.path))  # an earlier run's, empty now
            except OSError:
                pass

    # ------------------------------------------------------------ the final file

    def write(self, state=S.STATE_OPEN, wait=True):
        """Write the final file from the spilled segments and the events in memory.

        Recording may go on; a later write replaces the file with a longer one.
        A recording with no events writes nothing. ``state`` goes in its meta:
        how the recording had ended. At a URL the file is uploaded before this
        returns, or with ``wait=False`` in the background (a periodic flush); if
        the upload fails the file is kept on local disk and a line says where
        (uploader.py), and ``self.published`` is False.
        """
        with self._lock, _writing():
            if self.pid != os.getpid() or self.closed:
                return 0
            if self.n_events() == 0:
                return 0
            self._clean_leftovers()
            opened = [segment_from_file(s.local) for s in self._segs]
            try:
                segments = [seg for seg, _ in opened] + [self._memory_segment()[0]]
                if self.remote:
                    target = self._remote.stage_path("ledger.npz" if wait else "flush-%d.npz" % self._flushes)
                    self._flushes += 1
                else:
                    target = self.path
                try:
                    total = write_ledger(target, self.meta(state), self.stream_ids, segments, self._value_specs())
                except OSError as exc:
                    raise LedgerError("%s: cannot write the ledger %s (%s)" % (self.owner, self.path, _short(exc))) \
                        from None
            finally:
                for _, handle in opened:
                    handle.close()
            if self.remote:
                if wait:
                    self.published = self._remote.publish_final(target)
                else:
                    self._remote.upload_segment(target, self.path, remove=True)
            self._written_events = total
            if not self.remote:
                try:
                    st = os.stat(target)
                    self.written = (st.st_ino, st.st_mtime_ns)
                except OSError:
                    pass
            if not self._segs and (not self.remote or wait):
                # Segments of an earlier run would hold more events than this file
                # and be read in its place.
                self._remove_stale_segments()
            return total

    def discard(self):
        """Drop everything recorded, writing nothing (benchmarks, aborted runs)."""
        with self._lock:
            if self.pid != os.getpid():
                return
            if self.remote:
                self._remote.stop()
            self._unlink_segments()
            self._segs = []
            self._release()

    def close(self, state=None):
        """Write the final file, remove the spill segments and free the buffers.

        ``state`` says how the recording ended; by default closed, or interrupted
        if an exception escaped a step or reset it recorded.
        """
        with self._lock:
            if self.closed or self.pid != os.getpid():
                return
            if state is None or state == S.STATE_CLOSED:
                state = S.STATE_INTERRUPTED if self.interrupted else S.STATE_CLOSED
            kept = False
            try:
                if self.remote:
                    self._remote.stop()  # the final file supersedes the segments still queued
                if not self._final_written:
                    try:
                        self.write(state)
                    except LedgerError as exc:
                        kept = True  # still open, nothing let go of
                        raise LedgerError("%s; its events are kept in memory: make room and call close() again "
                                          "(it is tried again at exit)" % exc) from None
                    # A close from a signal handler that cuts into the rest of this one (a SIGTERM to a worker
                    # handling its Ctrl-C) finishes it: the segments, some removed already, are not read again.
                    self._final_written = True
                if not self.published:
                    return  # kept on local disk; the segments in storage stay, a partial ledger until it is pushed
                self._unlink_segments()
                if self._segs:
                    try:
                        storage.rmdir(spill_dir(self.path)) if self.remote else os.rmdir(spill_dir(self.path))
                    except Exception:
                        pass
            finally:
                if not kept:
                    self._release()

    def _release(self):
        """Closed for good: free the buffers and kept values, drop the staging area, leave the registry."""
        if self.remote:
            self._remote.stop()
            self._remote.remove_stage()
        self._release_claim()
        self.closed = True
        for b in self.buffers:
            b.release()
        if self.values:
            for v in self.values:
                v.clear()
        with _LOCK:
            _OPEN.pop(id(self), None)
        _IdleSpiller.wake()
        _reschedule()


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _remove(path, remote):
    try:
        storage.remove(path) if remote else os.unlink(path)
    except Exception:
        pass


def _short(exc):
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


def _alive(holder):
    """Whether the process named in a lock file is still running (on another host: assume it is not)."""
    try:
        pid = int(holder.get(S.META_PID))
    except (TypeError, ValueError):
        return False
    if holder.get(S.META_HOST) != _HOST:
        return False
    start = holder.get(S.META_PID_START)
    if pid == os.getpid() and start in (None, processes.own_start()):  # this process: alive while that
        return any(rec.writer == holder.get(S.META_WRITER) for rec in _mine())  # recording is open here
    return processes.running(pid, start)


def _read_lock(path):
    try:
        with open(path) as f:
            holder = json.load(f)
        return holder if isinstance(holder, dict) else None
    except (OSError, ValueError):
        return None


def check_writable(path, owner):
    """A one-line error now, not after the run, if a ledger file cannot be written at ``path``."""
    if os.path.isdir(path):
        raise LedgerError("%s: %s is a directory; give the ledger's file name, for example %s"
                          % (owner, path, os.path.join(path, "trainer.npz")))
    parent = os.path.dirname(os.path.abspath(path))
    check_directory(parent, owner)


def check_directory(directory, owner):
    """Create ``directory`` if needed; a one-line error if it is a file or cannot be created or written."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise LedgerError("%s: %s is a file, not a directory" % (owner, directory))
    try:
        os.makedirs(directory, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise LedgerError("%s: cannot create the directory %s: part of its path is a file" % (owner, directory)) \
            from None
    except OSError as exc:
        raise LedgerError("%s: cannot create the directory %s (%s)" % (owner, directory, exc.strerror or exc)) \
            from None
    try:  # a real write: permissions, a read-only mount and a full disk all show here, not after the run
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".stepledger-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise LedgerError("%s: cannot write in the directory %s (%s)" % (owner, directory, exc.strerror or exc)) \
            from None


def check_reward_dtype(reward_dtype, owner):
    """The reward dtype as a numpy dtype; float32 or float64, else a one-line error."""
    try:
        dtype = np.dtype(reward_dtype)
    except TypeError:
        dtype = None
    if dtype is None or dtype.name not in S.REWARD_DTYPES:
        raise ValueError("%s: reward_dtype must be np.float32 or np.float64, got %r" % (owner, reward_dtype))
    return dtype


def check_path(path, owner, what):
    """A path as a string: a local path, a file:// URL made local, or another fsspec URL as given."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError("%s: %s must be a path or URL, got %r" % (owner, what, path))
    return storage.local_path(os.fspath(path))


_WARNED_MEMORY = []


def _check_remote(url):
    """One-line error now, not at close, if the URL cannot be used; warn about memory:// in a child process."""
    storage.check(url)
    if not _WARNED_MEMORY and storage.protocol(url) == "memory":
        import multiprocessing
        if multiprocessing.parent_process() is not None:
            _WARNED_MEMORY.append(True)
            warnings.warn("stepledger: %s is in this process's memory only; a ledger written there from a worker "
                          "process is not visible to the trainer's process" % url, RuntimeWarning, stacklevel=4)
