"""A ledger while it is being recorded: buffers, kept values, spills, the final file.

Shared by the env side (one stream) and the trainer side (one stream per env).
It owns what must survive the process: spill segments are written when the
process goes over its memory limit, and the final file on ``write()``,
``close()`` and at interpreter exit. It never writes a ledger with no events.
"""

import atexit
import glob
import os
import threading
import warnings

import numpy as np

from . import _schema as S
from . import core
from . import storage
from .__about__ import __version__
from ._fallback import encode_leaves
from .ledgerfile import Segment, spill_dir, values_member, write_ledger
from .uploader import RemoteLedger

_OPEN = {}  # id -> Recording, for the exit handler; strong refs so nothing is lost to GC
_LOCK = threading.Lock()


def _close_all_at_exit():
    for rec in list(_OPEN.values()):
        if rec.pid == os.getpid():
            try:
                rec.close()
            except Exception as exc:  # at exit there is no caller to raise to
                warnings.warn("stepledger could not write %s at exit: %s" % (rec.path, exc))


def _forget_parent_recordings():
    # A forked child inherits the parent's recordings: never write or spill
    # them from here, and start this process's memory count afresh.
    for key, rec in list(_OPEN.items()):
        if rec.pid != os.getpid():
            _OPEN.pop(key, None)
    core.set_memory_in_use(0)


atexit.register(_close_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_recordings)


def spill_everything():
    """Spill every recording of this process to disk: the memory limit was reached."""
    for rec in list(_OPEN.values()):
        if rec.pid == os.getpid():
            rec.spill()
    if core.memory_in_use() > core.memory_limit():
        # Buffers not owned by any open recording (closed, or inherited): do not
        # count them, or every later event would spill again.
        core.set_memory_in_use(sum(rec.nbytes for rec in _OPEN.values() if rec.pid == os.getpid()))


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

    def segment_values(self):
        """The kept rows as arrays by member name (views, valid until the store changes)."""
        out = {name: arr[: self.n] for name, arr in self.arrays.items()}
        for f in self.fields:
            lengths = self.enc_len[f]
            out[S.ENCODED_LENGTH_MEMBER.format(field=f)] = (np.zeros(self.n, np.uint32) if lengths is None
                                                            else lengths[: self.n])
            out[S.ENCODED_MEMBER.format(field=f)] = self.enc[f][: self.enc_used[f]]
        return out

    def clear(self):
        """Forget the kept rows (they are on disk) and give their memory back."""
        core.account(-self.nbytes())
        self._empty()


class Recording:
    """The streams of one ledger file while they are recorded."""

    def __init__(self, path, side, stream_ids, obs_layout, act_layout, reward_dtype, keep_values, extra_meta=None):
        self.path = os.fspath(path)
        # A URL other than file://: files are staged in a local directory, then uploaded (uploader.py).
        self.remote = storage.is_remote(self.path)
        self._remote = None
        if self.remote:
            _check_remote(self.path)
            # one-line errors now (no bucket, refused, unreachable); closed at exit while uploads can run
            self._remote = RemoteLedger(self.path, on_exit=self.close)
        self.side = side
        self.stream_ids = [int(i) for i in stream_ids]
        self.buffers = [core.StreamBuffer() for _ in self.stream_ids]
        self.obs_layout, self.act_layout = obs_layout, act_layout
        self.reward_dtype = np.dtype(reward_dtype)
        self.keep_values = bool(keep_values)
        self.value_members = []
        if self.keep_values:
            for field, layout in (("obs", obs_layout), ("act", act_layout)):
                for j, leaf in enumerate(layout.leaves):
                    self.value_members.append((values_member(field, j), leaf.dtype, leaf.shape, field, j))
        self.values = [ValueStore(self.value_members) for _ in self.stream_ids] if self.keep_values else None
        self.extra_meta = dict(extra_meta or {})
        self.segments = []  # paths of the spill segments this recording wrote, in order
        self._segment_files = []  # the same segments as local files (their staged copies for a URL)
        self.pid = os.getpid()
        self.closed = False
        self._written_events = 0
        self._spilled_events = 0
        self._flushes = 0
        self.published = True  # False once the final file could not be uploaded (it is kept locally)
        with _LOCK:
            _OPEN[id(self)] = self

    @property
    def nbytes(self):
        n = sum(len(b) for b in self.buffers) * S.BYTES_PER_EVENT
        if self.values:
            n += sum(v.nbytes() for v in self.values)
        return n

    def n_events(self):
        return sum(len(b) for b in self.buffers) + self._spilled_events

    def meta(self, segment=False):
        meta = {
            "format": S.FORMAT_NAME,
            "format_version": S.FORMAT_VERSION,
            "side": self.side,
            "reward_dtype": self.reward_dtype.name,
            "observation_space": self.obs_layout.description,
            "action_space": self.act_layout.description,
            "version": __version__,
            "keep_values": self.keep_values,
        }
        meta.update(self.extra_meta)
        if segment:
            meta["segment"] = len(self.segments)
        return meta

    def _memory_segment(self):
        """The events in memory, as views (valid until the buffers change)."""
        columns, values = {}, {}
        for k, (s, buf) in enumerate(zip(self.stream_ids, self.buffers)):
            columns[s] = buf.views()
            if self.values:
                store = self.values[k]
                values[s] = store.segment_values()
        return Segment(columns, values)

    def _value_specs(self):
        specs = [(name, dt, shape) for name, dt, shape, _, _ in self.value_members]
        if self.keep_values:  # a row shape of None: a member as long as its segments' arrays together
            for field in ("obs", "act"):
                specs.append((S.ENCODED_LENGTH_MEMBER.format(field=field), np.uint32, ()))
                specs.append((S.ENCODED_MEMBER.format(field=field), np.uint8, None))
        return specs

    def spill(self):
        """Write the events in memory to a new spill segment and free them."""
        if self.closed or self.pid != os.getpid():
            return
        n = sum(len(b) for b in self.buffers)
        if n == 0:
            return
        directory = spill_dir(self.path)
        first = not self.segments
        if first and not self.remote:
            # An earlier run's pieces, and its final file unless this recording
            # wrote it: if this process is killed, read() must find this run's
            # segments, not an older run's ledger.
            self._remove_stale_segments()
            if self._written_events == 0 and os.path.exists(self.path):
                os.unlink(self.path)
        name = "seg-%06d.npz" % len(self.segments)
        if self.remote:
            # Staged locally, kept there to assemble the final file, and uploaded in the
            # background so that a reader finds this run's events on the storage even if the
            # process is killed; the step does not wait for the network. The earlier run's
            # pieces are removed first, in the same background job.
            path, local = storage.join(directory, name), self._remote.stage_path(name)
            write_ledger(local, self.meta(segment=True), self.stream_ids, [self._memory_segment()],
                         self._value_specs(), final=False)
            self._remote.upload_segment(local, path, before=self._remove_earlier_run if first else None)
        else:
            os.makedirs(directory, exist_ok=True)
            path = local = os.path.join(directory, name)
            write_ledger(path, self.meta(segment=True), self.stream_ids, [self._memory_segment()],
                         self._value_specs(), final=False)
        # Only now, with the segment safely on disk, are the events let go of (and their pages given back).
        for buf in self.buffers:
            buf.release()
        if self.values:
            for store in self.values:
                store.clear()
        self.segments.append(path)
        self._segment_files.append(local)
        self._spilled_events += n

    def _remove_earlier_run(self):
        """At a URL, before the first segment is uploaded: an earlier run's segments, and its final file
        unless this recording wrote it (run by the uploader's thread)."""
        self._remove_stale_segments()
        if self._written_events == 0 and storage.exists(self.path):
            storage.remove(self.path)

    def _unlink_segments(self):
        if self.remote:
            if not self.segments:
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
        for p in self.segments:
            try:
                os.unlink(p)
            except Exception:
                pass

    def _remove_stale_segments(self):
        """Remove spill segments in this ledger's spill directory that this recording did not write."""
        mine = set(self.segments)
        if self.remote:
            if not self._remote.earlier_segments:
                return
            self._remote.earlier_segments = False
            directory = spill_dir(self.path)
            for name in storage.listdir(directory):
                old = storage.join(directory, name)
                if name.startswith("seg-") and old not in mine:
                    try:
                        storage.remove(old)
                    except Exception:
                        pass
            return
        for old in glob.glob(os.path.join(spill_dir(self.path), "seg-*")):  # also writes cut short
            if old not in mine:
                try:
                    os.unlink(old)
                except OSError:
                    pass

    def write(self, wait=True):
        """Write the final file from the spilled segments and the events in memory.

        Recording may go on; a later write replaces the file with a longer one.
        A recording with no events writes nothing. At a URL the file is
        uploaded before this returns, or with ``wait=False`` in the background
        (a periodic flush); if the upload fails the file is kept on local disk
        and a line says where (uploader.py), and ``self.published`` is False.
        """
        if self.pid != os.getpid():
            return 0
        if self.n_events() == 0:
            return 0
        from .read import segment_from_file  # a spilled segment read back in chunks
        opened = [segment_from_file(p) for p in self._segment_files]
        try:
            segments = [seg for seg, _ in opened] + [self._memory_segment()]
            if self.remote:
                local = self._remote.stage_path("ledger.npz" if wait else "flush-%d.npz" % self._flushes)
                self._flushes += 1
                total = write_ledger(local, self.meta(), self.stream_ids, segments, self._value_specs())
            else:
                total = write_ledger(self.path, self.meta(), self.stream_ids, segments, self._value_specs())
        finally:
            for _, handle in opened:
                handle.close()
        if self.remote:
            if wait:
                self.published = self._remote.publish_final(local)
            else:
                self._remote.upload_segment(local, self.path, remove=True)
        self._written_events = total
        if not self.segments and (not self.remote or wait):
            # Segments of an earlier run would hold more events than this file
            # and be read in its place.
            self._remove_stale_segments()
        return total

    def discard(self):
        """Drop everything recorded, writing nothing (benchmarks, aborted runs)."""
        if self.pid != os.getpid():
            return
        if self.remote:
            self._remote.stop()
        self._unlink_segments()
        self.segments = []
        self._release()

    def close(self):
        """Write the final file, remove the spill segments and free the buffers."""
        if self.closed or self.pid != os.getpid():
            return
        try:
            if self.remote:
                self._remote.stop()  # the final file supersedes the segments still queued
            self.write()
            if not self.published:
                return  # kept on local disk; the segments in storage stay, a partial ledger until it is pushed
            self._unlink_segments()
            if self.segments:
                try:
                    storage.rmdir(spill_dir(self.path)) if self.remote else os.rmdir(spill_dir(self.path))
                except Exception:
                    pass
        finally:
            self._release()

    def _release(self):
        """Closed for good: free the buffers and kept values, drop the staging area, leave the registry."""
        if self.remote:
            self._remote.stop()
            self._remote.remove_stage()
            self._segment_files = []
        self.closed = True
        for b in self.buffers:
            b.release()
        if self.values:
            for v in self.values:
                v.clear()
        with _LOCK:
            _OPEN.pop(id(self), None)

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


class TrainerSide:
    """What a trainer-side wrapper records with: the Recording (None in live-only mode), the core's
    VectorRecorder over its streams, and the live check. Shared by LedgerVectorEnv and LedgerVecEnv."""

    def __init__(self, owner, path, n_envs, obs_space, act_space, reward_dtype, keep_values, autoreset_mode,
                 live, on_fault):
        from .live import LiveCheck, check_on_fault, settings_of
        from .spaces import LeafLayout
        if path is not None or not live:
            path = check_path(path, owner, "path")
        if keep_values and path is None:
            raise ValueError("%s: keep_values=True needs a path to write the values to" % owner)
        dtype = check_reward_dtype(reward_dtype, owner)
        obs_layout = LeafLayout(obs_space, "%s: observation space" % owner)
        act_layout = LeafLayout(act_space, "%s: action space" % owner)
        self.path = path
        if path is None:
            # live check only: no file; the buffers are emptied at every step, so memory stays constant
            self.recording = None
            buffers = [core.StreamBuffer(16) for _ in range(n_envs)]
        else:
            self.recording = Recording(path, "trainer", range(n_envs), obs_layout, act_layout, dtype, keep_values,
                                       {"autoreset_mode": autoreset_mode})
            buffers = self.recording.buffers
        self.recorder = core.VectorRecorder(buffers, obs_layout, act_layout, dtype == np.float32)
        self.live = LiveCheck(self.recorder, dtype.name, check_on_fault(on_fault, owner), owner,
                              settings_of(dtype.name, obs_layout, act_layout)) if live else None

    def after_step(self, over):
        """Keep memory bounded after a recorded step: spill if over the limit, or empty the live-only buffers."""
        if self.recording is None:
            self.recorder.clear_buffers()
        elif over:
            spill_everything()

    def flush(self):
        if self.recording is not None:
            self.recording.write()

    def close(self):
        if self.recording is not None:
            self.recording.close()
