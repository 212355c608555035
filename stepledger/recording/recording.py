"""A ledger while it is being recorded: buffers, kept values, spills, the final file.

Shared by the env side (one stream) and the trainer side (one stream per env).
It owns what must survive the process, however the process ends (the process's
hooks for signals, exits and forks are in hooks.py, the idle spiller thread in
spiller.py):

- Every few seconds (``flush_interval``, 5 s by default) and whenever the
  process goes over its memory limit, the events in memory are written to a
  new spill segment (``PATH.spill/seg-*.npz``). The core signals both: a
  recording call returns True, and the wrapper calls ``attend()``. A spill
  due by time is handed to the process's spiller thread, so that no step
  writes or syncs a file for it: the thread writes copies, and the recording
  thread's next call lets go of what they hold (``let_go_written``). Past the
  memory limit, or with kept values, the step spills itself. Small segments
  are merged (on local disk), so that a long run keeps few files and each
  event is rewritten a few times at most.
- ``close()`` writes the final file and removes the segments; ``flush()``
  writes the final file and goes on recording.
- SIGKILL leaves the last segments: everything up to one interval before the kill.

Where the files go is the recording's ``place`` (format/place.py): a local path
(format/local.py) or a URL (format/remote.py), behind one interface.

A write that fails (a full disk, a lost mount) warns once, naming the ledger,
keeps the events in memory and is retried with a growing back-off, so that a
step never pays for a write that cannot succeed. Every file records its run,
its writer and how the recording had ended (the ``META_*`` keys of format/schema.py),
so that compare pairs only files of one run and knows an interrupted run from a
boundary fault. It never writes a ledger with no events.
"""

import os
import sys
import threading
import time
import uuid
import warnings

import numpy as np

from stepledger import core, wording
from stepledger._moved import names_of
from stepledger.__about__ import __version__
from stepledger.errors import LedgerError
from stepledger.format import processes
from stepledger.format import schema as S
from stepledger.format import storage
from stepledger.format.ledgerfile import Segment, segment_from_file, values_member, write_ledger
from stepledger.format.local import LocalLedger
from stepledger.format.mapped import capacity_for, mapped_bytes
from stepledger.format.remote import RemoteLedger
from stepledger.recording import spiller
from stepledger.recording.checks import check_remote, check_writable
from stepledger.recording.hooks import hook_process, writing
from stepledger.recording.spiller import BUSY, OPEN, IdleSpiller, mine, reschedule, same_path
from stepledger.recording.values import ValueStore

__getattr__ = names_of(__name__)  # attend, check_path, ...: in the modules of their jobs now (stepledger._moved)

_HOST = processes.HOST
_RETRY = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)  # seconds before retrying a failed write, then every minute


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
        self.side = side
        self.owner = owner
        # Where its files go (format/place.py): a local path, written in place, or a URL other than
        # file://, staged in a local directory and uploaded (format/remote.py). Checked now: one line
        # if the location cannot be written; closed at exit while uploads can still run.
        self.place = _place_of(self.path, owner, lambda: self.close(S.STATE_EXIT))
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
        self.interrupted_by = None  # the class name of the exception that escaped a recorded step or reset
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
        self.deferred = False  # env side: its index was given after construction (LedgerEnv.set_index)
        self.buffers = [core.StreamBuffer() for _ in self.stream_ids]
        self.values = [ValueStore(self.value_members) for _ in self.stream_ids] if self.keep_values else None
        self.live = None  # the mapped part (format/mapped.py): the events no segment holds, kept through a kill
        self._map()
        with spiller.LOCK:
            OPEN[id(self)] = self
        hook_process()
        IdleSpiller.wake()
        reschedule()

    # ------------------------------------------------------------ the mapped part

    def _map(self):
        """Keep the buffers' events in a file mapped shared, on local disk (format/mapped.py), so that
        whatever kills the process they reach the file. Without room for it, or at a URL, or with
        ``STEPLEDGER_MAPPED_BYTES=0``, in memory as before. Kept values are not mapped: after a kill the
        events of the mapped part are read without them (compare shows their digests)."""
        nbytes = mapped_bytes()
        if nbytes <= 0:
            return
        capacity = capacity_for(nbytes, len(self.buffers))
        try:
            live = self.place.mapped_part(self.path, self.writer, self.stream_ids, capacity, self.meta())
        except (OSError, ValueError):
            return  # no room, or a filesystem that cannot: the events stay in memory, spilled as before
        if live is None:
            return
        for k, buf in enumerate(self.buffers):
            buf.map_to(live.stream_region(k), capacity)
        self.live = live

    def _live_meta(self):
        if self.live is not None and self.pid == os.getpid():
            self.live.write_meta(self.meta())

    def began_at(self, when):
        """The recording began at ``when`` (a time.time()), before this object was made: a recorder set up
        before its first event, which it needs to open its ledger (stepledger.rllib's trainer side, which
        learns the spaces from the first episode). Before its first write. compare's check that the two
        sides' recordings overlap in time (for env ledgers no run id links) goes by it."""
        if self.n_events() == 0 and when < self.started:
            self.started = float(when)
            self._live_meta()

    def meta_changed(self):
        """Its meta changed between segments (a trainer's fragments): the mapped part's copy follows, so that
        the events read from it are placed by what the recording knew when it recorded them."""
        self._live_meta()

    def filling(self):
        """A mapped ring is half full or more: a spill is wanted before it overflows."""
        return any(len(b) * 2 >= b.map_capacity > 0 for b in self.buffers)

    def nearly_full(self):
        """A mapped ring is seven eighths full or more: the spill handed to the spiller thread has not kept up
        (a fast env, and the thread waiting its turn for the interpreter), and the recording thread spills
        itself rather than let the ring overflow, whose events would then be in memory only."""
        return any(len(b) * 8 >= b.map_capacity * 7 > 0 for b in self.buffers)

    def _unmap(self):
        if self.live is not None:
            for buf in self.buffers:
                buf.unmap()
            self.live.remove()
            self.live = None

    # ------------------------------------------------------------ claiming the path

    def _claim(self):
        """Before the first write: claim the path (a lock file naming this process, on local disk; see
        format/local.py). Taken at the first write, not at construction, so that a ledger that records
        nothing leaves nothing. Another live writer of the path: this one records beside it."""
        self.path = self.place.claim(self.path, self.owner, self._holder, _alive, self._record_beside)

    def _holder(self):
        """What a lock file says of the recording that holds it: its process (pid and start time, see
        processes.py), host, writer id, when it began and its run."""
        holder = {S.META_PID: self.pid, S.META_HOST: _HOST, S.META_WRITER: self.writer, S.META_STARTED: self.started,
                  S.META_RUN: self.run}
        start = processes.own_start()
        if start is not None:
            holder[S.META_PID_START] = start
        return holder

    def claim(self):
        """Claim the path now if this recording is about to write (see _claim); the path may change."""
        with self._lock:
            if self.n_events() and not self.closed and self.pid == os.getpid():
                self._claim()

    def _record_beside(self, holder):
        """Another writer holds the path (``holder``: its lock file, or the meta of the file it wrote):
        record to ``NAME.dup-{writer}.npz`` instead, and say so. The path to record at."""
        base, ext = os.path.splitext(self.path)
        beside = "%s%s%s%s" % (base, S.DUPLICATE_INFIX, self.writer[:8], ext)
        # One of the two linked by a trainer side, the other not: an evaluation env built from the training
        # env's factory (docs/INDICES.md), not a mistake; compare takes the linked one and names the other.
        if (self.run is None) == (holder.get(S.META_RUN) is None):
            # a lock names a live writer; a file's meta (its state) one that wrote it and closed since
            warnings.warn(wording.recorded_beside(self.path, holder.get(S.META_PID), beside,
                                                  S.META_STATE not in holder), RuntimeWarning, stacklevel=6)
        self.path = beside
        if self.live is not None:
            try:
                self.live.rename(beside, self.writer)
            except OSError:
                pass
            self._live_meta()
        return beside

    # ------------------------------------------------------------ what the wrappers tell it

    def link(self, run, position):
        """The trainer side's run id and this env's position in its vector env (env side); on the trainer
        side, a run id a library's set-up gives every ledger of its run (stepledger.rllib's), position None."""
        self.run = None if run is None else str(run)
        self.position = None if position is None else int(position)
        self._live_meta()

    # ------------------------------------------------------------ state

    @property
    def interrupted(self):
        """An exception escaped a step or reset it recorded (the run did not end cleanly)."""
        return self.interrupted_by is not None

    @interrupted.setter
    def interrupted(self, value):
        # set by the adapters in their ``except BaseException``: the exception being handled names what cut the run
        if not value:
            self.interrupted_by = None
        elif self.interrupted_by is None:
            exc = sys.exc_info()[0]
            self.interrupted_by = exc.__name__ if exc is not None else "Exception"

    @property
    def published(self):
        """False once the final file could not be uploaded (it is kept on local disk, and a line said where)."""
        return self.place.published

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
        if self.interrupted_by is not None:
            meta[S.META_INTERRUPTED_BY] = self.interrupted_by
        if state == S.STATE_SIGNAL:  # who it was that may have sent it: compare knows the trainer's process
            parent = _parent_pid()
            meta[S.META_PARENT_PID] = parent
            parent_start = processes.start_time(parent)
            if parent_start is not None:
                meta[S.META_PARENT_START] = parent_start
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
        return self._failures > 0 and IdleSpiller.running

    def idle_due(self):
        """When the spiller thread should spill this recording: at once if the recording thread handed
        it a periodic spill, else a little after one was due that the recording thread did not make."""
        if self.handed:
            return self.retry_at
        return max(self.due, self.retry_at) + self.grace

    def can_hand_off(self):
        """A periodic spill of this recording can go to the spiller thread: it runs, this is the recording
        thread, and no values are kept (their store is let go of whole, by the recording thread's spill)."""
        return IdleSpiller.running and not self.keep_values and threading.get_ident() == self._thread

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
            with writing():  # a SIGTERM meanwhile writes the ledger once the buffers and _done agree again
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
            return BUSY
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
        self.place.clean_leftovers(self.path)

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
        if not self.closed:
            self.place.wait()

    def spill(self):
        """Write the events in memory to a new spill segment and free them (the recording thread only)."""
        with self._lock, writing():
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
        path, local = self._write_segment(k, k, [segment])
        # With this run's first segment: an earlier run's pieces, and its final file unless this
        # recording wrote it, so that if this process is killed read() finds this run's segments, not
        # an older run's ledger. On local disk only now, with the segment in place (a reader meanwhile
        # finds both, and takes the recording that began last); at a URL in the upload's job, before
        # it. The step does not wait for the network: segments at a URL are uploaded in the background.
        self.place.upload_segment(local, path, before=(lambda: self._remove_earlier_run(path)) if first else None)
        self._segs.append(_SegmentFile(k, k, 0, path, local))
        self._next_segment = k + 1
        self._live_meta()  # what it knows now (its settings learned since, its position)

    def _write_segment(self, first, last, segments):
        name = segment_name(first)
        meta = self.meta(segment=first, through=last)
        path, local = self.place.stage_segment(self.path, name)
        write_ledger(local, meta, self.stream_ids, segments, self._value_specs(), final=False)
        return path, local

    def _merge(self):
        """Merge the last segments while they are of one size, where the place merges (local disk): few
        files, each event rewritten rarely."""
        while True:
            group = self.place.merge_group(self._segs)
            if group is None:
                return
            opened = [segment_from_file(s.local) for s in group]
            try:
                # Replaces the group's first file: a reader meanwhile sees either it alone, or the
                # merged file, whose meta says which segments it covers, next to those it covers.
                path, local = self._write_segment(group[0].first, group[-1].last, [seg for seg, _ in opened])
            finally:
                for _, handle in opened:
                    handle.close()
            self.place.upload_segment(local, path)
            for s in group[1:]:
                self.place.remove(s.path)
            self._segs[-len(group):] = [_SegmentFile(group[0].first, group[-1].last, group[0].level + 1, path,
                                                     local)]

    def _remove_earlier_run(self, first):
        """An earlier run's segments, and its final file unless this recording wrote it: those of this
        recording (``first``, its first segment, and those since) stay. At a URL run by the uploader's
        thread, before the first segment is uploaded."""
        mine = {s.path for s in self._segs} | {first}
        self.place.remove_earlier_run(self.path, mine, self._written_events == 0)
        # an earlier run's mapped part, whether this one has one or not
        self.place.remove_stale_maps(self.path, self.live.path if self.live is not None else None)

    def _unlink_segments(self):
        self.place.remove_segments(self.path, [s.path for s in self._segs])

    # ------------------------------------------------------------ the final file

    def write(self, state=S.STATE_OPEN, wait=True):
        """Write the final file from the spilled segments and the events in memory.

        Recording may go on; a later write replaces the file with a longer one.
        A recording with no events writes nothing. ``state`` goes in its meta:
        how the recording had ended. At a URL the file is uploaded before this
        returns, or with ``wait=False`` in the background (a periodic flush); if
        the upload fails the file is kept on local disk and a line says where
        (format/remote.py), and ``self.published`` is False.
        """
        with self._lock, writing():
            if self.pid != os.getpid() or self.closed:
                return 0
            if self.n_events() == 0:
                return 0
            self._clean_leftovers()
            opened = [segment_from_file(s.local) for s in self._segs]
            try:
                segments = [seg for seg, _ in opened] + [self._memory_segment()[0]]
                target = self.place.stage_final(self.path, wait)
                try:
                    total = write_ledger(target, self.meta(state), self.stream_ids, segments, self._value_specs())
                except OSError as exc:
                    raise LedgerError("%s: cannot write the ledger %s (%s)" % (self.owner, self.path, _short(exc))) \
                        from None
            finally:
                for _, handle in opened:
                    handle.close()
            settled = self.place.publish(target, self.path, wait)  # at a URL: uploaded, or kept locally
            self._written_events = total
            stat = self.place.written_stat(target)
            if stat is not None:
                self.written = stat
            if not self._segs and settled:
                # Segments of an earlier run would hold more events than this file
                # and be read in its place.
                self.place.remove_earlier_run(self.path, set(), False)
                self.place.remove_stale_maps(self.path, self.live.path if self.live is not None else None)
            return total

    def discard(self):
        """Drop everything recorded, writing nothing (benchmarks, aborted runs)."""
        with self._lock:
            if self.pid != os.getpid():
                return
            self.place.stop()
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
                self.place.stop()  # the final file supersedes the segments still queued
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
                    self.place.remove_spill_dir(self.path)
            finally:
                if not kept:
                    self._release()

    def _release(self):
        """Closed for good: free the buffers and kept values, drop the staging area, leave the registry."""
        self.place.close()  # the claim given up, the stage removed
        self.closed = True
        self._unmap()
        for b in self.buffers:
            b.release()
        if self.values:
            for v in self.values:
                v.clear()
        with spiller.LOCK:
            OPEN.pop(id(self), None)
        IdleSpiller.wake()
        reschedule()



def _place_of(path, owner, on_exit):
    """Where a recording at ``path`` writes, checked now: one line if the location cannot be written.

    A URL (other than file://): staged locally and uploaded (no bucket, refused credentials and unreachable
    storage fail here). A local path: its directory is made and written to, and no other open recording
    of this process that has recorded may be writing it.
    """
    if storage.is_remote(path):
        check_remote(path, stacklevel=4)
        return RemoteLedger(path, on_exit=on_exit)
    target = same_path(path)
    for rec in mine():
        # Only one that has recorded: Gymnasium builds throwaway envs in the parent (for their
        # spaces) and closes them later. Two that both record meet at the first write (the claim).
        if same_path(rec.path) == target and rec.n_events():
            raise LedgerError("%s: %s is already being recorded by another open ledger in this process; "
                              "give each env its own index= (or each trainer ledger its own path)" % (owner, path))
    check_writable(path, owner)
    return LocalLedger()


def _parent_pid():
    """The process that started this one: for a multiprocessing worker the process that created it, whichever the
    start method (under forkserver the operating system's parent is the fork server), else the parent."""
    mp = sys.modules.get("multiprocessing")
    parent = mp.parent_process() if mp is not None else None
    return parent.pid if parent is not None and isinstance(parent.pid, int) else os.getppid()


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
        return any(rec.writer == holder.get(S.META_WRITER) for rec in mine())  # recording is open here
    return processes.running(pid, start)


