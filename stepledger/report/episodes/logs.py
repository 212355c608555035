"""The trainer's episode log, read from SB3's ``monitor.csv``, EpisodeLogTap's ``.npz`` or a CSV."""

from __future__ import annotations

import array
import csv
import json
import os
import re
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from stepledger.format import schema as S
from stepledger.errors import LedgerError
from stepledger.format.ledgerfile import open_regular, read_small_npz

if TYPE_CHECKING:
    import numpy.typing as npt
    from typing_extensions import Self

LOG_FORMAT = S.EPISODE_LOG_FORMAT
LOG_FORMAT_VERSION = S.EPISODE_LOG_VERSION
# What a reader accepts of a trainer's episode log, so that no log, however crafted, takes unbounded memory:
# the episode check holds up to about 350 bytes a logged episode (the log, the recorded episodes it may be
# paired with, and a matching's work arrays), so that 512k logged episodes keep it under 256 MB however
# long the ledgers (benchmarks/episodes_memory.py --log-limit measures the worst).
MAX_LOG_EPISODES = 1 << 19  # episodes in one log (all the N.monitor.csv files of a directory together)
MAX_LOG_MEMBER_BYTES = 8 * MAX_LOG_EPISODES  # one array of an .npz log: MAX_LOG_EPISODES of float64
MAX_LOG_CSV_BYTES = 32 << 20  # one CSV log (monitor.csv) file

_MONITOR_NAME = re.compile(r"^(\d+)\.monitor\.csv$")


# ---------------------------------------------------------------- the trainer's log

class EpisodeLog:
    """A trainer's episode log: returns ``r``, lengths ``l`` and, if known, ``env`` indices, in log order.

    ``kind`` says where it came from ("tap", "monitor", "csv", "arrays"); ``source``
    names the file or "arrays". ``covers`` lists the envs the log is about
    when it is about some of them only (one Monitor's file), else None: every
    env of the ledgers.
    """

    r: np.ndarray
    l: np.ndarray
    env: np.ndarray | None

    def __init__(self, r: npt.ArrayLike, l: npt.ArrayLike, env: npt.ArrayLike | None = None,
                 kind: str = "arrays", source: str = "arrays", covers: Iterable[int] | None = None) -> None:
        r = np.asarray(r, dtype=np.float64).reshape(-1)
        l_arr = np.asarray(l)
        if l_arr.size and (l_arr.dtype.kind == "f" and np.any(l_arr != np.round(l_arr))):
            raise LedgerError("%s: episode lengths must be whole numbers" % source)
        l_arr = l_arr.astype(np.int64).reshape(-1)
        if r.shape != l_arr.shape:
            raise LedgerError("%s: %d returns but %d lengths" % (source, r.shape[0], l_arr.shape[0]))
        if env is not None:
            e = np.asarray(env)
            if e.size and (e.dtype.kind not in "iu" and not (e.dtype.kind == "f" and np.all(e == np.round(e)))):
                raise LedgerError("%s: env indices must be integers" % source)
            env = e.astype(np.int64).reshape(-1)
            if env.shape != r.shape:
                raise LedgerError("%s: %d env indices but %d returns" % (source, env.shape[0], r.shape[0]))
            if env.size and env.min() < 0:
                raise LedgerError("%s: a negative env index" % source)
        self.r, self.l, self.env, self.kind, self.source = r, l_arr, env, kind, source
        self.covers: list[int] | None = None if covers is None else sorted(int(c) for c in covers)

    def __len__(self) -> int:
        return int(self.r.shape[0])

    @classmethod
    def from_arrays(cls, env: npt.ArrayLike | None, r: npt.ArrayLike, l: npt.ArrayLike) -> Self:
        """From three parallel arrays; ``env`` may be None when the log has no env index."""
        return cls(r, l, env)

    def __repr__(self) -> str:
        return "<EpisodeLog %s (%s): %d episodes%s>" % (self.source, self.kind, len(self),
                                                       "" if self.env is not None else ", no env index")


def as_log(log: Any, env: int | None = None) -> EpisodeLog:
    """``log`` as check_episodes takes it (a path, an EpisodeLog, a dict, rows), as an EpisodeLog."""
    if isinstance(log, EpisodeLog):
        out = log
    elif isinstance(log, (str, os.PathLike)):
        out = read_episode_log(log)
    elif isinstance(log, dict):
        missing = [k for k in ("r", "l") if k not in log]
        if missing:
            raise LedgerError("arrays: a dict log needs keys 'r' and 'l' (and 'env' if known); missing %s"
                              % ", ".join(missing))
        out = EpisodeLog(log["r"], log["l"], log.get("env"))
    else:
        try:
            rows = np.asarray(log, dtype=np.float64)
        except (TypeError, ValueError):
            raise LedgerError("arrays: a log is a path, an EpisodeLog, a dict with 'env', 'r', 'l', or rows of "
                              "(env, return, length); got %s" % type(log).__name__) from None
        if rows.size == 0:
            rows = rows.reshape(0, 3)
        if rows.ndim != 2 or rows.shape[1] != 3:
            raise LedgerError("arrays: rows of (env, return, length) must have shape (n, 3), got %s" % (rows.shape,))
        out = EpisodeLog(rows[:, 1], rows[:, 2], rows[:, 0])
    if env is not None:
        if out.env is not None and np.any(out.env != env):
            raise LedgerError("%s: the log names its own env indices; do not pass env" % out.source)
        out = EpisodeLog(out.r, out.l, np.full(len(out), int(env), dtype=np.int64), out.kind, out.source, [env])
    return out


def read_episode_log(path: str | os.PathLike[str]) -> EpisodeLog:
    """Read a trainer's episode log from a file (or a directory of ``N.monitor.csv`` files).

    - SB3 ``monitor.csv`` (VecMonitor or Monitor): a ``#{json}`` line, then
      columns r, l, t. No env index, unless the file is named
      ``N.monitor.csv`` (as ``make_vec_env(monitor_dir=...)`` names Monitor's
      files), which gives env N. A directory of ``N.monitor.csv`` files gives
      one env each.
    - ``EpisodeLogTap``'s ``.npz`` (env, r, l, vstep), or any ``.npz`` with
      arrays r and l and optionally env.
    - a CSV with columns env, r, l (any others ignored).

    Raises LedgerError with a one-line message when it cannot.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        files = sorted((int(m.group(1)), f) for f in os.listdir(path) for m in [_MONITOR_NAME.match(f)] if m)
        if not files:
            raise LedgerError("%s: a directory with no N.monitor.csv files; give the episode log file" % path)
        parts: list[EpisodeLog] = []
        total = 0
        for _, f in files:
            parts.append(_read_csv(os.path.join(path, f), MAX_LOG_EPISODES - total, path))
            total += len(parts[-1])
        r = np.concatenate([p.r for p in parts])
        l_arr = np.concatenate([p.l for p in parts])
        env = np.concatenate([np.full(len(p), i, dtype=np.int64) for (i, _), p in zip(files, parts)])
        return EpisodeLog(r, l_arr, env, "monitor", path)
    fd, _ = open_regular(path)  # a FIFO or a device is refused, not read forever
    try:
        head = os.pread(fd, 4, 0)
    except OSError as exc:
        raise LedgerError("%s: cannot read the episode log (%s)" % (path, exc.strerror or exc)) from None
    finally:
        os.close(fd)
    if head.startswith(b"PK"):
        return _read_npz(path)
    return _read_csv(path)


def _read_npz(path: str) -> EpisodeLog:
    members = read_small_npz(path, MAX_LOG_MEMBER_BYTES, what="episode log")
    if S.META_MEMBER in members:
        try:
            meta = json.loads(str(members[S.META_MEMBER][()]))
        except (ValueError, TypeError, RecursionError):  # deeply nested JSON recurses
            meta = {}
        if isinstance(meta, dict) and meta.get(S.META_FORMAT) == S.FORMAT_NAME:
            raise LedgerError("%s: a stepledger ledger (%s side), not an episode log; give the file EpisodeLogTap "
                              "wrote, or monitor.csv" % (path, meta.get(S.META_SIDE)))
        if isinstance(meta, dict) and meta.get(S.META_FORMAT) == LOG_FORMAT and \
                meta.get(S.META_FORMAT_VERSION, 0) > LOG_FORMAT_VERSION:
            raise LedgerError("%s: episode log format version %s is newer than this stepledger reads"
                              % (path, meta.get(S.META_FORMAT_VERSION)))
    if "r" not in members or "l" not in members:
        raise LedgerError("%s: not an episode log (an .npz episode log holds arrays r and l, and env if known)" % path)
    try:
        for name in ("r", "l", "env"):
            if name in members and members[name].dtype.kind not in "biuf":
                raise TypeError("%s is %s, not numbers" % (name, members[name].dtype))
        if members["r"].size > MAX_LOG_EPISODES:
            raise _too_many(path)
        return EpisodeLog(members["r"], members["l"], members.get("env"), "tap", path)
    except (TypeError, ValueError) as exc:
        raise LedgerError("%s: not a readable episode log (%s)" % (path, exc)) from None


def _too_many(path: str) -> LedgerError:
    return LedgerError("%s: an episode log of more than %d episodes; a reader accepts at most %d"
                       % (path, MAX_LOG_EPISODES, MAX_LOG_EPISODES))


def _read_csv(path: str, room: int | None = None, whole: str | None = None) -> EpisodeLog:
    """One CSV log, read line by line into arrays (8 bytes a value); at most ``room`` episodes (by default
    MAX_LOG_EPISODES), else a LedgerError naming ``whole`` (the directory it is part of) or the file."""
    room = MAX_LOG_EPISODES if room is None else room
    fd, size = open_regular(path)
    if size > MAX_LOG_CSV_BYTES:
        os.close(fd)
        raise LedgerError("%s: an episode log of %d MB; a reader accepts at most %d MB of CSV (EpisodeLogTap's .npz "
                          "holds more)" % (path, size >> 20, MAX_LOG_CSV_BYTES >> 20))
    r, l_arr, env = array.array("d"), array.array("q"), array.array("q")
    header: list[str] | None
    try:
        with open(fd, newline="", closefd=True) as f:
            first = 1
            line = f.readline(MAX_LOG_CSV_BYTES + 1)
            while line.startswith("#"):
                first += 1
                line = f.readline(MAX_LOG_CSV_BYTES + 1)
            header = next(csv.reader([line]), None) if line.strip() else None
            if header is None:
                raise LedgerError("%s: not an episode log (no header line with columns r and l)" % path)
            header = [h.strip() for h in header]
            if "r" not in header or "l" not in header:
                raise LedgerError("%s: not an episode log (its columns are %s; expected r and l, as in monitor.csv, "
                                  "and env if known)" % (path, ", ".join(header[:8]) or "none"))
            ir, il = header.index("r"), header.index("l")
            ie = header.index("env") if "env" in header else None
            for n, row in enumerate(csv.reader(f), start=first + 1):
                if not row or not any(x.strip() for x in row):
                    continue
                if len(r) >= room:
                    raise _too_many(whole or path)
                try:
                    rv = float(row[ir])
                    lv = float(row[il])
                    if lv != int(lv):
                        raise ValueError
                    if ie is not None:
                        ev = float(row[ie])
                        if ev != int(ev):
                            raise ValueError
                        env.append(int(ev))
                    r.append(rv)
                    l_arr.append(int(lv))
                except (ValueError, IndexError, OverflowError):
                    raise LedgerError("%s: line %d is not a row of the episode log: %r" % (path, n, ",".join(row)[:80])) \
                        from None
    except UnicodeDecodeError:
        raise LedgerError("%s: not an episode log (neither text nor an .npz)" % path) from None
    except csv.Error as exc:
        raise LedgerError("%s: not an episode log (%s)" % (path, exc)) from None
    except OSError as exc:
        raise LedgerError("%s: cannot read the episode log (%s)" % (path, exc.strerror or exc)) from None
    returns, lengths = np.frombuffer(r, dtype=np.float64), np.frombuffer(l_arr, dtype=np.int64)
    m = _MONITOR_NAME.match(os.path.basename(path))
    if ie is not None:
        return EpisodeLog(returns, lengths, np.frombuffer(env, dtype=np.int64), "csv", path)
    kind = "monitor" if "t" in header or path.endswith("monitor.csv") else "csv"
    if m:
        return EpisodeLog(returns, lengths, np.full(len(returns), int(m.group(1)), dtype=np.int64), kind, path,
                          [int(m.group(1))])
    return EpisodeLog(returns, lengths, None, kind, path)

