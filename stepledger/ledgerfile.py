"""The ledger file: writing it atomically and in bounded memory, and reading it.

A ledger is an ``.npz`` that ``np.load(path, allow_pickle=False)`` reads (see
docs/FORMAT.md). Recording keeps events in memory; past the process's memory
limit they spill to segment files in ``PATH.spill/``, each itself a ledger
with ``"segment": true`` in its meta. The final file is assembled column by
column from the segments and the events still in memory, never holding the
whole stream at once. Every file is written under a temporary name, synced,
then renamed, so a process killed at any moment leaves the last complete file
or segment intact.
"""

import contextlib
import io
import json
import os
import zipfile
import zlib

import numpy as np

from . import _schema as S
from ._zipwriter import DEFLATE, INFLATE_ERRORS, InflateCursor, ZipWriter
from .errors import LedgerError

# How each member is stored: digests of observations and actions do not
# compress; flags, kinds and counters compress well and fast at level 1; the
# step counter needs level 6 to find its period. float32 reward bits are
# half zeros and compress to about 4 bytes at level 1.
_LEVEL = {
    "kind": 1, "h_obs": 0, "h_act": 0, "h_rew": 1, "terminated": 1, "truncated": 1,
    "episode": 1, "step": 1 if DEFLATE == "isal" else 6, S.META_MEMBER: 6, S.STREAM_INDEX_MEMBER: 6, S.STREAM_OFFSETS_MEMBER: 6,
}
_VALUES_LEVEL = 1
CHUNK = 1 << 20  # events per chunk when streaming columns
_VERIFY_AT_OPEN = 8 << 20  # compressed members up to this size inflated are CRC-checked on open
VALUE_CHUNK_BYTES = 8 << 20  # bytes per chunk when streaming kept values


def values_member(field, leaf):
    return S.VALUES_MEMBER.format(field=field, leaf=leaf)


def spill_dir(path):
    return path + ".spill"


# ---------------------------------------------------------------- writing

class _Member:
    """One member to write: its name, dtype, full shape, chunk source and level."""

    def __init__(self, name, dtype, shape, chunks, level):
        self.name, self.dtype, self.shape = name, np.dtype(dtype), tuple(shape)
        self.chunks, self.level = chunks, level


def _npy_header(dtype, shape):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape})
    return buf.getvalue()


@contextlib.contextmanager
def atomic_file(path):
    """Open ``path + ".tmp-PID"`` for writing; on success sync it and rename it to ``path``.

    On any error the temporary file is removed, so ``path`` is either the
    previous complete file or the new complete one, never half of one.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_zip(path, members):
    """Write members into ``path`` atomically."""
    with atomic_file(path) as f:
        writer = ZipWriter(f)
        for m in members:
            expected = m.dtype.itemsize * int(np.prod(m.shape, dtype=np.int64))
            written = [0]

            def chunks(m=m, written=written):
                yield _npy_header(m.dtype, m.shape)
                for chunk in m.chunks():
                    chunk = np.ascontiguousarray(chunk, dtype=m.dtype)
                    written[0] += chunk.nbytes
                    yield chunk.reshape(-1)

            writer.member(m.name + ".npy", chunks(), m.level)
            if written[0] != expected:
                raise LedgerError("%s: member %s got %d bytes, expected %d" % (path, m.name, written[0], expected))
        writer.close()


def positions(kind, carry):
    """Episode and step columns for a chunk of one stream's kinds.

    ``carry`` is (episode, step) of the event before the chunk, (-1, 0) at
    the start of a stream; returns (episode, step, new carry). Episodes count
    from 0 at the first reset; step 0 is the reset, step k the k-th step.
    Events before the first reset belong to episode -1.
    """
    kind = np.asarray(kind)
    n = kind.shape[0]
    if n == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64), carry
    is_reset = kind == S.KIND_RESET
    episode = carry[0] + np.cumsum(is_reset, dtype=np.int64)
    idx = np.arange(n, dtype=np.int64)
    last_reset = np.where(is_reset, idx, -1)
    np.maximum.accumulate(last_reset, out=last_reset)
    step = np.where(last_reset >= 0, idx - last_reset, carry[1] + 1 + idx)
    return episode, step, (int(episode[-1]), int(step[-1]))


class Segment:
    """Events of some streams: ``columns[stream][column]`` and ``values[stream][member]``."""

    def __init__(self, columns, values=None):
        self.columns = columns
        self.values = values or {}

    def count(self, stream):
        cols = self.columns.get(stream)
        return 0 if cols is None else int(cols["kind"].shape[0])


def write_ledger(path, meta, stream_ids, segments, value_members=(), final=True):
    """Write a ledger of ``stream_ids`` from ``segments``, in order.

    ``value_members`` lists (member name, dtype, row shape) of kept values. A
    final ledger is compressed member by member and carries the position
    columns; a spill segment is stored raw, for speed and memory-mapping.
    Returns the number of events written.
    """
    stream_ids = [int(s) for s in stream_ids]
    counts = [sum(seg.count(s) for seg in segments) for s in stream_ids]
    offsets = np.zeros(len(stream_ids) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    level = dict(_LEVEL)
    if meta.get("reward_dtype") == "float64":
        level["h_rew"] = 0
    if not final:
        level = dict.fromkeys(level, 0)

    def column_chunks(name):
        def gen():
            for s in stream_ids:
                for seg in segments:
                    cols = seg.columns.get(s)
                    if cols is not None:
                        arr = cols[name]
                        for i in range(0, arr.shape[0], CHUNK):
                            yield arr[i:i + CHUNK]
        return gen

    def position_chunks(which):
        def gen():
            for s in stream_ids:
                carry = (-1, 0)
                for seg in segments:
                    cols = seg.columns.get(s)
                    if cols is not None:
                        kind = cols["kind"]
                        for i in range(0, kind.shape[0], CHUNK):
                            episode, step, carry = positions(kind[i:i + CHUNK], carry)
                            yield episode if which == "episode" else step
        return gen

    def value_chunks(member, rows):
        def gen():
            for s in stream_ids:
                for seg in segments:
                    vals = seg.values.get(s)
                    if vals is not None:
                        arr = vals[member]
                        for i in range(0, arr.shape[0], rows):
                            yield arr[i:i + rows]
        return gen

    meta_arr = np.array(json.dumps(meta, sort_keys=True))
    ids = np.asarray(stream_ids, dtype=np.int64)
    members = [
        _Member(S.META_MEMBER, meta_arr.dtype, (), lambda: [meta_arr.reshape(1)], level[S.META_MEMBER]),
        _Member(S.STREAM_INDEX_MEMBER, np.int64, ids.shape, lambda: [ids], level[S.STREAM_INDEX_MEMBER]),
        _Member(S.STREAM_OFFSETS_MEMBER, np.int64, offsets.shape, lambda: [offsets], level[S.STREAM_OFFSETS_MEMBER]),
    ]
    for name, dt in S.EVENT_COLUMNS:
        members.append(_Member(name, dt, (total,), column_chunks(name), level[name]))
    if final:
        for name, dt in S.POSITION_COLUMNS:
            members.append(_Member(name, dt, (total,), position_chunks(name), level[name]))
    for member, dt, row_shape in value_members:
        row_bytes = np.dtype(dt).itemsize * int(np.prod(row_shape, dtype=np.int64))
        rows = max(1, VALUE_CHUNK_BYTES // max(1, row_bytes))
        members.append(_Member(member, dt, (total,) + tuple(row_shape), value_chunks(member, rows),
                               _VALUES_LEVEL if final else 0))
    _write_zip(path, members)
    return total


# ---------------------------------------------------------------- reading

# What zipfile, zlib and numpy's header parser raise on a damaged file.
_READ_ERRORS = (ValueError, TypeError, OSError, EOFError, zipfile.BadZipFile, NotImplementedError,
                RuntimeError) + INFLATE_ERRORS


class _ColumnSource:
    """One member of one file: memory-mapped if stored, streamed if compressed."""

    def __init__(self, path, zf, info, name):
        self.path, self.zf, self.info, self.name = path, zf, info, name
        try:
            with zf.open(info) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                elif version == (2, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
                else:
                    raise ValueError("npy version %s" % (version,))
                self.header_len = f.tell()
        except _READ_ERRORS as exc:
            raise LedgerError("%s: member %s is not a readable array (%s)" % (path, name, _short(exc))) from None
        if dtype.hasobject:
            raise LedgerError("%s: member %s holds pickled objects; a ledger never does" % (path, name))
        if fortran:
            raise LedgerError("%s: member %s is in Fortran order; a ledger never is" % (path, name))
        self.shape, self.dtype = tuple(shape), dtype
        self.stored = info.compress_type == zipfile.ZIP_STORED
        self._cursor = None
        self._pos = 0
        self._offset = None
        self._crc = None  # running CRC-32 of a stored member read in order from its start
        self._crc_rows = 0
        self.verify = True

    def _data_offset(self):
        with open(self.path, "rb") as f:
            f.seek(self.info.header_offset)
            local = f.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            raise LedgerError("%s: member %s has a damaged local header" % (self.path, self.name))
        n, e = int.from_bytes(local[26:28], "little"), int.from_bytes(local[28:30], "little")
        return self.info.header_offset + 30 + n + e + self.header_len

    def array(self):
        """The whole member: a read-only memory map if stored, else loaded."""
        if self.stored:
            count = int(np.prod(self.shape, dtype=np.int64))
            if count == 0:
                return np.empty(self.shape, dtype=self.dtype)
            size = os.path.getsize(self.path)
            off = self._data_offset()
            if off + count * self.dtype.itemsize > size:
                raise LedgerError("%s: member %s is truncated" % (self.path, self.name))
            return np.memmap(self.path, dtype=self.dtype, mode="r", offset=off, shape=self.shape)
        return self.read(0, self.shape[0] if self.shape else 1).reshape(self.shape)

    def read(self, start, stop):
        """Rows [start, stop) of a member, read forward without loading the rest.

        Stored members are read with plain file reads, not memory-mapped, so
        that streaming through a long ledger does not grow the process's RSS.
        """
        row_bytes = self.dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))
        if self.stored:
            return self._read_stored(start, stop, row_bytes)
        try:
            if self._cursor is None or start < self._pos:
                if self._cursor is not None:
                    self._cursor.close()
                if self._offset is None:
                    self._offset = self._data_offset()
                info = self.info
                self._cursor = InflateCursor(self.path, self._offset - self.header_len, info.compress_size,
                                             info.CRC, info.file_size)
                self._cursor.read(self.header_len)
                self._pos = 0
            if start > self._pos:
                self._cursor.skip((start - self._pos) * row_bytes)
            want = (stop - start) * row_bytes
            data = self._cursor.read(want)
            if (stop == (self.shape[0] if self.shape else 1)) and len(data) == want and self._cursor.read(1):
                raise LedgerError("%s: member %s holds more data than its header says" % (self.path, self.name))
            # reading past the last row reaches the end of the stream, where its CRC is checked
        except _READ_ERRORS as exc:
            raise LedgerError("%s: member %s is damaged (%s)" % (self.path, self.name, _short(exc))) from None
        if len(data) != want:
            raise LedgerError("%s: member %s is truncated" % (self.path, self.name))
        self._pos = stop
        return np.frombuffer(data, dtype=self.dtype).reshape((stop - start,) + self.shape[1:])


    def _read_stored(self, start, stop, row_bytes):
        rows = self.shape[0] if self.shape else 1
        if not 0 <= start <= stop <= rows:
            raise LedgerError("%s: member %s has no rows [%d, %d)" % (self.path, self.name, start, stop))
        out = np.empty((stop - start,) + self.shape[1:], dtype=self.dtype)
        want = (stop - start) * row_bytes
        if want == 0:
            return out
        if self._offset is None:
            self._offset = self._data_offset()
        view = memoryview(out.reshape(-1).view(np.uint8))
        got = 0
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset + start * row_bytes)
                while got < want:
                    n = f.readinto(view[got:])
                    if not n:
                        break
                    got += n
        except OSError as exc:
            raise LedgerError("%s: member %s cannot be read (%s)" % (self.path, self.name, _short(exc))) from None
        if got != want:
            raise LedgerError("%s: member %s is truncated" % (self.path, self.name))
        if self.verify:
            self._check_crc(start, stop, rows, view)
        return out

    def _check_crc(self, start, stop, rows, data):
        """Check a stored member's CRC-32 when it has been read through in order.

        Deflated members are checked by zipfile; stored ones are read
        directly, so flipped bytes in a digest column would otherwise go
        unnoticed. Reads out of order just skip the check.
        """
        if start == 0:
            with open(self.path, "rb") as f:
                f.seek(self._offset - self.header_len)
                self._crc = zlib.crc32(f.read(self.header_len))  # the CRC covers the .npy header too
            self._crc_rows = 0
        if self._crc is None or start != self._crc_rows:
            self._crc = None
            return
        self._crc = zlib.crc32(data, self._crc)
        self._crc_rows = stop
        if stop == rows:
            crc, self._crc = self._crc, None
            if crc != self.info.CRC:
                raise LedgerError("%s: member %s is corrupted (CRC-32 mismatch)" % (self.path, self.name))


class Rows:
    """Rows [start, stop) of one member of a ledger file, read on demand.

    Sliced like an array (``rows[a:b]`` reads those rows), so a spilled
    segment can feed ``write_ledger`` without being loaded or memory-mapped.
    """

    def __init__(self, source, start, stop):
        self.source, self.start, self.stop = source, int(start), int(stop)
        self.dtype = source.dtype
        self.shape = (self.stop - self.start,) + tuple(source.shape[1:])

    def __len__(self):
        return self.stop - self.start

    def __getitem__(self, key):
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("Rows supports plain slices only")
        a, b, _ = key.indices(self.stop - self.start)
        return self.source.read(self.start + a, self.start + max(a, b))


def _unreadable_zip(path, exc):
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError:
        magic = b""
    if magic == b"PK\x03\x04":
        return "%s: damaged or truncated ledger (%s)" % (path, _short(exc))
    if not magic:
        return "%s: empty file, not a ledger" % path
    return "%s: not a ledger (not an .npz file: %s)" % (path, _short(exc))


def _short(exc):
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


def check_meta(path, meta):
    """Check a ledger's parsed meta against the schema (``_schema.META_KEYS``); LedgerError naming the key.

    Returns the leaves of its spaces, as ``_schema.check_meta`` does.
    """
    if not isinstance(meta, dict) or meta.get("format") != S.FORMAT_NAME:
        raise LedgerError("%s: not a ledger (meta does not name the stepledger format)" % path)
    version = meta.get("format_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > S.FORMAT_VERSION:
        raise LedgerError("%s: format version %s is newer than this stepledger reads (%d); upgrade stepledger"
                          % (path, version, S.FORMAT_VERSION))
    try:
        return S.check_meta(meta)
    except S.MetaProblem as exc:
        raise LedgerError("%s: meta key %s %s" % (path, exc.key, exc.problem)) from None


class LedgerFile:
    """One ledger file (final or spill segment), validated on open."""

    def __init__(self, path, verify=True):
        self.path = path
        self.verify = verify  # check the CRC of stored members read through in order
        if not os.path.exists(path):
            raise LedgerError("%s: no such file" % path)
        if os.path.isdir(path):
            raise LedgerError("%s: is a directory, not a ledger file" % path)
        try:
            self.zf = zipfile.ZipFile(path)
            infos = {info.filename: info for info in self.zf.infolist()}
        except _READ_ERRORS as exc:
            raise LedgerError(_unreadable_zip(path, exc)) from None
        try:
            self._validate(infos)
        except LedgerError:
            self.zf.close()
            raise
        except Exception as exc:  # anything numpy or zipfile raises on a malformed file
            self.zf.close()
            raise LedgerError("%s: not a readable ledger (%s)" % (path, _short(exc))) from None

    def _validate(self, infos):
        path = self.path
        self.members = {}
        for fname, info in infos.items():
            if fname.endswith(".npy"):
                self.members[fname[:-4]] = info
        for required in (S.META_MEMBER, S.STREAM_INDEX_MEMBER, S.STREAM_OFFSETS_MEMBER) + S.EVENT_COLUMN_NAMES:
            if required not in self.members:
                raise LedgerError("%s: not a ledger (no %r member)" % (path, required))
        self._sources = {}
        meta = self.source(S.META_MEMBER).array()
        if meta.dtype.kind != "U" or meta.shape != ():
            raise LedgerError("%s: not a ledger (meta is not a string)" % path)
        try:
            self.meta = json.loads(str(meta[()]))
        except (ValueError, RecursionError):
            raise LedgerError("%s: not a ledger (meta is not JSON)" % path) from None
        self.leaves = check_meta(path, self.meta)
        ids = np.asarray(self.source(S.STREAM_INDEX_MEMBER).array())
        offsets = np.asarray(self.source(S.STREAM_OFFSETS_MEMBER).array())
        if ids.ndim != 1 or ids.dtype.kind not in "iu" or offsets.ndim != 1 or offsets.dtype.kind not in "iu":
            raise LedgerError("%s: env_index and offsets must be 1-d integer arrays" % path)
        if len(set(ids.tolist())) != len(ids) or (ids.size and ids.min() < 0):
            raise LedgerError("%s: env_index holds a negative or repeated env index" % path)
        self.stream_ids = [int(x) for x in ids]
        self.offsets = offsets.astype(np.int64)
        if self.offsets.shape != (len(self.stream_ids) + 1,) or self.offsets[0] != 0 or np.any(np.diff(self.offsets) < 0):
            raise LedgerError("%s: stream offsets are inconsistent" % path)
        total = int(self.offsets[-1])
        for name, dt in S.FILE_COLUMNS:
            if name in self.members:
                src = self.source(name)
                if src.shape != (total,) or src.dtype != np.dtype(dt):
                    raise LedgerError("%s: column %s has shape %s and dtype %s, expected (%d,) %s"
                                      % (path, name, src.shape, src.dtype, total, np.dtype(dt)))
        if self.verify:
            # Compressed members that are small once inflated are read through now, so that
            # their CRC is checked: a flipped byte can inflate without error, and some members
            # (the position columns) are not read by compare. Larger ones are checked when they
            # are read to their end.
            for name, info in self.members.items():
                if info.compress_type != zipfile.ZIP_STORED and info.file_size <= _VERIFY_AT_OPEN:
                    try:
                        src = self.source(name)
                        if src._offset is None:
                            src._offset = src._data_offset()
                        cursor = InflateCursor(path, src._offset - src.header_len, info.compress_size, info.CRC,
                                               info.file_size)
                        try:
                            cursor.skip(info.file_size)
                            cursor.read(1)
                        finally:
                            cursor.close()
                    except _READ_ERRORS as exc:
                        raise LedgerError("%s: member %s is damaged (%s)" % (path, name, _short(exc))) from None

    def source(self, name):
        src = self._sources.get(name)
        if src is None:
            if name not in self.members:
                raise LedgerError("%s: no member %r" % (self.path, name))
            src = self._sources[name] = _ColumnSource(self.path, self.zf, self.members[name], name)
            src.verify = self.verify
        return src

    def close(self):
        for src in self._sources.values():
            if src._cursor is not None:
                src._cursor.close()
                src._cursor = None
        self.zf.close()
