"""Local copies of ledgers at a URL that are filled as they are read: a Ray compare's driver reads the
directory, meta and stream offsets of every ledger, not its columns, and so fetches only those.

``OnDemand(url, local, size)`` makes ``local`` a sparse file of the object's size and registers it; every
read of a ledger file (format/ledgerfile.py and zipwriter.py read through ``os.pread``) first calls
``fill(fd, offset, n)``, which fetches from the object store the parts of that range the copy does not have
yet (in grains of GRAIN bytes, so that neighbouring small reads take one request). ``prefetch(copies)``
fetches, in two concurrent batches over all of them, what opening a ledger reads: each file's head and
tail (the ZIP directory), then each member's local header and first bytes (its .npy header) and the small
members whole. A read of a column then fetches the rows read, and no more.

A copy whose object changed since it was listed (another size, or a read that comes back short) is a
LedgerError naming the URL: the copy would mix two files. Without any copy registered, ``fill`` is one
truth test.
"""

import os
import threading

from stepledger.errors import LedgerError, one_line

GRAIN = 16 << 10  # bytes fetched at least, aligned: the reads of one member's header take one request
HEAD = 4 << 10  # the first bytes of each member fetched with its local header (its .npy header)
SMALL = 4 << 10  # members of at most this many bytes are fetched whole when a copy is opened

COPIES: dict[tuple[int, int], "OnDemand"] = {}  # (st_dev, st_ino) of the local file -> its copy
_LOCK = threading.Lock()


def _merge(have, start, end):
    """``have`` (sorted, disjoint [start, end) ranges) with [start, end) added."""
    out, placed = [], False
    for a, b in have:
        if b < start:
            out.append((a, b))
        elif a > end:
            if not placed:
                out.append((start, end))
                placed = True
            out.append((a, b))
        else:
            start, end = min(a, start), max(b, end)
    if not placed:
        out.append((start, end))
    return sorted(out)


def _missing(have, start, end):
    """The parts of [start, end) that ``have`` does not cover."""
    out = []
    for a, b in have:
        if b <= start:
            continue
        if a >= end:
            break
        if a > start:
            out.append((start, a))
        start = max(start, b)
    if start < end:
        out.append((start, end))
    return out


class OnDemand:
    """A local copy of the object at ``url`` (``size`` bytes), filled as it is read."""

    def __init__(self, url, local, size):
        from stepledger.format import storage
        self.url, self.local, self.size = url, local, int(size)
        self.fs, self.key = storage.filesystem(url)
        os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
        with open(local, "wb") as f:
            f.truncate(self.size)  # sparse: no block is written until its bytes are fetched
        st = os.stat(local)
        self.ident = (st.st_dev, st.st_ino)
        self.have: list[tuple[int, int]] = []
        self.fetched = 0  # bytes fetched, for tests and benchmarks
        self.requests = 0
        self.lock = threading.Lock()
        with _LOCK:
            COPIES[self.ident] = self

    def wanted(self, offset, n, grain=GRAIN):
        """The ranges to fetch for the bytes [offset, offset + n): what is missing, widened to grains."""
        start, end = max(0, offset), min(self.size, offset + n)
        if start >= end:
            return []
        start, end = start // grain * grain, min(self.size, -(-end // grain) * grain)
        return _missing(self.have, start, end)

    def put(self, start, data):
        fd = os.open(self.local, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            os.pwrite(fd, data, start)
        finally:
            os.close(fd)
        self.have = _merge(self.have, start, start + len(data))
        self.fetched += len(data)

    def fetch(self, ranges):
        """Fetch ``ranges`` ([start, end) each) from the object store into the copy, in one request each."""
        for start, end in ranges:
            data = _cat(self, start, end)
            self._check(start, end, data)
            self.put(start, data)

    def _check(self, start, end, data):
        if len(data) != end - start:
            raise _failed(self, EOFError("%d bytes at %d, where %d were asked" % (len(data), start, end - start)))

    def ensure(self, offset, n):
        with self.lock:
            ranges = self.wanted(offset, n)
            if ranges:
                self.fetch(ranges)

    def release(self):
        with _LOCK:
            if COPIES.get(self.ident) is self:
                del COPIES[self.ident]


def _cat(copy, start, end):
    copy.requests += 1
    try:
        return copy.fs.cat_file(copy.key, start=start, end=end)
    except Exception as exc:
        raise _failed(copy, exc) from None


def _failed(copy, exc):
    """The LedgerError for a ranged read of ``copy`` that failed: the object gone or changed (a range past
    its new end), else the store's reason."""
    from stepledger.format import storage
    try:
        now = storage.size(copy.url)
    except LedgerError:
        now = copy.size
    if now is None or isinstance(exc, FileNotFoundError):
        return LedgerError("%s: removed while it was read" % copy.url)
    if now != copy.size:
        return LedgerError("%s: changed while it was read (%d bytes now, %d when listed)" % (copy.url, now, copy.size))
    return LedgerError("%s: cannot read (%s)" % (copy.url, one_line(exc)))


def fill(fd, offset, n):
    """Before a read of ``n`` bytes at ``offset`` through ``fd``: where ``fd`` is an on-demand copy, fetch what
    it does not have of them."""
    if not COPIES:
        return
    try:
        st = os.fstat(fd)
    except OSError:
        return
    copy = COPIES.get((st.st_dev, st.st_ino))
    if copy is not None:
        copy.ensure(offset, n)


def _fetch_many(plans):
    """[(copy, [(start, end), ...]), ...] fetched in one batch where the filesystem batches ranged reads (s3fs
    reads them concurrently), else one by one."""
    plans = [(c, r) for c, r in plans if r]
    if not plans:
        return
    fs = plans[0][0].fs
    keys, starts, ends, owners = [], [], [], []
    for copy, ranges in plans:
        for start, end in ranges:
            keys.append(copy.key)
            starts.append(start)
            ends.append(end)
            owners.append(copy)
    try:
        datas = fs.cat_ranges(keys, starts, ends, on_error="raise")
    except Exception:
        # one is gone or changed, or the store refused: each copy fetched on its own says which, in one line
        for copy, ranges in plans:
            copy.fetch(ranges)
        return
    for copy, start, end, data in zip(owners, starts, ends, datas):
        copy.requests += 1
        copy._check(start, end, data)
        with copy.lock:
            for a, b in _missing(copy.have, start, end):
                copy.put(a, data[a - start: b - start])


def prefetch(copies):
    """What opening each of ``copies`` as a ledger reads, fetched in two batches: heads and tails, then each
    member's local header and first bytes, and the small members whole."""
    from stepledger.format.ledgerfile import central_directory
    tail = 65557 + 20  # the ZIP end records' search, as read_directory makes it
    _fetch_many([(c, _missing(c.have, 0, min(c.size, HEAD)) +
                  _missing(c.have, max(HEAD, c.size - tail), c.size)) for c in copies])
    plans = []
    for c in copies:
        fd = os.open(c.local, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            entries, _ = central_directory(fd, c.size, c.local)  # what it lacks of the directory: fetched by fill
        except LedgerError:
            continue  # not a ledger: opening it says so, in the reader's words
        finally:
            os.close(fd)
        ranges: list[tuple[int, int]] = []
        for e in entries.values():
            end = e.offset + 30 + len(e.data) + 256 + (e.csize if e.csize <= SMALL else HEAD)
            for r in _missing(c.have, e.offset, min(c.size, end)):
                ranges = _merge(ranges, *r)
        plans.append((c, ranges))
    _fetch_many(plans)


__all__ = ["COPIES", "GRAIN", "OnDemand", "fill", "prefetch"]
