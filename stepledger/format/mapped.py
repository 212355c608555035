"""The mapped part of a ledger: the events no spill segment holds yet, in a file mapped shared into the
recording process, so that they reach the file however the process dies.

The writer (``LiveMap``, made by recording.py for a ledger on local disk) lays out ``NAME.live-{writer}``
(format/schema.py's MAP_* facts): a header, two meta slots, then a region a stream whose rings the core's
StreamBuffer appends to (``StreamBuffer.map_to``): each event's bytes, then the ring's end, release-ordered.
The pages of a shared mapping belong to the page cache, not to the process: SIGKILL, a segfault,
``os._exit`` and the OOM killer leave them, and the kernel writes them back. The file's blocks are
allocated when it is made (a full disk then fails there, not at a step with SIGBUS) and its pages touched,
so that no step takes a page fault for them; the rings are reused, so the file never grows.

The reader (``read_map``) takes the rows a ring names whole, [base, end), and read.py puts those that no
segment or final file of the same recording holds after them. A file whose machine has rebooted since
(another boot id; ``STEPLEDGER_BOOT_ID`` stands for this machine's in tests) may hold pages that never
reached the disk: it is not read, and the ledger is read up to its last spill, which was synced.
"""

from typing import Any

import glob
import json
import mmap
import os
import struct

import numpy as np

from stepledger.format import processes
from stepledger.format import schema as S

_HEADER = struct.Struct(S.MAP_HEADER_FORMAT)
_STREAM = struct.Struct(S.MAP_STREAM_FORMAT)
_ROW_BYTES = sum(np.dtype(S.COLUMN_DTYPES[name]).itemsize for name in S.MAP_COLUMN_ORDER)  # 27
_META_SLOT_MIN = 64 << 10


def boot_id():
    """This machine's boot id (``STEPLEDGER_BOOT_ID`` for tests), or '' where it cannot be read."""
    forced = os.environ.get(S.ENV_BOOT_ID)
    if forced:
        return forced
    try:
        with open(S.BOOT_ID_FILE) as f:
            return f.read().strip()
    except OSError:
        return ""


def mapped_bytes():
    """Bytes a ledger's mapped part may take (``STEPLEDGER_MAPPED_BYTES``; 0: none)."""
    raw = os.environ.get(S.ENV_MAPPED_BYTES)
    if raw is None or raw.strip() == "":
        return S.DEFAULT_MAPPED_BYTES
    try:
        return max(0, int(raw))
    except ValueError:
        raise ValueError("%s=%r: expected a number of bytes (0: no mapped part)" % (S.ENV_MAPPED_BYTES, raw)) \
            from None


def capacity_for(nbytes, n_streams):
    """Rows of each stream's ring for a mapped part of ``nbytes``: a power of two, MAP_MIN_CAPACITY at least."""
    per = max(1, nbytes // max(1, n_streams)) - S.MAP_STREAM_HEADER
    cap = S.MAP_MIN_CAPACITY
    while 2 * cap * _ROW_BYTES <= per:
        cap *= 2
    return cap


def _page(n):
    return -(-n // S.MAP_PAGE) * S.MAP_PAGE


def region_bytes(capacity):
    return _page(S.MAP_STREAM_HEADER + _ROW_BYTES * capacity)


def map_path(ledger_path, writer):
    return ledger_path + S.MAP_INFIX + writer


def maps_of(ledger_path):
    """The mapped files next to the ledger at ``ledger_path``, any writer's."""
    return sorted(glob.glob(glob.escape(ledger_path + S.MAP_INFIX) + "*"))


def writer_running(meta):
    """Whether the process that wrote a mapped part (its meta) still runs on this machine: its recording is
    then in progress, and is read from what it has written (its final file or segments) as before; its mapped
    part is read once that process is gone (killed, or ended without a word)."""
    pid = meta.get(S.META_PID)
    return isinstance(pid, int) and meta.get(S.META_HOST) == processes.HOST and \
        bool(processes.running(pid, meta.get(S.META_PID_START)))


def remove_stale(ledger_path, own):
    """Mapped parts at ``ledger_path`` that earlier recordings left (their process gone), but ``own``: the
    next writer's first segment supersedes them, as it does an earlier run's segments."""
    for path in maps_of(ledger_path):
        if path == own or S.TMP_INFIX in path:
            continue
        found = read_map(path)
        if writer_running(found.meta if found is not None else {}):
            continue
        try:
            os.unlink(path)
        except OSError:
            pass


class LiveMap:
    """The mapped file of one recording, while it records (the writer's side)."""

    def __init__(self, ledger_path, writer, stream_ids, capacity, meta):
        self.path = map_path(ledger_path, writer)
        self.n = len(stream_ids)
        self.capacity = int(capacity)
        self.given_up = False  # its meta outgrew its slots (write_meta)
        text = json.dumps(meta).encode()
        self.slot = _page(max(_META_SLOT_MIN, 4 * len(text)))
        self.regions_at = S.MAP_HEADER_BYTES + 2 * self.slot
        self.region = region_bytes(self.capacity)
        size = self.regions_at + self.n * self.region
        tmp = processes.tmp_name(self.path)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.posix_fallocate(fd, 0, size)  # blocks now: a full disk fails here, never at a step with SIGBUS
            self.mm = mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            for pos in range(0, size, mmap.PAGESIZE):  # touched now: no page fault on the step path
                mm[pos] = 0
            for k, sid in enumerate(stream_ids):
                _STREAM.pack_into(mm, self.regions_at + k * self.region, 0, 0, 0, int(sid), 0, 0, 0, 0)
            self.seq = 0
            self._put_meta(text, 0)
            _HEADER.pack_into(mm, 0, S.MAP_MAGIC, S.MAP_LAYOUT_VERSION, self.n, self.capacity, self.slot, 0,
                              len(text), 0, boot_id().encode()[:40])
            os.rename(tmp, self.path)  # whole before it has its name: a reader never finds a half-made header
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        finally:
            os.close(fd)

    def stream_region(self, k):
        """Stream k's region, for StreamBuffer.map_to."""
        start = self.regions_at + k * self.region
        return memoryview(self.mm)[start: start + self.region]

    def _put_meta(self, text, slot):
        at = S.MAP_HEADER_BYTES + slot * self.slot
        self.mm[at: at + len(text)] = text

    def write_meta(self, meta):
        """The recording's meta now (its run, position, path): into the slot not in use, then the switch."""
        if self.given_up:
            return
        text = json.dumps(meta).encode()
        if len(text) > self.slot:
            # larger than ever expected: no meta slot names the file any more, and it is not read (an earlier
            # meta would place the events recorded since by what it knew then: a trainer's fragments)
            struct.pack_into("<II", self.mm, 32, 0, 0)
            self.given_up = True
            return
        slot = (self.seq + 1) & 1
        self._put_meta(text, slot)
        struct.pack_into("<I", self.mm, 32 + 4 * slot, len(text))
        self.seq += 1
        struct.pack_into("<Q", self.mm, 24, self.seq)

    def rename(self, ledger_path, writer):
        """The recording's path changed (it records beside another writer's): the file follows it."""
        new = map_path(ledger_path, writer)
        if new != self.path:
            os.rename(self.path, new)
            self.path = new

    def remove(self):
        """The recording is closed or discarded: its file goes (the mapping stays until its buffers do)."""
        try:
            os.unlink(self.path)
        except OSError:
            pass


class MappedStreams:
    """What a mapped file holds, read back: ``meta``, ``writer``, ``boot_id``, per env index the events the
    rings name whole (``streams[index] = (first event index, columns)``), and the steps that never returned."""

    def __init__(self, path, meta, boot, streams, damaged, died):
        self.path, self.meta, self.boot_id, self.streams, self.damaged = path, meta, boot, streams, damaged
        # env index -> (the index of the event under way, its action's message or None, its digest): the
        # process died in that step
        self.died = died
        self.writer = meta.get(S.META_WRITER)

    @property
    def rebooted(self):
        """The machine has rebooted since it was written: pages may not have reached the disk."""
        here = boot_id()
        return bool(self.boot_id) and bool(here) and self.boot_id != here

    def n_events(self):
        return sum(len(cols["kind"]) for _, cols in self.streams.values())


def read_map(path):
    """The mapped file at ``path`` read back (MappedStreams), or None if it is not one (no header, another
    layout, cut short before its header). A region cut short, or a ring whose header cannot be right
    (more rows than it has), is left out and counted in ``damaged``."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if len(data) < S.MAP_HEADER_BYTES:
        return None
    magic, version, n, cap, slot, seq, len0, len1, boot = _HEADER.unpack_from(data, 0)
    if magic != S.MAP_MAGIC or version != S.MAP_LAYOUT_VERSION or cap < 16 or cap & (cap - 1) or n > S.MAX_STREAMS:
        return None
    meta = None
    for which in (seq & 1, (seq + 1) & 1):
        length = (len0, len1)[which]
        at = S.MAP_HEADER_BYTES + which * slot
        if 0 < length <= slot and at + length <= len(data):
            try:
                meta = json.loads(data[at: at + length].decode())
            except (UnicodeDecodeError, ValueError):
                continue
            if isinstance(meta, dict):
                break
            meta = None
    if meta is None:
        return None
    regions_at = S.MAP_HEADER_BYTES + 2 * slot
    region = region_bytes(cap)
    streams: dict[int, Any] = {}
    died: dict[int, Any] = {}
    damaged = 0
    mask = cap - 1
    for k in range(n):
        start = regions_at + k * region
        if start + S.MAP_STREAM_HEADER + _ROW_BYTES * cap > len(data):
            damaged += 1
            continue
        base, end, _, sid, pending, act_len, _, act_digest = _STREAM.unpack_from(data, start)
        if pending == end + 1:  # the env side's step under way never returned
            at = start + S.MAP_ACTION_AT
            message = data[at: at + act_len] if 0 <= act_len <= S.MAP_ACTION_BYTES else None
            died[sid] = (end, message, act_digest)
        if base >= end:
            streams[sid] = (base, _empty())
            continue
        if end - base > cap or sid < 0:
            damaged += 1
            continue
        rows = (np.arange(base, end, dtype=np.uint64) % np.uint64(cap)).astype(np.intp)
        cols, pos = {}, start + S.MAP_STREAM_HEADER
        for name in S.MAP_COLUMN_ORDER:
            dt = np.dtype(S.COLUMN_DTYPES[name])
            ring = np.frombuffer(data, dt, cap, pos)
            cols[name] = ring[rows].copy()
            pos += dt.itemsize * cap
        streams[sid] = (base, cols)
    return MappedStreams(path, meta, boot.rstrip(b"\0").decode("ascii", "replace"), streams, damaged, died)


def _empty():
    return {name: np.empty(0, dtype=S.COLUMN_DTYPES[name]) for name, _ in S.EVENT_COLUMNS}
