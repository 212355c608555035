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
import re
import stat
import struct
import warnings
import zipfile

import numpy as np

from stepledger.format import schema as S
from stepledger.format import ondemand, processes
from stepledger.format.zipwriter import DEFLATE, INFLATE_ERRORS, InflateCursor, ZipWriter, crc32, inflate_prefix
from stepledger.errors import LedgerError, one_line

# How each member is stored: _schema.COLUMN_LEVELS says why.
_LEVEL = dict(S.COLUMN_LEVELS[DEFLATE], **dict.fromkeys(
    (S.META_MEMBER, S.STREAM_INDEX_MEMBER, S.STREAM_OFFSETS_MEMBER), S.MEMBER_LEVEL))
CHUNK = 1 << 20  # events per chunk when streaming columns
_VERIFY_AT_OPEN = 8 << 20  # compressed members up to this size inflated are CRC-checked on open
_EVENT_COLUMNS = frozenset(S.EVENT_COLUMN_NAMES)  # ... but these, checked as they are read (see _validate)
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
    """Open a temporary name next to ``path`` (processes.tmp_name) for writing; on success sync it and rename it to ``path``.

    On any error the temporary file is removed, so ``path`` is either the
    previous complete file or the new complete one, never half of one.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = processes.tmp_name(path)
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
    if kind.shape[0] == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64), carry
    episode, step = _episodes(kind, carry[0]), _steps(kind, carry[1])
    return episode, step, (int(episode[-1]), int(step[-1]))


def _episodes(kind, before):
    """The episode column of a non-empty chunk of kinds, ``before`` the episode of the event before it."""
    return np.cumsum(kind == S.KIND_RESET, dtype=np.int64) + before


def _steps(kind, before):
    """The step column of a non-empty chunk of kinds, ``before`` the step of the event before it."""
    idx = np.arange(kind.shape[0], dtype=np.int64)
    # where the chunk's last reset so far is; before its first, a virtual one that gives before + 1 + idx
    last_reset = np.where(kind == S.KIND_RESET, idx, np.int64(-1 - before))
    np.maximum.accumulate(last_reset, out=last_reset)
    idx -= last_reset
    return idx


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

    ``value_members`` lists (member name, dtype, row shape) of kept values; a row
    shape of None is a member of bytes as long as its segments' arrays together. A
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
    if meta.get(S.META_REWARD_DTYPE) == "float64":
        level[S.FIELD_COLUMNS["reward"]] = S.FLOAT64_REWARD_LEVEL
    if not final:
        level = dict.fromkeys(level, 0)

    def piece_chunks(part, name, rows):
        """A member's chunks of ``rows`` rows: each stream's, from each segment's ``part`` (columns or values)."""
        def gen():
            for s in stream_ids:
                for seg in segments:
                    arrays = getattr(seg, part).get(s)
                    if arrays is not None:
                        arr = arrays[name]
                        for i in range(0, arr.shape[0], rows):
                            yield arr[i:i + rows]
        return gen

    def position_chunks(which):
        column, carry0 = (_episodes, -1) if which == "episode" else (_steps, 0)  # as positions() computes them

        def gen():
            for s in stream_ids:
                carry = carry0
                for seg in segments:
                    cols = seg.columns.get(s)
                    if cols is not None:
                        kind = cols["kind"]
                        for i in range(0, kind.shape[0], CHUNK):
                            part = np.asarray(kind[i:i + CHUNK])
                            if part.shape[0]:
                                out = column(part, carry)
                                carry = int(out[-1])
                                yield out
        return gen

    meta_arr = np.array(json.dumps(meta, sort_keys=True))
    ids = np.asarray(stream_ids, dtype=np.int64)
    members = [
        _Member(S.META_MEMBER, meta_arr.dtype, (), lambda: [meta_arr.reshape(1)], level[S.META_MEMBER]),
        _Member(S.STREAM_INDEX_MEMBER, np.int64, ids.shape, lambda: [ids], level[S.STREAM_INDEX_MEMBER]),
        _Member(S.STREAM_OFFSETS_MEMBER, np.int64, offsets.shape, lambda: [offsets], level[S.STREAM_OFFSETS_MEMBER]),
    ]
    for name, dt in S.EVENT_COLUMNS:
        members.append(_Member(name, dt, (total,), piece_chunks("columns", name, CHUNK), level[name]))
    if final:
        for name, dt in S.POSITION_COLUMNS:
            members.append(_Member(name, dt, (total,), position_chunks(name), level[name]))
    for member, dt, row_shape in value_members:
        if row_shape is None:  # not one row an event: as long as its pieces together
            length = sum(int(vals[member].shape[0]) for seg in segments for s in stream_ids
                         for vals in [seg.values.get(s)] if vals is not None)
            members.append(_Member(member, dt, (length,), piece_chunks("values", member, VALUE_CHUNK_BYTES),
                                   S.VALUES_LEVEL if final else 0))
            continue
        row_bytes = np.dtype(dt).itemsize * int(np.prod(row_shape, dtype=np.int64))
        rows = max(1, VALUE_CHUNK_BYTES // max(1, row_bytes))
        members.append(_Member(member, dt, (total,) + tuple(row_shape), piece_chunks("values", member, rows),
                               S.VALUES_LEVEL if final else 0))
    _write_zip(path, members)
    return total


# ---------------------------------------------------------------- reading
#
# A reader opens each file once, checks that it is a regular file, and reads
# every member through that one descriptor (os.pread), so a writer that
# publishes a new file under the same name (flush(), os.replace) while it is
# read cannot mix two files. Nothing is inflated before every member's
# declared size and .npy header agree with each other, with the meta and with
# the stream offsets; the few members read whole are bounded by the reader
# limits in _schema.py, and event columns are read in chunks.

_EOCD = struct.Struct("<4sHHHHIIH")  # end of central directory
_ZIP64_LOCATOR = struct.Struct("<4sIQI")
_ZIP64_EOCD = struct.Struct("<4sQHHIIQQQQ")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_MAX16, _MAX32 = 0xFFFF, 0xFFFFFFFF
_MAX_DEFLATE_RATIO = 1032  # raw deflate never gives more than this many bytes for one
_STORED, _DEFLATED = 0, 8

# What zlib and numpy's header parser raise on a damaged member.
_READ_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, TypeError, OSError, EOFError, zipfile.BadZipFile, NotImplementedError, RuntimeError,
    OverflowError) + INFLATE_ERRORS


def _pread(fd, n, offset):
    """Up to ``n`` bytes at ``offset`` (fewer only at the end of the file)."""
    ondemand.fill(fd, offset, n)
    parts, got = [], 0
    while got < n:
        data = os.pread(fd, n - got, offset + got)
        if not data:
            break
        parts.append(data)
        got += len(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def open_regular(path):
    """Open ``path`` for reading if it is a regular file: (descriptor, size), else LedgerError.

    Opened without blocking, so a FIFO or a device is refused at once rather
    than read forever; the check is made on the open descriptor, so what is
    read is what was checked.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise LedgerError("%s: no such file" % path) from None
    except (OSError, ValueError) as exc:
        raise LedgerError("%s: cannot open (%s)" % (path, getattr(exc, "strerror", None) or one_line(exc))) from None
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise LedgerError("%s: cannot open (%s)" % (path, exc.strerror or one_line(exc))) from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise LedgerError("%s: is a directory, not a ledger file" % path)
        what = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a character device" if stat.S_ISCHR(st.st_mode)
                else "a block device" if stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "not a regular file")
        raise LedgerError("%s: is %s, not a ledger file (only regular files are read)" % (path, what))
    return fd, st.st_size


class _Entry:
    """One member as the ZIP central directory declares it."""

    __slots__ = ("name", "method", "crc", "csize", "usize", "offset", "data")

    def __init__(self, name, method, crc, csize, usize, offset):
        self.name, self.method, self.crc = name, method, crc
        self.csize, self.usize, self.offset = csize, usize, offset
        self.data = None  # offset of the member's data, after its local header

    @property
    def compress_type(self):
        return self.method

    @property
    def file_size(self):
        return self.usize


def _zip64_extra(extra, usize, csize, offset):
    """The sizes and offset of a central directory entry, from its ZIP64 extra field where needed."""
    i = 0
    while i + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, i)
        if tag == 1:
            values = list(struct.unpack_from("<%dQ" % min(size // 8, 3), extra, i + 4)) if size >= 8 else []
            if usize == _MAX32 and values:
                usize = values.pop(0)
            if csize == _MAX32 and values:
                csize = values.pop(0)
            if offset == _MAX32 and values:
                offset = values.pop(0)
            break
        i += 4 + size
    return usize, csize, offset


def read_directory(fd, size, path):
    """The members of a ZIP file: {name: _Entry}, each checked to lie in the file, apart from the others.

    Refuses, before anything is inflated, a directory larger than the reader
    limits, encrypted or unknown compression, a name given twice, members
    that overlap or run past the directory, and declared sizes that stored or
    deflated data cannot have.
    """
    entries, cd_offset = central_directory(fd, size, path)
    # Every member's local header, and no member overlapping another or the directory.
    limit = cd_offset
    for e in sorted(entries.values(), key=lambda e: e.offset, reverse=True):
        local = _pread(fd, _LOCAL.size, e.offset) if e.offset + _LOCAL.size <= limit else b""
        if len(local) != _LOCAL.size or local[:4] != b"PK\x03\x04":
            raise LedgerError("%s: member %s has a damaged local header" % (path, e.name))
        n_name, n_extra = _LOCAL.unpack(local)[9:]
        if _pread(fd, n_name, e.offset + _LOCAL.size) != e.data:
            raise LedgerError("%s: member %s has a damaged local header (another name)" % (path, e.name))
        e.data = e.offset + _LOCAL.size + n_name + n_extra
        if e.data + e.csize > limit:
            raise LedgerError("%s: member %s runs into %s" % (
                path, e.name, "the ZIP directory" if limit == cd_offset else "the next member"))
        limit = e.offset
    return entries


def central_directory(fd, size, path):
    """The members a ZIP file's central directory declares, their local headers not yet read: ({name: _Entry
    whose ``data`` is its name as bytes}, where the directory starts). The checks of read_directory that the
    directory alone allows."""
    magic = _pread(fd, 4, 0)
    if size < _EOCD.size:
        if size == 0:
            raise LedgerError("%s: empty file, not a ledger" % path)
        raise LedgerError("%s: not a ledger (%d bytes, too short for an .npz file)" % (path, size))
    tail_len = min(size, _EOCD.size + _MAX16 + _ZIP64_LOCATOR.size)
    tail = _pread(fd, tail_len, size - tail_len)
    at = len(tail)
    while True:
        at = tail.rfind(b"PK\x05\x06", 0, at)
        if at < 0:
            if magic == b"PK\x03\x04":
                raise LedgerError("%s: damaged or truncated ledger (no ZIP end record)" % path)
            raise LedgerError("%s: not a ledger (not an .npz file)" % path)
        if at + _EOCD.size <= len(tail) and _EOCD.unpack_from(tail, at)[7] == len(tail) - at - _EOCD.size:
            break
    _, disk, cd_disk, _, count, cd_size, cd_offset, _ = _EOCD.unpack_from(tail, at)
    end = size - tail_len + at  # where the end record starts
    if at >= _ZIP64_LOCATOR.size and tail[at - _ZIP64_LOCATOR.size:at - _ZIP64_LOCATOR.size + 4] == b"PK\x06\x07":
        _, _, z64, _ = _ZIP64_LOCATOR.unpack_from(tail, at - _ZIP64_LOCATOR.size)
        record = _pread(fd, _ZIP64_EOCD.size, z64) if z64 + _ZIP64_EOCD.size <= end else b""
        if len(record) != _ZIP64_EOCD.size or record[:4] != b"PK\x06\x06":
            raise LedgerError("%s: damaged ledger (bad ZIP64 end record)" % path)
        _, _, _, _, disk, cd_disk, _, count, cd_size, cd_offset = _ZIP64_EOCD.unpack(record)
        end = z64
    if disk or cd_disk:
        raise LedgerError("%s: not a ledger (a multi-part ZIP file)" % path)
    if count > S.MAX_MEMBERS:
        raise LedgerError("%s: not a ledger (%d members; a reader accepts at most %d)" % (path, count, S.MAX_MEMBERS))
    if cd_size > S.MAX_DIRECTORY_BYTES or cd_offset + cd_size > end:
        raise LedgerError("%s: damaged ledger (the ZIP directory declares %d bytes at %d, in a file of %d)"
                          % (path, cd_size, cd_offset, size))
    cd = _pread(fd, cd_size, cd_offset)
    entries, pos = {}, 0
    for _ in range(count):
        if pos + _CENTRAL.size > len(cd):
            raise LedgerError("%s: damaged ledger (the ZIP directory is cut short)" % path)
        (sig, _, _, flags, method, _, _, crc, csize, usize, n_name, n_extra, n_comment, _, _, _,
         offset) = _CENTRAL.unpack_from(cd, pos)
        if sig != b"PK\x01\x02":
            raise LedgerError("%s: damaged ledger (bad ZIP directory entry)" % path)
        raw = cd[pos + _CENTRAL.size:pos + _CENTRAL.size + n_name]
        extra = cd[pos + _CENTRAL.size + n_name:pos + _CENTRAL.size + n_name + n_extra]
        pos += _CENTRAL.size + n_name + n_extra + n_comment
        name = raw.decode("utf-8", "replace")
        usize, csize, offset = _zip64_extra(extra, usize, csize, offset)
        if flags & 1:
            raise LedgerError("%s: member %s is encrypted; a ledger never is" % (path, name))
        if method not in (_STORED, _DEFLATED):
            raise LedgerError("%s: member %s uses ZIP compression method %d; a ledger uses stored or deflate"
                              % (path, name, method))
        if name in entries:
            raise LedgerError("%s: member %s appears twice" % (path, name))
        if method == _STORED and csize != usize:
            raise LedgerError("%s: member %s is stored but declares %d bytes in %d" % (path, name, usize, csize))
        if method == _DEFLATED and usize > csize * _MAX_DEFLATE_RATIO + 64:
            raise LedgerError("%s: member %s declares %d bytes inflated from %d, more than deflate can give"
                              % (path, name, usize, csize))
        entries[name] = _Entry(name, method, crc, csize, usize, offset)
        entries[name].data = raw  # the name as bytes, until the local header is checked
    if pos != len(cd):
        raise LedgerError("%s: damaged ledger (the ZIP directory holds more than its %d entries)" % (path, count))
    return entries, cd_offset


# A .npy header's dict, read without ast: numpy's own reader runs ast.literal_eval, which CPython 3.11
# can fail ("AST constructor recursion depth mismatch") when two threads parse at once, as the idle
# spiller and a recording thread merging segments do. Strings, ints, True/False and punctuation only.
_HEADER_TOKEN = re.compile(r"""\s*(?:'([^'\\\n]*)'|"([^"\\\n]*)"|(0(?![0-9])|[1-9][0-9]{0,18})|(True|False)|([{}():,\[\]]))""")
_HEADER_KEYS = ("descr", "fortran_order", "shape")


def _header_fields(text):
    """{'descr': str, 'fortran_order': bool, 'shape': tuple of ints} from a .npy header's text."""
    tokens, pos, end = [], 0, len(text.rstrip())
    while pos < end:
        m = _HEADER_TOKEN.match(text, pos)
        if m is None:
            raise ValueError("bad .npy header (unexpected %r)" % text[pos:pos + 12].strip())
        s1, s2, number, word, punct = m.groups()
        tokens.append(("str", s1 if s1 is not None else s2) if s1 is not None or s2 is not None else
                      ("int", int(number)) if number is not None else
                      ("bool", word == "True") if word is not None else (punct, None))
        pos = m.end()
    tokens.append(("end", None))
    at = 0

    def take(kind):
        nonlocal at
        got, value = tokens[at]
        if got != kind:
            raise ValueError("bad .npy header (%s where %s belongs)" % (got, kind))
        at += 1
        return value

    fields: dict[str, object] = {}
    take("{")
    while tokens[at][0] != "}":
        key = take("str")
        take(":")
        kind = tokens[at][0]
        if kind == "(":
            at += 1
            shape = []
            while tokens[at][0] != ")":
                shape.append(take("int"))
                if tokens[at][0] != ")":
                    take(",")
                elif len(shape) == 1 and tokens[at - 1][0] != ",":
                    raise ValueError("bad .npy header (a shape of one dimension without its comma)")
            at += 1
            value: object = tuple(shape)
        elif kind == "[":
            raise ValueError("bad .npy header (a structured dtype; a ledger's arrays are plain)")
        elif kind in ("str", "bool"):
            value = tokens[at][1]
            at += 1
        else:
            raise ValueError("bad .npy header (%s where a value belongs)" % kind)
        if key in fields:
            raise ValueError("bad .npy header (key %r twice)" % key)
        fields[key] = value
        if tokens[at][0] != "}":
            take(",")
    at += 1
    take("end")
    if sorted(fields) != sorted(_HEADER_KEYS):
        raise ValueError("bad .npy header (keys %s, not %s)" % (", ".join(sorted(fields)), ", ".join(_HEADER_KEYS)))
    if not isinstance(fields["descr"], str) or not isinstance(fields["fortran_order"], bool) \
            or not isinstance(fields["shape"], tuple):
        raise ValueError("bad .npy header (a value of the wrong type)")
    return fields


def _parse_npy_header(prefix):
    """(shape, fortran order, dtype, header length) of a .npy header at the start of ``prefix``."""
    if len(prefix) < 10 or prefix[:6] != b"\x93NUMPY":
        raise ValueError("not a .npy array")
    version = (prefix[6], prefix[7])
    if version == (1, 0):
        start, length = 10, struct.unpack_from("<H", prefix, 8)[0]
    elif version in ((2, 0), (3, 0)):
        if len(prefix) < 12:
            raise ValueError("not a .npy array")
        start, length = 12, struct.unpack_from("<I", prefix, 8)[0]
    else:
        raise ValueError(".npy version %d.%d" % version)
    if length > S.MAX_NPY_HEADER:
        raise ValueError(".npy header of %d bytes" % length)
    if len(prefix) < start + length:
        raise ValueError(".npy header cut short")
    try:
        text = prefix[start:start + length].decode("utf-8" if version == (3, 0) else "latin1")
    except UnicodeDecodeError:
        raise ValueError("bad .npy header (not text)") from None
    fields = _header_fields(text)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a deprecated type alias is read as numpy reads it, without a word
            dtype = np.dtype(fields["descr"])
    except Exception as exc:  # an untrusted type string: whatever numpy raises for it
        raise ValueError("bad .npy header (dtype %r: %s)" % (fields["descr"][:40], one_line(exc))) from None
    return fields["shape"], fields["fortran_order"], dtype, start + length


class _ColumnSource:
    """One member of one open file: its header checked, its rows read on demand through the file's descriptor."""

    def __init__(self, lf, entry, name):
        self.path, self.fd, self.info, self.name = lf.path, lf.fd, entry, name
        self.stored = entry.method == _STORED
        self._cursor = None
        self._pos = 0
        self._crc = None  # running CRC-32 of a stored member read in order from its start
        self._crc_rows = 0
        self.verify = True
        self.verified = False  # its CRC-32 has been checked: it was read through to its end
        try:
            # The header alone: a stored member's first bytes, or what a deflated one's first compressed
            # bytes inflate to, never more than the largest header accepted.
            n = min(entry.usize, S.MAX_NPY_HEADER + 12)
            if self.stored:
                prefix = _pread(self.fd, n, entry.data)
            else:
                prefix = inflate_prefix(self.fd, entry.data, entry.csize, n)
            shape, fortran, dtype, self.header_len = _parse_npy_header(prefix)
        except _READ_ERRORS as exc:
            raise LedgerError("%s: member %s is not a readable array (%s)" % (self.path, name, one_line(exc))) from None
        if dtype.hasobject:
            raise LedgerError("%s: member %s holds pickled objects; a ledger never does" % (self.path, name))
        if fortran:
            raise LedgerError("%s: member %s is in Fortran order; a ledger never is" % (self.path, name))
        if dtype.fields is not None or dtype.subdtype is not None or dtype.itemsize == 0 and dtype.kind != "U":
            raise LedgerError("%s: member %s has a structured dtype %s; a ledger's arrays are plain"
                              % (self.path, name, dtype))
        self.shape, self.dtype = shape, dtype
        count = 1
        for d in shape:
            count *= d
        data_bytes = count * dtype.itemsize
        if self.header_len + data_bytes != entry.usize:
            raise LedgerError("%s: member %s: its header says %s %s (%d bytes), the ZIP directory %d bytes"
                              % (self.path, name, dtype, shape, data_bytes, entry.usize - self.header_len))

    def _new_cursor(self):
        e = self.info
        return InflateCursor(self.fd, e.data, e.csize, e.crc, e.usize)

    def rows(self):
        return self.shape[0] if self.shape else 1

    def array(self):
        """The whole member, loaded (used for the small members: meta, env_index, offsets)."""
        return self.read(0, self.rows()).reshape(self.shape)

    def read(self, start, stop):
        """Rows [start, stop) of a member, read forward without loading the rest."""
        rows = self.rows()
        if not 0 <= start <= stop <= rows:
            raise LedgerError("%s: member %s has no rows [%d, %d)" % (self.path, self.name, start, stop))
        row_bytes = self.dtype.itemsize
        for d in self.shape[1:]:
            row_bytes *= d
        if self.stored:
            return self._read_stored(start, stop, rows, row_bytes)
        try:
            if self._cursor is None or start < self._pos:
                self._cursor = self._new_cursor()
                self._cursor.skip(self.header_len)
                self._pos = 0
            if start > self._pos:
                self._cursor.skip((start - self._pos) * row_bytes)
            want = (stop - start) * row_bytes
            data = self._cursor.read(want)
            if stop == rows and len(data) == want:
                if self._cursor.read(1):
                    raise LedgerError("%s: member %s holds more data than its header says" % (self.path, self.name))
                self.verified = self._cursor.eof
            # reading past the last row reaches the end of the stream, where its CRC is checked
        except _READ_ERRORS as exc:
            self._cursor = None
            raise LedgerError("%s: member %s is damaged (%s)" % (self.path, self.name, one_line(exc))) from None
        if len(data) != want:
            self._cursor = None
            raise LedgerError("%s: member %s is truncated" % (self.path, self.name))
        self._pos = stop
        return np.frombuffer(data, dtype=self.dtype).reshape((stop - start,) + self.shape[1:])

    def _read_stored(self, start, stop, rows, row_bytes):
        out = np.empty((stop - start,) + self.shape[1:], dtype=self.dtype)
        want = (stop - start) * row_bytes
        if want == 0:
            return out
        view = memoryview(out.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # an ndarray is a buffer
        offset = self.info.data + self.header_len + start * row_bytes
        got = 0
        try:
            ondemand.fill(self.fd, offset, want)
            while got < want:
                n = os.preadv(self.fd, [view[got:]], offset + got)
                if not n:
                    break
                got += n
        except OSError as exc:
            raise LedgerError("%s: member %s cannot be read (%s)" % (self.path, self.name, one_line(exc))) from None
        if got != want:
            raise LedgerError("%s: member %s is truncated" % (self.path, self.name))
        if self.verify:
            self._check_crc(start, stop, rows, view)
        return out

    def _check_crc(self, start, stop, rows, data):
        """Check a stored member's CRC-32 when it has been read through in order.

        Deflated members are checked by their cursor at the end of the stream;
        stored ones are read directly, so flipped bytes in a digest column
        would otherwise go unnoticed. Reads out of order just skip the check.
        """
        if start == 0:
            self._crc = crc32(_pread(self.fd, self.header_len, self.info.data))  # it covers the header too
            self._crc_rows = 0
        if self._crc is None or start != self._crc_rows:
            self._crc = None
            return
        self._crc = crc32(data, self._crc)
        self._crc_rows = stop
        if stop == rows:
            crc, self._crc = self._crc, None
            if crc != self.info.crc:
                raise LedgerError("%s: member %s is corrupted (CRC-32 mismatch)" % (self.path, self.name))
            self.verified = True

    def verify_stored(self):
        """Read a stored member through in chunks, checking its CRC-32."""
        crc = crc32(_pread(self.fd, self.header_len, self.info.data))
        pos, end = self.info.data + self.header_len, self.info.data + self.info.usize
        while pos < end:
            data = _pread(self.fd, min(VALUE_CHUNK_BYTES, end - pos), pos)
            if not data:
                raise LedgerError("%s: member %s is truncated" % (self.path, self.name))
            crc = crc32(data, crc)
            pos += len(data)
        if crc != self.info.crc:
            raise LedgerError("%s: member %s is corrupted (CRC-32 mismatch)" % (self.path, self.name))
        self.verified = True

    def verify_whole(self):
        """Inflate a compressed member to its end through a fresh cursor, so that its CRC-32 is checked."""
        try:
            cursor = self._new_cursor()
            cursor.skip(self.info.usize)
            cursor.read(1)
        except _READ_ERRORS as exc:
            raise LedgerError("%s: member %s is damaged (%s)" % (self.path, self.name, one_line(exc))) from None
        self.verified = cursor.eof


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


class _OpenFile:
    def __init__(self, path, fd):
        self.path, self.fd = path, fd


def read_small_npz(path, max_member_bytes, what="file"):
    """Every ``.npy`` member of an .npz that is not a ledger (an episode log), loaded, CRC-checked.

    The same bounded reading as a ledger's: one descriptor, a regular file, the
    ZIP directory and each header checked before anything is inflated, and
    members larger than ``max_member_bytes`` refused. Pickles are never loaded.
    """
    fd, size = open_regular(path)
    try:
        entries = read_directory(fd, size, path)
        holder = _OpenFile(path, fd)
        out = {}
        for name, e in entries.items():
            if not name.endswith(".npy"):
                continue
            if e.usize > max_member_bytes + S.MAX_NPY_HEADER:
                raise LedgerError("%s: member %s declares %d bytes; a reader accepts at most %d in an %s"
                                  % (path, name[:-4], e.usize, max_member_bytes, what))
            out[name[:-4]] = _ColumnSource(holder, e, name[:-4]).array()
        return out
    finally:
        os.close(fd)


def check_meta(path, meta):
    """Check a ledger's parsed meta against the schema (``_schema.META_KEYS``); LedgerError naming the key.

    Returns the leaves of its spaces, as ``_schema.check_meta`` does.
    """
    if not isinstance(meta, dict) or meta.get(S.META_FORMAT) != S.FORMAT_NAME:
        raise LedgerError("%s: not a ledger (meta does not name the stepledger format)" % path)
    version = meta.get(S.META_FORMAT_VERSION)
    if isinstance(version, int) and not isinstance(version, bool) and version > S.FORMAT_VERSION:
        raise LedgerError("%s: format version %s is newer than this stepledger reads (%d); upgrade stepledger"
                          % (path, version, S.FORMAT_VERSION))
    try:
        return S.check_meta(meta)
    except S.MetaProblem as exc:
        raise LedgerError("%s: meta key %s %s" % (path, exc.key, exc.problem)) from None


def _leaf_dtype(name):
    dtype = np.dtype(name)
    return dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype


class LedgerFile:
    """One ledger file (final or spill segment), opened once and validated on open.

    ``meta`` (checked against the schema), ``stream_ids``, ``offsets``,
    ``members`` (name -> declared entry) and ``source(name)`` to read a
    member's rows. Every member is read through the one descriptor opened
    here; ``close()`` releases it.
    """

    def __init__(self, path, verify=True, checked=False):
        self.path = path
        self.verify = verify  # check the CRC of stored members read through in order
        # checked: another reader (compare's parent process) has opened this very file and checked its small
        # members; they are not inflated again here
        self._checked = checked
        self.fd = None
        self._sources = {}
        self._verified_all = False
        fd, size = open_regular(path)
        self.fd = fd
        try:
            entries = read_directory(fd, size, path)
            self._validate(entries)
        except LedgerError:
            self.close()
            raise
        except Exception as exc:  # a malformed file numpy or struct trips on: still one line, naming the file
            self.close()
            raise LedgerError("%s: not a readable ledger (%s)" % (path, one_line(exc))) from None

    def _validate(self, entries):
        path = self.path
        self.members = {name[:-4]: e for name, e in entries.items() if name.endswith(".npy")}
        for required in (S.META_MEMBER, S.STREAM_INDEX_MEMBER, S.STREAM_OFFSETS_MEMBER) + S.EVENT_COLUMN_NAMES:
            if required not in self.members:
                raise LedgerError("%s: not a ledger (no %r member)" % (path, required))
        # The meta, bounded, first: it says what the other members must be.
        meta_src = self.source(S.META_MEMBER)
        if meta_src.dtype.kind != "U" or meta_src.shape != ():
            raise LedgerError("%s: not a ledger (meta is not a string)" % path)
        if meta_src.dtype.itemsize > 4 * S.MAX_META_CHARS:
            raise LedgerError("%s: meta of %d characters, more than a reader accepts (%d)"
                              % (path, meta_src.dtype.itemsize // 4, S.MAX_META_CHARS))
        try:
            self.meta = json.loads(str(meta_src.array()[()]))
        except (ValueError, RecursionError):
            raise LedgerError("%s: not a ledger (meta is not JSON)" % path) from None
        self.leaves = check_meta(path, self.meta)
        # The stream index and offsets: their headers before their data.
        ids_src, off_src = self.source(S.STREAM_INDEX_MEMBER), self.source(S.STREAM_OFFSETS_MEMBER)
        for src in (ids_src, off_src):
            if len(src.shape) != 1 or src.dtype.kind not in "iu" or src.dtype.itemsize > 8:
                raise LedgerError("%s: env_index and offsets must be 1-d integer arrays (%s is %s %s)"
                                  % (path, src.name, src.dtype, src.shape))
        if ids_src.shape[0] > S.MAX_STREAMS:
            raise LedgerError("%s: env_index holds %d streams; a reader accepts at most %d"
                              % (path, ids_src.shape[0], S.MAX_STREAMS))
        if off_src.shape != (ids_src.shape[0] + 1,):
            raise LedgerError("%s: stream offsets are inconsistent (%d offsets for %d streams)"
                              % (path, off_src.shape[0], ids_src.shape[0]))
        ids = ids_src.array()
        offsets = off_src.array()
        if ids.size and (ids.min() < 0 or (ids.dtype.kind == "u" and ids.max() > np.iinfo(np.int64).max)):
            raise LedgerError("%s: env_index holds a negative or repeated env index" % path)
        ids = ids.astype(np.int64)
        if len(np.unique(ids)) != len(ids):
            raise LedgerError("%s: env_index holds a negative or repeated env index" % path)
        self.stream_ids = [int(x) for x in ids]
        if offsets.dtype.kind == "u" and offsets.size and offsets.max() > np.iinfo(np.int64).max:
            raise LedgerError("%s: stream offsets are inconsistent" % path)
        self.offsets = offsets.astype(np.int64)
        if self.offsets[0] != 0 or np.any(np.diff(self.offsets) < 0):
            raise LedgerError("%s: stream offsets are inconsistent" % path)
        total = int(self.offsets[-1])
        # Every column and kept value: dtype and shape as the offsets and the meta say.
        for name, dt in S.FILE_COLUMNS:
            if name in self.members:
                src = self.source(name)
                if src.shape != (total,) or src.dtype != np.dtype(dt):
                    raise LedgerError("%s: column %s has shape %s and dtype %s, expected (%d,) %s"
                                      % (path, name, src.shape, src.dtype, total, np.dtype(dt)))
        expected = {}
        if self.meta[S.META_KEEP_VALUES]:
            for field, key in (("obs", S.META_OBS_SPACE), ("act", S.META_ACT_SPACE)):
                for j, (dt, shape) in enumerate(self.leaves[key]):
                    expected[values_member(field, j)] = (_leaf_dtype(dt), (total,) + tuple(shape))
        for name in self.members:
            if name.startswith("values_") and name not in expected:
                raise LedgerError("%s: member %s is not a kept value of this ledger (keep_values %s)"
                                  % (path, name, json.dumps(self.meta[S.META_KEEP_VALUES])))
        for name, (dt, shape) in expected.items():
            if name not in self.members:
                raise LedgerError("%s: keep_values is true but member %s is missing" % (path, name))
            src = self.source(name)
            if src.shape != shape or src.dtype != dt:
                raise LedgerError("%s: member %s has shape %s and dtype %s, expected %s %s (from the meta's space)"
                                  % (path, name, src.shape, src.dtype, shape, dt))
        for field in ("obs", "act"):  # values kept as their encoding: lengths (N,) <u4, bytes (M,) |u1
            lengths, data = S.ENCODED_LENGTH_MEMBER.format(field=field), S.ENCODED_MEMBER.format(field=field)
            if (lengths in self.members) != (data in self.members) or \
                    lengths in self.members and not self.meta[S.META_KEEP_VALUES]:
                raise LedgerError("%s: members %s and %s come together, and only with keep_values"
                                  % (path, lengths, data))
            if lengths in self.members:
                a, b = self.source(lengths), self.source(data)
                if a.shape != (total,) or a.dtype != np.dtype("<u4") or len(b.shape) != 1 or b.dtype != np.uint8:
                    raise LedgerError("%s: members %s and %s must be (%d,) uint32 and a 1-d uint8 array"
                                      % (path, lengths, data, total))
        if self.verify and not self._checked:
            # Compressed members that are small once inflated, other than the event columns, are read
            # through now, so that their CRC is checked: a flipped byte can inflate without error, and
            # some (the position columns) are never read by compare. The event columns are checked
            # when they are read to their end, and where compare stops short of it (a difference),
            # by Ledger.verify before the difference is reported: read through here too, they were
            # inflated twice (a third of a compare's time).
            for name, e in self.members.items():
                if e.method != _STORED and e.usize <= _VERIFY_AT_OPEN and name not in _EVENT_COLUMNS:
                    self.source(name).verify_whole()
        # The small members are read: their inflaters (some 40 KB each) are not kept, so that a thousand
        # open files take little memory until their columns are read
        self.release()

    def verify_all(self):
        """Check the CRC-32 of every member this reader uses (once), reading each through in chunks."""
        if self._verified_all:
            return
        for name in self._known_members():
            src = self.source(name)
            if not src.verified:
                src.verify_stored() if src.stored else src.verify_whole()
        self._verified_all = True

    def _known_members(self):
        return {n for n in self.members if n in S.FILE_COLUMN_NAMES or n.startswith(("values_", "encoded_"))
                or n in (S.META_MEMBER, S.STREAM_INDEX_MEMBER, S.STREAM_OFFSETS_MEMBER)}

    def source(self, name):
        src = self._sources.get(name)
        if src is None:
            if name not in self.members:
                raise LedgerError("%s: no member %r" % (self.path, name))
            src = self._sources[name] = _ColumnSource(self, self.members[name], name)
            src.verify = self.verify
        return src

    def release(self):
        """Drop every member's read position (an inflater and its buffers); a later read starts afresh."""
        for src in self._sources.values():
            src._cursor = None
            src._pos = 0

    def close(self):
        self.release()
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def encoded_offsets(lf, field, rows):
    """Where each event of ``rows`` (ascending) has its encoded value in the file's encoded
    member: the sum of the lengths before it. One pass over the lengths."""
    src = lf.source(S.ENCODED_LENGTH_MEMBER.format(field=field))
    out, total, pos = [], 0, 0
    for row in rows:
        while pos < row:
            stop = min(pos + CHUNK, row)
            total += int(np.asarray(src.read(pos, stop), dtype=np.uint64).sum())
            pos = stop
        out.append(total)
    return out


def segment_from_file(path):
    """A spilled segment as a Segment of columns read on demand, and its open file.

    The columns are ``ledgerfile.Rows``, read in chunks while the final file
    is written: neither loaded nor memory-mapped, so assembling a long ledger
    from its segments keeps the process's memory bounded. The segment was
    written by this process moments ago, so its CRCs are not checked again.
    """
    lf = LedgerFile(path, verify=False)
    columns, values = {}, {}
    value_names = [m for m in lf.members if m.startswith("values_")]
    encoded = [f for f in ("obs", "act") if S.ENCODED_LENGTH_MEMBER.format(field=f) in lf.members]
    starts = {f: encoded_offsets(lf, f, [int(x) for x in lf.offsets]) for f in encoded}
    for k, s in enumerate(lf.stream_ids):
        a, b = int(lf.offsets[k]), int(lf.offsets[k + 1])
        columns[s] = {name: Rows(lf.source(name), a, b) for name in S.EVENT_COLUMN_NAMES}
        values[s] = {name: Rows(lf.source(name), a, b) for name in value_names}
        for f in encoded:  # the encoded values of this stream's events: their bytes, by their lengths
            lengths, data = S.ENCODED_LENGTH_MEMBER.format(field=f), S.ENCODED_MEMBER.format(field=f)
            values[s][lengths] = Rows(lf.source(lengths), a, b)
            values[s][data] = Rows(lf.source(data), starts[f][k], starts[f][k + 1])
    return Segment(columns, values), lf
