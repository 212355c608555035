"""Reading ledgers: ``read(path)`` for a ledger file, a spilled partial ledger or an env directory."""

from __future__ import annotations

import contextvars
import fnmatch
import glob
import itertools
import json
import os
import re
import tempfile
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence, Union

import numpy as np

from stepledger.format import schema as S
from stepledger.format import processes
from stepledger.format import storage
from stepledger import wording
from stepledger.errors import LedgerError
from stepledger.format.ledgerfile import CHUNK, LedgerFile, encoded_offsets, positions, spill_dir
from stepledger.format.mapped import MappedStreams, maps_of, read_map, writer_running
from stepledger.format.ondemand import OnDemand, prefetch
from stepledger._fallback import decode_leaves
from stepledger.format.spaces import digest_signature

if TYPE_CHECKING:
    from typing_extensions import Self

# env-N.npz, and env-N-M.npz: the env side of a batch, envs N .. M in one file (S.BATCH_FILE_NAME)
_ENV_FILE = re.compile(r"^env-(\d+)(?:-(\d+))?\.npz$")
# a second recording of env N (env-N.dup-*.npz) or a copy of its LedgerEnv (env-N.copy-*.npz, docs/INDICES.md),
# and a second recording of a batch (env-N-M.dup-*.npz)
_DUP_FILE = re.compile(r"^env-(\d+)(?:-(\d+))?(?:%s|%s)[0-9a-f]+\.npz$"
                       % (re.escape(S.DUPLICATE_INFIX), re.escape(S.COPY_INFIX)))
_UNINDEXED_FILE = re.compile(r"^" + re.escape(S.UNINDEXED_PREFIX) + r"[0-9a-f]+\.npz$")
_MAP_FILE = re.compile(r"^(.*\.npz)" + re.escape(S.MAP_INFIX) + r"[0-9a-f]+$")

#: a ledger's meta, as its file holds it (JSON: the keys are format/schema.py's META_*)
Meta = dict[str, Any]
#: event columns by column name (format/schema.py's EVENT_COLUMN_NAMES), all of one length
Columns = dict[str, np.ndarray]
#: what ``read`` takes: a ledger file, an env directory or an fsspec URL
LedgerPath = Union[str, "os.PathLike[str]"]
#: what ``compare`` takes as the trainer side: one of those, a glob of them, or a list of any of these
TrainerSpec = Union[LedgerPath, Sequence[LedgerPath]]
#: ``accept(meta, name)`` of ``read_ledger``: None to read an env ledger, else why it is left out
Accept = Callable[[Meta, str], Union[str, None]]


class _Piece:
    """Rows [start, stop) of one file's columns, belonging to one stream."""

    def __init__(self, lf: Any, start: int, stop: int) -> None:
        self.lf, self.start, self.stop = lf, start, stop


class _Rows:
    """A column read from a mapped part: rows [start, stop) of an array in memory."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.arr[start:stop]


class _MapPart:
    """The events of a mapped part that no file of its recording holds (format/mapped.py), read like a
    segment: ``source(name).read(start, stop)``, one stream after the other (``stream_ids``, ``offsets``)."""

    members: dict[str, Any] = {}

    def __init__(self, live: MappedStreams, tails: dict[int, Columns]) -> None:
        self.path, self.meta = live.path, dict(live.meta)
        self.stream_ids = sorted(tails)
        counts = [len(tails[s]["kind"]) for s in self.stream_ids]
        self.offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        self._cols = {name: _Rows(np.concatenate([tails[s][name] for s in self.stream_ids])
                                  if self.stream_ids else np.empty(0, S.COLUMN_DTYPES[name]))
                      for name in S.EVENT_COLUMN_NAMES}

    def source(self, name: str) -> _Rows:
        return self._cols[name]

    _sources: dict[str, Any] = {}  # no member is read from a file: none to be CRC-checked (report/parallel.py)

    def verify_all(self) -> None:
        pass  # in memory already: the rings name whole rows only

    def release(self) -> None:
        pass  # in memory already: no read position to let go of

    def close(self) -> None:
        pass


class Stream:
    """One env's recorded events.

    ``columns`` loads every column of the stream (kind, h_obs, h_act, h_rew,
    terminated, truncated, episode, step); ``chunks()`` streams them in
    bounded memory.
    """

    def __init__(self, index: int, pieces: list[_Piece], meta: Meta) -> None:
        self.index = index
        self.pieces = pieces
        self.meta = meta

    def __len__(self) -> int:
        return sum(p.stop - p.start for p in self.pieces)

    def chunks(self, names: Sequence[str] = S.EVENT_COLUMN_NAMES, size: int = CHUNK) -> Iterator[Columns]:
        """Yield dicts of column arrays, ``size`` events at most each, in order."""
        for p in self.pieces:
            for start in range(p.start, p.stop, size):
                stop = min(start + size, p.stop)
                yield {name: p.lf.source(name).read(start, stop) for name in names}

    @property
    def columns(self) -> Columns:
        parts: dict[str, list[np.ndarray]] = {name: [] for name in S.EVENT_COLUMN_NAMES}
        for chunk in self.chunks():
            for name in parts:
                parts[name].append(np.asarray(chunk[name]))
        out = {name: (np.concatenate(v) if v else np.empty(0, dtype=S.COLUMN_DTYPES[name]))
               for name, v in parts.items()}
        episode, step, _ = positions(out["kind"], (-1, 0))
        out["episode"], out["step"] = episode, step
        return out

    @property
    def values(self) -> dict[str, np.ndarray]:
        """Kept values by member name (``values_obs_0``...), if the side kept them: those of the events its
        files hold, the first ones (a mapped part holds events only: docs/ENDINGS.md)."""
        out: dict[str, list[np.ndarray]] = {}
        for p in self.pieces:
            for name in p.lf.members:
                if name.startswith("values_"):
                    out.setdefault(name, []).append(np.asarray(p.lf.source(name).read(p.start, p.stop)))
        return {name: np.concatenate(v) for name, v in out.items()}

    def value_rows(self, field: str, index: int) -> list[np.ndarray] | None:
        """The kept leaves of ``field`` ('obs' or 'act') at event ``index``, or None.

        A value of another shape than its space's was kept as its encoding: its
        own leaves are returned, with their own shapes.
        """
        if not self.meta.get(S.META_KEEP_VALUES):
            return None
        for p in self.pieces:
            n = p.stop - p.start
            if index < n:
                if isinstance(p.lf, _MapPart):
                    return None  # read from a mapped part, which holds events, not their kept values
                row = p.start + index
                encoded = encoded_value(p.lf, field, row)
                if encoded is not None:
                    return encoded
                names = sorted((m for m in p.lf.members if m.startswith("values_%s_" % field)),
                               key=lambda m: int(m.rsplit("_", 1)[1]))
                return [np.asarray(p.lf.source(m).read(row, row + 1))[0] for m in names]
            index -= n
        return None


#: a stream as another process re-opens it: (env index, [(file path, first row, end row)], meta)
StreamRef = tuple[int, list[tuple[str, int, int]], Meta]


def stream_ref(stream: Stream, name: Callable[[str], str] = str) -> StreamRef:
    """What a worker needs to read ``stream`` itself: each piece's file (as ``name`` gives it: a URL's local
    copy named by its URL) and rows, and the meta. No column is read."""
    return stream.index, [(name(p.lf.path), p.start, p.stop) for p in stream.pieces], stream.meta


def open_stream(ref: StreamRef, open_file: Callable[[str], LedgerFile]) -> Stream:
    """The Stream of a ``stream_ref``, its files opened by ``open_file(path)`` (which may keep them open)."""
    index, pieces, meta = ref
    return Stream(index, [_Piece(open_file(path), start, stop) for path, start, stop in pieces], meta)


def _encoded_offset(lf: LedgerFile, field: str, row: int) -> int:
    return encoded_offsets(lf, field, [row])[0]


def encoded_value(lf: LedgerFile, field: str, row: int) -> list[np.ndarray] | None:
    """The leaves of event ``row``'s kept value if it was kept as its encoding, else None."""
    name = S.ENCODED_LENGTH_MEMBER.format(field=field)
    if name not in lf.members:
        return None
    length = int(np.asarray(lf.source(name).read(row, row + 1))[0])
    if length == 0:
        return None
    if length > S.MAX_ENCODED_VALUE:
        raise LedgerError("%s: the kept %s value of event %d declares %d bytes, more than a reader accepts (%d)"
                          % (lf.path, field, row, length, S.MAX_ENCODED_VALUE))
    start = _encoded_offset(lf, field, row)
    data = np.asarray(lf.source(S.ENCODED_MEMBER.format(field=field)).read(start, start + length))
    try:
        return decode_leaves(data.tobytes())
    except ValueError as exc:
        raise LedgerError("%s: the kept %s value of event %d is damaged (%s)" % (lf.path, field, row, exc)) from None


class Ledger:
    """A ledger read back: ``meta`` (dict), ``streams`` (env index -> Stream),
    ``partial`` (True when only spilled segments were found), ``paths``."""

    def __init__(self, path: str, meta: Meta, streams: dict[int, Stream], partial: bool,
                 files: list[LedgerFile]) -> None:
        self.path, self.meta, self.streams, self.partial = path, meta, streams, partial
        self._files = files
        # a URL's local copy: (TemporaryDirectory, local path, URL)
        self._copy: tuple[tempfile.TemporaryDirectory[str], str, str] | None = None
        self._on_demand: list[OnDemand] = []  # its files, where the copy is filled as it is read
        # env directory: (name, reason) of env ledgers left out (see read_ledger)
        self.skipped: list[tuple[str, str]] = []
        # env directory: (name, env index, meta) of second recordings of an env and of copies of its LedgerEnv
        self.duplicates: list[tuple[str, int, Meta]] = []
        # env directory: the events of each of those, by name
        self.duplicate_events: dict[str, int] = {}
        # env directory: the file each stream was read from (a multi-agent env ledger holds several)
        self.origin: dict[int, str] = {}
        # env directory: (name, meta, events, first events) of ledgers with no index
        self.unindexed: list[tuple[str, Meta, int, Columns | None]] = []

    @property
    def side(self) -> str | None:
        return self.meta.get(S.META_SIDE)

    def n_events(self) -> int:
        return sum(len(s) for s in self.streams.values())

    def verify(self, stream_ids: Iterable[int] | None = None) -> None:
        """Check the CRC-32 of every member of the files holding ``stream_ids`` (default: every file).

        Reading stops at the first difference, before the end of a member where
        its checksum is checked: a report of a difference first verifies that
        the bytes it came from are the bytes written. LedgerError if not.
        """
        files: Iterable[LedgerFile] = self._files if stream_ids is None else \
            {id(p.lf): p.lf for s in stream_ids if s in self.streams for p in self.streams[s].pieces}.values()
        for lf in files:
            lf.verify_all()

    def close(self) -> None:
        for lf in self._files:
            lf.close()
        for copy in self._on_demand:
            copy.release()
        if self._copy is not None:
            self._copy[0].cleanup()

    def rename(self, text: str) -> str:
        """``text`` (an error message) with the local copy of a URL's ledger named by its URL."""
        if self._copy is None:
            return text
        return text.replace(self._copy[1], self._copy[2])

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return "<Ledger %s side=%s streams=%d events=%d%s>" % (
            self.path, self.side, len(self.streams), self.n_events(), " partial" if self.partial else "")


def _segments(path: str) -> list[str]:
    directory = spill_dir(path)
    if not os.path.isdir(directory):
        return []
    return sorted(glob.glob(os.path.join(directory, "seg-*.npz")))


def leftovers(path: LedgerPath) -> list[tuple[str, str]]:
    """What lies next to the ledgers at ``path`` (a ledger file or a directory) and is not read as a ledger.

    Temporary files of writes in progress or cut short (``NAME.tmp-PID-*``),
    lock files (``NAME.lock``) and the spill segments of a ledger whose final
    file is there (one entry for its spill directory, ``NAME.spill/``): (name
    relative to the directory, why it is there). The next writer of a ledger
    removes those its own killed predecessors left.
    """
    path = storage.local_path(os.fspath(path))
    if storage.is_remote(path) or not os.path.exists(path):
        return []
    directory = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    only = None if os.path.isdir(path) else os.path.basename(path)
    out: list[tuple[str, str]] = []

    def tmp_line(rel: str) -> tuple[str, str]:
        writer = processes.tmp_writer(rel)
        if writer is not None and processes.running(*writer):
            return rel, "a write in progress (process %d)" % writer[0]
        return rel, "a write cut short (its process is gone): not a ledger; the next writer of this ledger removes it"

    try:
        entries = sorted(os.listdir(directory))
    except OSError:
        return []
    for entry in entries:
        if only is not None and not entry.startswith(only):
            continue
        full = os.path.join(directory, entry)
        if S.TMP_INFIX in entry:
            out.append(tmp_line(entry))
        elif entry.endswith(S.LOCK_SUFFIX):
            try:
                with open(full) as f:
                    holder = json.load(f)
                pid, host = int(holder[S.META_PID]), holder.get(S.META_HOST)
                start = holder.get(S.META_PID_START)
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                out.append((entry, "a lock file that cannot be read"))
                continue
            alive = processes.running(pid, start, host)
            name = entry[: -len(S.LOCK_SUFFIX)]
            if alive:
                out.append((entry, "process %d is recording %s" % (pid, name)))
            elif alive is False:
                out.append((entry, "left by process %d, which is gone; the next writer of %s takes it over"
                            % (pid, name)))
            else:
                out.append((entry, "process %d on %s is recording %s, or was" % (pid, host, name)))
        elif entry.endswith(".spill") and os.path.isdir(full):
            final = full[: -len(".spill")]
            segments = 0
            for sub in sorted(os.listdir(full)):
                if S.TMP_INFIX in sub:
                    out.append(tmp_line(os.path.join(entry, sub)))
                elif sub.startswith("seg-") and os.path.exists(final):
                    segments += 1
            if segments:  # one line for the directory: a killed run leaves one segment a flush
                out.append((entry + "/", wording.spill_next_to_final(segments, os.path.basename(final))))
    return out


def _covering(files: list[LedgerFile]) -> tuple[list[LedgerFile], list[LedgerFile]]:
    """The segments of one writer that are current: a merged segment covers the ones it replaced."""
    covered: set[int] = set()
    for lf in files:
        first = lf.meta.get(S.META_SEGMENT)
        through = lf.meta.get(S.META_THROUGH)
        if isinstance(first, int) and isinstance(through, int):
            covered.update(range(first + 1, through + 1))
    keep: list[LedgerFile] = []
    drop: list[LedgerFile] = []
    for lf in files:
        (drop if lf.meta.get(S.META_SEGMENT) in covered else keep).append(lf)
    return keep, drop


def _newest_writer(files: list[LedgerFile]) -> tuple[list[LedgerFile], list[LedgerFile]]:
    """Files of the recording that began last (an earlier run's left-overs lose); v1 files have no writer."""
    by_writer: dict[str | None, list[LedgerFile]] = {}
    for lf in files:
        by_writer.setdefault(lf.meta.get(S.META_WRITER), []).append(lf)
    if len(by_writer) == 1:
        return files, []
    newest = max(by_writer, key=lambda w: (by_writer[w][0].meta.get(S.META_STARTED) or 0, w or ""))
    keep = by_writer.pop(newest)
    return keep, [lf for group in by_writer.values() for lf in group]


_CHANGING_FOR = 10.0  # seconds a ledger path may keep changing under the reader before it gives up


def _read_one(path: str) -> tuple[list[LedgerFile], bool]:
    """Files of one ledger path: the final file, or its spilled segments if they are this run's and hold more.

    A ledger being written changes under the reader: its segments are merged, or removed once the
    final file is there. A file that vanishes between the listing and its opening is looked for again.
    """
    deadline: float | None = None
    for attempt in itertools.count():
        if attempt:
            # Looked at again at once, then after a growing pause: a writer that spills and merges every few
            # ms (the idle spiller) can change the files under each of several quick looks on a busy machine.
            deadline = deadline or time.monotonic() + _CHANGING_FOR
            if time.monotonic() > deadline:
                break
            if attempt > 1:
                time.sleep(min(0.0005 * 2 ** attempt, 0.05))
        seg_paths = _segments(path)
        opened: list[LedgerFile] = []
        has_final = os.path.exists(path)
        listed = seg_paths + [path] if has_final else seg_paths
        try:
            final = LedgerFile(path) if has_final else None
            if final is not None:
                opened.append(final)
            for p in seg_paths:
                opened.append(LedgerFile(p))
        except LedgerError:
            for lf in opened:
                lf.close()
            if any(not os.path.exists(p) for p in listed):
                continue  # a file seen a moment ago is gone (merged, or the ledger closed): look again
            raise
        if final is None and not seg_paths and (os.path.exists(path) or _segments(path)):
            # Neither was there when looked at, one is now: the writer's first spill put its segment in
            # place before it removed the final file (or close() wrote the final file before it removed
            # the segments) between the two looks. Look again.
            continue
        return _choose(path, final, opened[1:] if final is not None else opened)
    raise LedgerError("%s: keeps changing while it is read" % path)


def _choose(path: str, final: LedgerFile | None, segs: list[LedgerFile]) -> tuple[list[LedgerFile], bool]:
    seg_paths = segs
    if seg_paths:
        segs, stale = _newest_writer(segs)
        segs, covered = _covering(segs)
        for lf in stale + covered:
            lf.close()
        seg_events = sum(int(lf.offsets[-1]) for lf in segs)
        use_segments = final is None
        if final is not None:
            fw, sw = final.meta.get(S.META_WRITER), segs[0].meta.get(S.META_WRITER)
            if fw is not None and sw is not None and fw != sw:
                # two recordings: the one that began last is this path's ledger now
                use_segments = (segs[0].meta.get(S.META_STARTED) or 0) > (final.meta.get(S.META_STARTED) or 0)
            else:
                # one recording: its segments and the events it held in memory are always the whole
                # stream, and a final file written before later spills holds fewer
                use_segments = seg_events > int(final.offsets[-1])
        if use_segments:
            if final is not None:
                final.close()
            return segs, True
        for lf in segs:
            lf.close()
    if final is None:
        raise LedgerError("%s: no such file" % path)
    return [final], False


def _meta_key(meta: Meta) -> Meta:
    """A file's settings: what two files of one ledger, or two env ledgers of one run, agree on. Spaces
    only by what their values are digested over (sub-envs may differ in Box bounds, as
    observation_mode="different" allows); not what names the file (writer, run, times: PER_FILE_META)."""
    key = {k: v for k, v in meta.items() if k not in S.PER_FILE_META}
    for name in (S.META_OBS_SPACE, S.META_ACT_SPACE):
        if name in key:
            key[name] = digest_signature(key[name])
    return key


def read(path: LedgerPath) -> Ledger:
    """Read a ledger file, or every ``env-N.npz`` of an env directory.

    A ledger whose process was killed before it wrote its final file is read
    from its spilled segments, with ``partial`` set. Raises LedgerError with a
    one-line message on anything that is not a readable ledger.
    """
    return read_ledger(path)


def read_ledger(path: LedgerPath, accept: Accept | None = None, unread: list[tuple[str, str]] | None = None,
                linked: Callable[[Meta, Any], bool] | None = None, threads: int = 1) -> Ledger:
    """``read``, with ``accept(meta, name)`` deciding which env ledgers of a directory are read.

    ``accept`` returns None to read a file, or the reason it is left out (it is
    then in ``ledger.skipped`` as (name, reason), and its settings are not
    checked against the others). Files ``env-N.dup-*.npz``, written by a second
    recording of env N at the same time, and ``env-N.copy-*.npz``, by a copy of
    its LedgerEnv, are in ``ledger.duplicates`` as (name, N, meta) when accepted,
    else skipped; their events in ``ledger.duplicate_events``. ``linked(meta, N)``,
    if given, says a file's recording is env N of the trainer side's run (the
    trainer side told it so): such a file is env N's stream where ``env-N.npz`` is
    not (a copy pickled into a worker, an evaluation env that wrote env-N.npz first),
    and env-N.npz is then among the duplicates. Files ``env-unindexed-*.npz``,
    written by a LedgerEnv that had no index at its first event, are in
    ``ledger.unindexed`` as (name, meta, events, its first events' columns)
    when accepted, else skipped; they are never a stream.

    ``unread``, a list, takes (name, why) of each file of a directory that is named like an env ledger
    (``env-N.npz``, ``env-unindexed-*.npz``) but cannot be read as one (a stray file, a damaged one), and the
    others are read; without it such a file is refused (LedgerError). A directory where no env ledger can be
    read is refused either way.

    ``threads`` open a directory's env ledgers at once (opening one inflates and checks its small members,
    which releases the GIL); the result is the same.
    """
    path = storage.local_path(os.fspath(path))
    if storage.is_remote(path):
        return _read_url(path, accept, unread, threads=threads)
    if os.path.isdir(path) and not path.endswith(".spill"):
        names: set[str] = set()
        duplicates: list[str] = []
        unindexed: set[str] = set()
        died_empty: set[str] = set()  # mapped parts with nothing to read (said if nothing else is there)
        for entry in os.listdir(path):
            m = _ENV_FILE.match(entry)
            if m:
                names.add(entry)
            elif _DUP_FILE.match(entry):
                duplicates.append(entry)
            elif entry.endswith(".npz.spill") and _DUP_FILE.match(entry[:-6]) and entry[:-6] not in os.listdir(path) \
                    and _segments(os.path.join(path, entry[:-6])):
                duplicates.append(entry[:-6])  # a copy killed before its final file
            elif _UNINDEXED_FILE.match(entry):
                unindexed.add(entry)
            elif _MAP_FILE.match(entry):
                # an env killed before its first spill: its mapped part holds its events (one whose process
                # still runs is a recording in progress that has written nothing yet: not a ledger so far)
                name = _MAP_FILE.match(entry).group(1)  # type: ignore[union-attr]
                if name in names:
                    pass
                elif _live_map(os.path.join(path, name)) is None:
                    died_empty.add(name)
                elif _ENV_FILE.match(name):
                    names.add(name)
                elif _UNINDEXED_FILE.match(name):
                    unindexed.add(name)
            elif entry.endswith(".npz.spill") and _segments(os.path.join(path, entry[:-6])):
                # an env killed before writing its ledger; one killed before its
                # first complete segment left nothing to read, and is absent
                if _ENV_FILE.match(entry[:-6]):
                    names.add(entry[:-6])
                elif _UNINDEXED_FILE.match(entry[:-6]):
                    unindexed.add(entry[:-6])
        if not names and not duplicates:
            if unindexed:
                raise LedgerError("%s: no env ledgers with an index (env-N.npz) in this directory, only %s, "
                                  "recorded by LedgerEnvs that had no index at their first event: %s"
                                  % (path, _named(sorted(unindexed)), wording.SET_INDEX_HOW))
            for name in sorted(died_empty - names):
                _died_before_its_first_event(os.path.join(path, name))
            raise LedgerError("%s: no env ledgers (env-N.npz) in this directory" % path)
        files: list[LedgerFile] = []
        streams: dict[int, Stream] = {}
        meta: Meta | None = None
        partial = False
        skipped: list[tuple[str, str]] = []
        dups: list[tuple[str, int, Meta]] = []
        origin: dict[int, str] = {}  # env index -> the file its stream was read from
        refused: list[tuple[str, LedgerError]] = []  # (name, the LedgerError) of files named like env ledgers that cannot be read as one

        ordered = sorted(names, key=_env_file_index)
        opened = _open_many([os.path.join(path, name) for name in ordered], threads)

        def open_file(name: str) -> Any:
            got = opened.pop(name) if name in opened else _open_many([os.path.join(path, name)], 1)[name]
            if isinstance(got, LedgerError):
                if unread is None:
                    for led in opened.values():
                        if isinstance(led, Ledger):
                            led.close()
                    raise got
                refused.append((name, got))
                return None
            return got

        for name in ordered:
            sub = open_file(name)
            if sub is None:
                continue
            reason = accept(sub.meta, name) if accept else None
            if reason:
                skipped.append((name, reason))
                sub.close()
                continue
            files += sub._files
            partial |= sub.partial
            if meta is None:
                meta = sub.meta
            elif _meta_key(sub.meta) != _meta_key(meta):
                raise LedgerError("%s: %s was recorded with other settings than the other env ledgers"
                                  % (path, name))
            for idx, stream in sub.streams.items():
                if idx in streams:
                    raise LedgerError("%s: env %d appears in more than one file (%s and %s)"
                                      % (path, idx, origin[idx], name))
                streams[idx], origin[idx] = stream, name
        side_events: dict[str, int] = {}
        for name in sorted(duplicates):
            idx = _dup_file_index(name)
            try:
                sub = _read_file(os.path.join(path, name))
            except LedgerError:
                continue  # a second recording cut short: nothing to name
            dup_meta = dict(sub.meta)
            reason = accept(dup_meta, name) if accept else None
            if reason:
                skipped.append((name, reason))
                sub.close()
                continue
            if (linked is not None and linked(dup_meta, idx) and idx in sub.streams
                    and (idx not in streams or not linked(streams[idx].meta, streams[idx].meta.get(S.META_POSITION)))
                    and (meta is None or _meta_key(sub.meta) == _meta_key(meta))):
                # the recording the trainer side linked as env idx: its stream is env idx's
                if idx in streams:
                    dups.append((origin[idx], idx, dict(streams[idx].meta)))
                    side_events[origin[idx]] = len(streams[idx])
                files += sub._files
                partial |= sub.partial
                meta = sub.meta if meta is None else meta
                streams[idx], origin[idx] = sub.streams[idx], name
                continue
            with sub:
                side_events[name] = sub.n_events()
            dups.append((name, idx, dup_meta))
        lost: list[tuple[str, Meta, int, Columns | None]] = []
        for name in sorted(unindexed):
            sub = open_file(name)
            if sub is None:
                continue
            with sub:
                reason = accept(sub.meta, name) if accept else None
                if reason:
                    skipped.append((name, reason))
                    continue
                only = next(iter(sub.streams.values()), None)
                n = len(only) if only is not None else 0
                first = {k: np.asarray(v) for k, v in _first_rows(only).items()} if only is not None and n else None
                lost.append((name, dict(sub.meta), n, first))
        if meta is None and not skipped and not refused and dups:
            raise LedgerError("%s: no env ledgers (env-N.npz) in this directory, only %s, recorded by copies of "
                              "LedgerEnvs (docs/INDICES.md)" % (path, _named([name for name, _, _ in dups])))
        if refused:
            if meta is None and not skipped:
                raise refused[0][1]  # nothing there can be read: the first file's error
            assert unread is not None  # refused is only filled where unread was given
            unread += [(name, _why(exc, os.path.join(path, name))) for name, exc in refused]
        if meta is None:
            ledger = Ledger(path, {}, {}, False, [])
        else:
            ledger = Ledger(path, meta, dict(sorted(streams.items())), partial, files)
        ledger.skipped, ledger.duplicates, ledger.unindexed = skipped, dups, lost
        ledger.duplicate_events, ledger.origin = side_events, origin
        return ledger
    return _read_file(path)


def _open_many(paths: list[str], threads: int) -> dict[str, Ledger | LedgerError]:
    """Each ledger file of ``paths`` read (``_read_file``), or the LedgerError it raised, by base name;
    ``threads`` at once."""
    def one(p: str) -> Ledger | LedgerError:
        try:
            return _read_file(p)
        except LedgerError as exc:
            return exc
    if threads <= 1 or len(paths) <= 1:
        return {os.path.basename(p): one(p) for p in paths}
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(min(threads, len(paths))) as pool:
        return dict(zip((os.path.basename(p) for p in paths), pool.map(one, paths)))


def _env_file_index(name: str) -> int:
    """N of a name ``env-N.npz`` (one that _ENV_FILE matches)."""
    m = _ENV_FILE.match(name)
    assert m is not None
    return int(m.group(1))


def _dup_file_index(name: str) -> int:
    """N of a name ``env-N.dup-*.npz`` (one that _DUP_FILE matches)."""
    m = _DUP_FILE.match(name)
    assert m is not None
    return int(m.group(1))


FIRST_EVENTS = 4096  # events of a stream compared when looking for the trainer stream it matches


def _first_rows(stream: Stream) -> Columns:
    """The first events of a stream (at most FIRST_EVENTS), as columns."""
    parts: dict[str, list[np.ndarray]] = {n: [] for n in S.EVENT_COLUMN_NAMES}
    got = 0
    for chunk in stream.chunks(size=FIRST_EVENTS):
        for n in parts:
            parts[n].append(np.asarray(chunk[n])[: FIRST_EVENTS - got])
        got += len(parts["kind"][-1])
        if got >= FIRST_EVENTS:
            break
    return {n: np.concatenate(v) for n, v in parts.items()}


def _why(exc: Exception, path: str) -> str:
    """A LedgerError's message without the path it starts with."""
    text = str(exc)
    return text[len(path) + 2:] if text.startswith(path + ": ") else text


def _named(names: list[str]) -> str:
    return ", ".join(names[:4]) + (" and %d more" % (len(names) - 4) if len(names) > 4 else "")


def _live_map(path: str) -> MappedStreams | None:
    """The mapped part at ``path`` of the recording that began last and has events, else None. A recording
    whose process still runs is in progress: it is read from its files, as a recording without a mapped part
    is (format/mapped.writer_running)."""
    found = [m for m in _dead_maps(path) if m.n_events() or m.damaged]
    if not found:
        return None
    return max(found, key=lambda m: (m.meta.get(S.META_STARTED) or 0, m.writer or ""))


def _dead_maps(path: str) -> list[MappedStreams]:
    """The mapped parts at ``path`` whose writer's process is gone."""
    return [m for m in (read_map(p) for p in maps_of(path)) if m is not None and not writer_running(m.meta)]


def _died_before_its_first_event(path: str) -> None:
    """Where ``path`` has neither file nor segment: the one-line error that says so, if all there is is the
    empty mapped part of a recording whose process died before its first event (killed after it was set up)."""
    empty = [m for m in _dead_maps(path) if not m.n_events() and not m.damaged]
    if empty:
        raise LedgerError(wording.died_before_its_first_event(path, empty[-1].path))


def _with_map(path: str, files: list[Any], live: MappedStreams | None) -> tuple[list[Any], dict[str, Any]]:
    """``files`` (a final file or segments of one recording), with the mapped part of that recording
    after them: the events its rings hold that the files do not. Also what the reader notes of it
    (META_MAPPED, META_REBOOTED): read from the ledger's meta by compare and show, never in a file."""
    notes: dict[str, Any] = {}
    if live is None:
        return files, notes
    writer = files[-1].meta.get(S.META_WRITER) if files else None
    if files and live.writer != writer:
        began = files[-1].meta.get(S.META_STARTED) or 0
        if (live.meta.get(S.META_STARTED) or 0) <= began or not live.n_events():
            return files, notes  # an earlier recording's, left behind
        files = []  # a later recording that had not spilled yet: it is this path's ledger now
    if live.rebooted:
        notes[S.META_REBOOTED] = live.n_events()
        if not files:
            raise LedgerError("%s: %s" % (path, wording.rebooted_nothing()))
        return files, notes
    held: dict[int, int] = {}
    for lf in files:
        for k, sid in enumerate(lf.stream_ids):
            held[sid] = held.get(sid, 0) + int(lf.offsets[k + 1] - lf.offsets[k])
    tails: dict[int, Columns] = {}
    for sid, (base, cols) in live.streams.items():
        have = held.get(sid, 0)
        n = len(cols["kind"])
        if have < base:
            if n:
                notes[S.META_MAP_GAP] = notes.get(S.META_MAP_GAP, 0) + 1  # a segment it needs is missing
            # (empty: let go of, or overflowed, its events going on in memory only: it adds nothing)
            continue
        if have < base + n or (sid not in held and not files):
            tails[sid] = {name: arr[have - base:] for name, arr in cols.items()}
    died = {}
    for sid, (event, message, digest) in live.died.items():
        total = held.get(sid, 0) + (len(tails[sid]["kind"]) if sid in tails else 0)
        if total == event:  # every event before the step under way is read
            died[str(sid)] = {"event": event, "action": _action_text(message, digest)}
    if died:
        notes[S.META_DIED] = died
    if tails:
        part = _MapPart(live, tails)
        notes[S.META_MAPPED] = int(part.offsets[-1])
        files = files + [part]
    return files, notes


def _action_text(message: bytes | None, digest: int) -> str | None:
    """An action noted in a mapped part (its digest message: FORMAT.md section 2), as a report prints it."""
    if message is None:
        return None
    try:
        leaves = decode_leaves(message)
    except ValueError:
        return None
    return wording.values_text(leaves, [""] if len(leaves) == 1 else ["%d" % k for k in range(len(leaves))])


def _died_at(meta: Meta, streams: dict[int, Stream]) -> None:
    """Episode and step of each step that never returned (META_DIED), from its stream's positions."""
    for sid, entry in meta.get(S.META_DIED, {}).items():
        stream = streams.get(int(sid))
        if stream is None or not len(stream):
            entry["episode"], entry["step"] = 0, 0  # in its first reset
            continue
        episode, since, seen = -1, 0, 0  # resets so far, and the events since the last one
        for chunk in stream.chunks(("kind",)):
            resets = np.flatnonzero(np.asarray(chunk["kind"]) == S.KIND_RESET)
            n = len(chunk["kind"])
            if resets.size:
                episode += int(resets.size)
                since = n - 1 - int(resets[-1])
            else:
                since += n
            seen += n
        entry["episode"], entry["step"] = max(episode, 0), since + 1


def _read_file(path: str) -> Ledger:
    live = _live_map(path)
    try:
        files, partial = _read_one(path)
    except LedgerError:
        if os.path.exists(path) or _segments(path):
            raise
        if live is None:
            _died_before_its_first_event(path)
            raise
        files, partial = [], True
    files, notes = _with_map(path, files, live)
    if not files:
        raise LedgerError("%s: no such file" % path)
    partial = partial or S.META_MAPPED in notes
    # the newest file says how far the recording got and which run it is (the mapped part: what it knew at
    # its last change; the files of its recording know more, of the same settings)
    on_disk = [lf for lf in files if isinstance(lf, LedgerFile)]
    meta = dict(on_disk[-1].meta if on_disk else files[-1].meta)
    meta.pop(S.META_SEGMENT, None)
    meta.pop(S.META_THROUGH, None)
    if S.META_MAPPED in notes:
        meta[S.META_STATE] = S.STATE_OPEN  # it went on after its last file
        part_meta = files[-1].meta  # its mapped part's, written again whenever its fragments change
        if S.META_FRAGMENTS in part_meta:
            meta[S.META_FRAGMENTS] = part_meta[S.META_FRAGMENTS]  # those of the events it recorded since
    meta.update(notes)
    pieces: dict[int, list[_Piece]] = {}
    for lf in files:
        if isinstance(lf, _MapPart):
            pass  # the same recording as the files (its writer): its meta may lag behind theirs
        elif _meta_key(lf.meta) != _meta_key(on_disk[0].meta):
            raise LedgerError("%s: its spilled segments disagree on their settings" % lf.path)
        for k, s in enumerate(lf.stream_ids):
            pieces.setdefault(s, []).append(_Piece(lf, int(lf.offsets[k]), int(lf.offsets[k + 1])))
    streams = {s: Stream(s, ps, meta) for s, ps in sorted(pieces.items())}
    _died_at(meta, streams)
    return Ledger(path, meta, streams, partial, on_disk)


# Set while a Ray compare's driver reads (report/parallel.py): a URL's ledgers are then copied on demand
# (format/ondemand.py), so that the driver fetches what it reads of them, not their columns.
ON_DEMAND: contextvars.ContextVar[bool] = contextvars.ContextVar("stepledger_on_demand", default=False)


def _read_url(url: str, accept: Accept | None = None, unread: list[tuple[str, str]] | None = None,
              threads: int = 1) -> Ledger:
    """Read a ledger at an fsspec URL: copy it (and its spill segments) to a local directory, read the copy.

    The copy is removed when the Ledger is closed. Error messages name the URL. Under ON_DEMAND the copy
    is filled as it is read.
    """
    url = url.rstrip("/") if not url.endswith("://") else url
    tmp = tempfile.TemporaryDirectory(prefix="stepledger-read-")
    local = tmp.name
    made: list[OnDemand] = []
    try:
        # (URL, local path, size): fetched together, where object stores download them concurrently
        copies: list[tuple[str, str, int | None]] = []
        if storage.isdir(url):
            if url.endswith(".spill"):
                raise LedgerError("%s: is a directory, not a ledger file" % url)
            local = os.path.join(tmp.name, "ledger")
            os.makedirs(local)
            for name, size in sorted(storage.listing(url).items()):
                if _ENV_FILE.match(name) or _DUP_FILE.match(name) or _UNINDEXED_FILE.match(name):
                    copies.append((storage.join(url, name), os.path.join(local, name), size))
                elif name.endswith(".npz.spill") and (_ENV_FILE.match(name[:-6]) or _UNINDEXED_FILE.match(name[:-6])):
                    copies += _segment_copies(storage.join(url, name[:-6]), os.path.join(local, name[:-6]))
        else:
            local = os.path.join(tmp.name, url.rsplit("/", 1)[-1] or "ledger.npz")
            copies = [(url, local, None)] + _segment_copies(url, local)
        _copy_all(copies, made)
        ledger = read_ledger(local, accept, unread, threads=threads)
    except LedgerError as exc:
        for copy in made:
            copy.release()
        tmp.cleanup()
        raise type(exc)(str(exc).replace(local, url)) from None
    except BaseException:
        for copy in made:
            copy.release()
        tmp.cleanup()
        raise
    ledger.path = url
    ledger._copy = (tmp, local, url)
    ledger._on_demand = made
    return ledger


def _copy_all(copies: list[tuple[str, str, int | None]], made: list[OnDemand]) -> None:
    """Each (URL, local path, size) copied: whole, or, under ON_DEMAND, as an on-demand copy (appended to
    ``made``) with what opening it reads fetched."""
    if not ON_DEMAND.get():
        storage.fetch_all(copies)
        return
    for u, local, size in copies:
        if size is None:
            size = storage.size(u)
        if size is not None:  # else gone since it was listed, as fetch skips it
            made.append(OnDemand(u, local, size))
    prefetch(made)


def _segment_copies(url: str, local: str) -> list[tuple[str, str, int | None]]:
    """(URL, local path, size) of each spill segment of the ledger ``url`` (``url.spill/seg-*.npz``), next to
    its copy."""
    directory = spill_dir(url)
    return [(storage.join(directory, name), os.path.join(spill_dir(local), name), size)
            for name, size in sorted(storage.listing(directory).items()) if fnmatch.fnmatch(name, "seg-*.npz")]


# ---------------------------------------------------------------- several trainer files

_PATTERN = re.compile(r"[*?\[]")


def env_indices_of(name: str) -> range | None:
    """The env indices an env ledger's file name gives: N of ``env-N.npz``, N .. M of a batch's
    ``env-N-M.npz`` (and of their second recordings and copies), else None."""
    m = _ENV_FILE.match(name) or _DUP_FILE.match(name)
    if not m:
        return None
    first = int(m.group(1))
    return range(first, (int(m.group(2)) if m.group(2) is not None else first) + 1)


def _trainer_name(name: str) -> bool:
    """A file name a trainer ledger may have, from a glob or a directory: ``*.npz``, not an env ledger's
    name, not a temporary file."""
    return name.endswith(".npz") and S.TMP_INFIX not in name and not (
        _ENV_FILE.match(name) or _DUP_FILE.match(name) or _UNINDEXED_FILE.match(name))


def _ledgers_in(directory: str, names: Iterable[str], match: Callable[[str], bool]) -> list[str]:
    """The ledger paths among ``names`` (entries of ``directory``) that ``match`` accepts: files ``*.npz``,
    and ledgers that are only spill segments (``NAME.npz.spill/``, a writer killed before its final file)."""
    found: set[str] = set()
    remote = storage.is_remote(directory)
    for name in names:
        base = name[: -len(".spill")] if name.endswith(".npz.spill") else name
        if not _trainer_name(base) or not match(base):
            continue
        if base != name:
            spill = storage.join(directory, name)
            if not (storage.listdir(spill) if remote else _segments(os.path.join(directory, base))):
                continue
        found.add(base)
    return [storage.join(directory, n) if remote else os.path.join(directory, n) for n in sorted(found)]


def other_ledgers(directory: LedgerPath) -> list[str]:
    """The paths of the ledgers in ``directory`` (a local path or a URL) that are not env ledgers by their names
    (trainer ledgers, for ``stepledger show DIR``), a ledger killed before its final file found by its segments."""
    text = storage.local_path(os.fspath(directory))
    remote = storage.is_remote(text)
    text = text.rstrip("/") if remote else text
    return _ledgers_in(text, storage.listdir(text) if remote else os.listdir(text), lambda n: True)


def trainer_paths(spec: TrainerSpec) -> list[tuple[str, bool]]:
    """What a compare argument names as trainer ledgers: [(path, strict)].

    ``spec`` is a ledger file or URL, a glob of them (``ledger/trainer-*.npz``;
    at a URL only the file name part may be a pattern), a directory of them,
    or a list or tuple of any of these. From a glob or a directory, env-side
    ledgers by their names (``env-N.npz``...) are not taken, and a ledger
    killed before its final file is found by its spill segments; ``strict``
    is False for those found so, whose other sides and unreadable files are
    passed over with a line rather than refused. LedgerError if one names
    nothing.
    """
    specs: list[Any] = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    if not specs:
        raise LedgerError("no trainer ledger given")
    out: list[tuple[str, bool]] = []
    seen: set[str] = set()
    for item in specs:
        if not isinstance(item, (str, os.PathLike)):
            raise LedgerError("a trainer ledger must be a path, a glob or a URL, got %r" % (item,))
        text = storage.local_path(os.fspath(item))
        remote = storage.is_remote(text)
        if _PATTERN.search(text.rsplit("/", 1)[-1] if remote else text) and not (
                storage.exists(text) if remote else os.path.exists(text) or os.path.exists(text + ".spill")):
            if remote:
                parent, pattern = text.rsplit("/", 1)
                paths = _ledgers_in(parent, storage.listdir(parent),
                                    lambda n: fnmatch.fnmatchcase(n, pattern))
            else:
                names = glob.glob(text) + [p[: -len(".spill")] for p in glob.glob(text + ".spill")]
                paths = [p for p in sorted(set(names)) if _trainer_name(os.path.basename(p))
                         and (os.path.isfile(p) or _segments(p))]
            if not paths:
                raise LedgerError("%s: no trainer ledgers match this pattern" % text)
            found = [(p, False) for p in paths]
        elif (storage.isdir(text) if remote else os.path.isdir(text)) and not text.rstrip("/").endswith(".spill"):
            directory = text.rstrip("/") if remote else text
            names = storage.listdir(directory) if remote else os.listdir(directory)
            paths = _ledgers_in(directory, names, lambda n: True)
            if not paths:
                raise LedgerError("%s: no trainer ledgers (*.npz other than env-N.npz) in this directory" % text)
            found = [(p, False) for p in paths]
        else:
            found = [(text, True)]
        for p, strict in found:
            key = p if storage.is_remote(p) else os.path.realpath(p)
            if key not in seen:
                seen.add(key)
                out.append((p, strict))
    return out


def read_trainers(spec: TrainerSpec) -> tuple[list[tuple[str, Ledger]], list[str]]:
    """Read every trainer ledger ``spec`` names (see trainer_paths): ([(name, Ledger)], [lines of files passed over]).

    ``name`` is the file's base name, or its path where two share a base name.
    """
    paths = trainer_paths(spec)
    ledgers: list[tuple[str, Ledger]] = []
    passed: list[str] = []
    try:
        for p, strict in paths:
            try:
                led = read_ledger(p)
            except LedgerError as exc:
                if strict:
                    raise
                why = _why(exc, str(p))
                passed.append("%s: not read as a trainer ledger (%s)" % (p, why))
                continue
            if led.side != "trainer":
                led.close()
                if strict:
                    raise LedgerError("%s: not a trainer-side ledger (side %r)" % (p, led.side))
                passed.append("%s: not read as a trainer ledger (an %s-side ledger)" % (p, led.side))
                continue
            ledgers.append((p, led))
        if not ledgers:
            given = ", ".join(str(x) for x in spec) if isinstance(spec, (list, tuple)) else str(spec)
            raise LedgerError("%s: no trainer ledger there can be read (%s)" % (given, "; ".join(passed[:2])))

    except BaseException:
        for _, led in ledgers:
            led.close()
        raise
    bases = [str(p).rstrip("/").rsplit("/", 1)[-1] for p, _ in ledgers]
    named = [(b if bases.count(b) == 1 else str(p), led) for b, (p, led) in zip(bases, ledgers)]
    return named, passed


def fragments_of(name: str, stream: Stream) -> list[tuple[int, int]] | None:
    """[(offset, row), ...] of a trainer stream that holds slices of its env's stream (META_FRAGMENTS), or None."""
    found = stream.meta.get(S.META_FRAGMENTS)
    pairs = found.get(str(stream.index)) if isinstance(found, dict) else None
    if pairs is None:
        return None
    ok = isinstance(pairs, list) and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(v, int) and v >= 0 for v in p) for p in pairs)
    if not ok or [p[1] for p in pairs] != sorted(p[1] for p in pairs):
        raise LedgerError("%s: the fragments of env %d in its meta are damaged (%s)" % (name, stream.index,
                                                                                       json.dumps(pairs)[:80]))
    return [(p[0], p[1]) for p in pairs]


def _rows_of(stream: Stream, start: int, stop: int) -> list[_Piece]:
    """The pieces of rows [start, stop) of a stream."""
    out: list[_Piece] = []
    at = 0
    for p in stream.pieces:
        n = p.stop - p.start
        lo, hi = max(start, at), min(stop, at + n)
        if lo < hi:
            out.append(_Piece(p.lf, p.start + lo - at, p.start + hi - at))
        at += n
    return out


#: where two trainer files hold the same events: (first event, last event, the file before, the file that holds
#: them again)
Overlap = tuple[int, int, Union[str, None], str]


#: events of a stream that no trainer file holds: (stream, first event, last event, the file before or None, the
#: file after), worded by compare (wording.slices_do_not_tile, with the env ledger's agents)
Gap = tuple[int, int, int, Union[str, None], str]


def stitch(idx: int, parts: list[tuple[str, Stream]]) -> tuple[Stream, list[Gap], Overlap | None]:
    """One env's trainer stream from the slices of it that several trainer files hold: (Stream, gaps, overlap).

    ``parts`` is [(file name, Stream)], each stream with its fragments (``fragments_of``). The slices are
    put in the order of their offsets. Where they leave a gap (events no file holds), a ``Gap`` names the
    stream, the files and the events; where every file holding the env was closed cleanly, the slices stay as the
    learners had them, so compare reports the difference that makes at its event; where one was not (a
    learner killed), the stream ends at the gap. Events that two files hold (an overlap) are kept once, from
    the slice that comes first, so that the stream stays in step with the env's; ``overlap`` is the first
    one, (first event, last event, the file before, the file that holds them again), or None, and compare
    reports it at its first event.
    """
    slices: list[tuple[int, int, str, Stream, int]] = []
    for name, stream in parts:
        pairs = fragments_of(name, stream) or [(0, 0)]
        n = len(stream)
        for k, (offset, row) in enumerate(pairs):
            stop = min(pairs[k + 1][1] if k + 1 < len(pairs) else n, n)
            if row < stop:
                slices.append((offset, stop - row, name, stream, row))
    slices.sort(key=lambda x: (x[0], x[1]))
    closed = all(s.meta.get(S.META_STATE, S.STATE_CLOSED) == S.STATE_CLOSED for _, s in parts)
    pieces: list[_Piece] = []
    gaps: list[Gap] = []
    at = 0
    before: str | None = None
    overlap: Overlap | None = None
    for offset, count, name, stream, row in slices:
        if offset > at:
            gaps.append((idx, at, offset - 1, before, name))
            if not closed:
                break
        skip = max(at - offset, 0)  # events already in the stream, from the slice before: kept once
        if skip and overlap is None:
            overlap = (offset, offset + min(skip, count) - 1, before, name)
        if skip < count:
            pieces += _rows_of(stream, row + skip, row + count)
            at, before = offset + count, name
    meta = next((s.meta for _, s in parts if s.meta.get(S.META_STATE, S.STATE_CLOSED) != S.STATE_CLOSED),
                parts[0][1].meta)
    return Stream(idx, pieces, meta), gaps, overlap


class MergedLedger(Ledger):
    """Several trainer ledgers read as one: each stream from the file that holds it (``source[env]``), or
    stitched from the slices several files hold (``stitch``; the events no file holds in ``gaps``, the first
    overlap of each env's slices in ``overlaps[env]``)."""

    def __init__(self, path: str, named: list[tuple[str, Ledger]]) -> None:
        first = named[0][1]
        streams: dict[int, Stream] = {}
        source: dict[int, str] = {}  # env -> the trainer file its stream is read from
        files: list[LedgerFile] = []
        sliced: dict[int, list[tuple[str, Stream]]] = {}
        for name, led in named:
            files += led._files
            for idx, stream in led.streams.items():
                if len(stream) and fragments_of(name, stream) is not None:
                    sliced.setdefault(idx, []).append((name, stream))
                if idx not in streams or (len(stream) and not len(streams[idx])):
                    streams[idx], source[idx] = stream, name
        self.gaps: list[Gap] = []
        self.overlaps: dict[int, Overlap] = {}
        # env -> the files holding its stream
        self.holders: dict[int, list[str]] = {idx: [name] for idx, name in source.items()}
        for idx, parts in sorted(sliced.items()):
            streams[idx], gaps, overlap = stitch(idx, parts)
            source[idx], self.holders[idx] = parts[0][0], [name for name, _ in parts]
            self.gaps += gaps
            if overlap is not None:
                self.overlaps[idx] = overlap
        super().__init__(path, first.meta, dict(sorted(streams.items())), any(led.partial for _, led in named),
                         files)
        self.named = named
        self.source = source

    def close(self) -> None:
        for _, led in self.named:
            led.close()

    def rename(self, text: str) -> str:

        for _, led in self.named:
            text = led.rename(text)
        return text
