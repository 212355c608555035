"""Kept values (``keep_values=True``): the observations and actions themselves, next to their digests.

One ``ValueStore`` a stream, appended to on the step path by the wrappers
(``Recording.values[k].append``), written with the stream's events at each
spill and at the end, and let go of with them.
"""

from typing import Any

import numpy as np

from stepledger import core
from stepledger._fallback import encode_leaves
from stepledger.format import schema as S


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
        self.enc_len: dict[str, Any] = dict.fromkeys(self.fields)  # field -> uint32 lengths, once a value needed encoding
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

