"""Streaming ZIP64 writing and inflating for ledger files, with a fast deflate.

``zipfile`` compresses with zlib only, and zlib's level 1 writes a ledger's
reward bits at about 55 MB/s: 16M events took over 2 s for that column
alone. ISA-L (the ``isal`` package) produces standard raw deflate streams at
about 270 MB/s on the same data, and any zlib, numpy's np.load included,
reads them. isal is optional (the ``[isal]`` extra): where it is not installed,
zlib is used and the file is just as valid, in the same format (ledgerfile.py
then stores the reward column rather than deflate it slowly).

The writer streams each member (local header, data, then the header patched
with its CRC and sizes), so a member never has to be in memory at once. Every
member carries ZIP64 sizes, and times are fixed, so the same columns always
give the same bytes.
"""

import os
import struct
import types
import zlib

from stepledger.format import ondemand

_deflate: types.ModuleType  # isal's isal_zlib where it is installed, else zlib: the same API
try:
    from isal import isal_zlib as _deflate
    DEFLATE = "isal"
except ImportError:  # pragma: no cover - exercised where isal is absent
    _deflate = zlib
    DEFLATE = "zlib"

crc32 = getattr(_deflate, "crc32", zlib.crc32)  # the same CRC-32 as zlib's; ISA-L's is several times faster

_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01
_DOS_TIME = 0
_VERSION = 45  # ZIP64
_STORED, _DEFLATED = 0, 8
_MAX32 = 0xFFFFFFFF


def _compressor(level):
    if _deflate is zlib:
        return zlib.compressobj(level, zlib.DEFLATED, -15)
    # ISA-L has levels 0-3; map zlib's 1-9 onto them, keeping 1 as the fastest useful one
    return _deflate.compressobj(min(level, 3), _deflate.DEFLATED, -15)


class ZipWriter:
    """Write members into an open, seekable binary file."""

    def __init__(self, f):
        self.f = f
        self.entries = []

    def member(self, name, chunks, level):
        """Write one member from an iterable of bytes-like chunks; level 0 stores it."""
        f = self.f
        fname = name.encode("utf-8")
        offset = f.tell()
        method = _DEFLATED if level else _STORED
        f.write(self._local_header(fname, method, 0, 0, 0))
        crc, usize, csize = 0, 0, 0
        comp = _compressor(level) if level else None
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            if not view.nbytes:
                continue
            crc = crc32(view, crc)
            usize += view.nbytes
            data = comp.compress(view) if comp else view
            if len(data):
                f.write(data)
                csize += len(data)
        if comp:
            tail = comp.flush()
            f.write(tail)
            csize += len(tail)
        end = f.tell()
        f.seek(offset)
        f.write(self._local_header(fname, method, crc & _MAX32, csize, usize))
        f.seek(end)
        self.entries.append((fname, method, crc & _MAX32, csize, usize, offset))

    def _local_header(self, fname, method, crc, csize, usize):
        extra = struct.pack("<HHQQ", 1, 16, usize, csize)
        return struct.pack("<IHHHHHIIIHH", 0x04034B50, _VERSION, 0, method, _DOS_TIME, _DOS_DATE, crc,
                           _MAX32, _MAX32, len(fname), len(extra)) + fname + extra

    def close(self):
        """Write the central directory and the ZIP64 end records."""
        f = self.f
        cd_start = f.tell()
        for fname, method, crc, csize, usize, offset in self.entries:
            extra = struct.pack("<HHQQQ", 1, 24, usize, csize, offset)
            f.write(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, _VERSION | (3 << 8), _VERSION, 0, method,
                                _DOS_TIME, _DOS_DATE, crc, _MAX32, _MAX32, len(fname), len(extra), 0, 0, 0,
                                0o100644 << 16, _MAX32) + fname + extra)
        cd_end = f.tell()
        n = len(self.entries)
        f.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, _VERSION, _VERSION, 0, 0, n, n, cd_end - cd_start,
                            cd_start))
        f.write(struct.pack("<IIQI", 0x07064B50, 0, cd_end, 1))
        f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF), _MAX32, _MAX32, 0))


INFLATE_ERRORS = (zlib.error,) + ((_deflate.error,) if _deflate is not zlib else ())


def inflate_prefix(fd, data_start, compress_size, n):
    """The first ``n`` bytes (at most) of a deflated member, from at most ``2 * n + 4096`` compressed bytes."""
    ondemand.fill(fd, data_start, min(compress_size, 2 * n + 4096))
    src = os.pread(fd, min(compress_size, 2 * n + 4096), data_start)
    return _deflate.decompressobj(-15).decompress(src, n)


class InflateCursor:
    """Reads one deflated member forward, with ISA-L where installed.

    It reads the file through ``fd`` with ``os.pread``, so several cursors
    share one descriptor, and a file that is replaced by name after it was
    opened is still read whole and alone. ``read(n)`` returns up to ``n``
    bytes of the member's uncompressed data, inflating at most that much: a
    member that inflates to far more than it should is never held in memory.
    When the end of the deflate stream is reached, the CRC-32 and size are
    checked against the ZIP directory's (``ValueError`` if they differ), so a
    member read to its end has been verified.
    """

    INPUT = 1 << 20  # compressed bytes read at a time, at most: the first read takes FIRST_INPUT, each next twice
    FIRST_INPUT = 64 << 10  # as many (a reader of a member's first rows reads little of a copy filled as read)

    def __init__(self, fd, data_start, compress_size, crc, file_size):
        self.fd = fd
        self.pos = data_start
        self.left = compress_size
        self.expected = (crc, file_size)
        self.d = _deflate.decompressobj(-15)
        self.tail = b""
        self.pending = b""  # inflated bytes not yet returned
        self.crc = 0
        self.total = 0
        self.eof = False
        self.input = self.FIRST_INPUT

    def _input(self):
        if self.left <= 0:
            return b""
        n = min(self.left, self.input)
        self.input = min(self.INPUT, 2 * self.input)
        ondemand.fill(self.fd, self.pos, n)
        src = os.pread(self.fd, n, self.pos)
        self.pos += len(src)
        self.left -= len(src)
        return src

    def read(self, n):
        parts = []
        need = n
        if self.pending:
            parts.append(self.pending[:need])
            self.pending = self.pending[need:]
            need -= len(parts[0])
        while need > 0 and not self.eof:
            src = self.tail or self._input()
            if src:
                out = self.d.decompress(src, need)  # never more than asked: no leftover to keep
            else:  # all input given: what the decompressor still holds, then the end of stream
                out = self.d.flush()
                if not self.d.eof:
                    raise EOFError("deflate stream ends early")
            self.tail = self.d.unconsumed_tail
            if out:
                self.crc = crc32(out, self.crc)
                self.total += len(out)
                if self.total > self.expected[1]:
                    raise ValueError("inflates to more than the %d bytes the ZIP directory declares"
                                     % self.expected[1])
                if len(out) > need:
                    out, self.pending = out[:need], out[need:]
                parts.append(out)
                need -= len(out)
            if self.d.eof:
                self.eof = True
                if (self.crc & _MAX32, self.total) != self.expected:
                    raise ValueError("CRC-32 or size mismatch")
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def skip(self, n):
        while n > 0:
            got = len(self.read(min(n, 1 << 24)))
            if not got:
                raise EOFError("unexpected end of member")
            n -= got

    def close(self):
        self.d = None  # the descriptor belongs to the file's reader
