"""The episode check: the trainer's own episode log against the env's record.

The step ledger checks what crosses the boundary. The returns a trainer
reports come from its episode log instead (SB3's ``monitor.csv``, Gymnasium's
``RecordEpisodeStatistics``), which is computed on the trainer's side and can
be wrong on its own: Gymnasium 1.1 to 1.3's vector ``RecordEpisodeStatistics``
under SAME_STEP drops each later episode's first reward and step. The env-side
ledger holds every reward exactly, so each episode's true return and length
can be derived from it and checked against the log.

``check_episodes(env_dir, log)`` returns an ``EpisodeReport``; the command is
``stepledger episodes ENV_DIR LOG``. ``EpisodeLogTap`` saves what a Gymnasium
vector ``RecordEpisodeStatistics`` reports, with each episode's env index.
See docs/EPISODES.md.

Episodes from the ledger. An episode is a reset event and the step events
after it, up to and including the first step with terminated or truncated;
its length is the number of those steps, its return the sum of their rewards
(read from the raw reward bits, summed in float64). Only episodes that ended
that way are compared. Not compared: the last episode of a stream if it was
still running when the ledger ended (a trainer logs an episode when it ends,
so the log cannot have it either), episodes cut off by a reset before they
ended (trainers' logs skip them too), and steps outside any episode. The
report counts each kind. Ledgers are read chunk by chunk; only one summary
row per episode is kept in memory.

Tolerance. Lengths must match exactly. A logged return ``r`` matches an
episode with rewards ``x_i`` when ``|r - R| <= rtol * sum(|x_i|) + atol``
(``rtol = atol = 1e-5`` by default, atol once per episode) for R either the
float64 sum of the recorded rewards or their running float32 sum (the sum SB3's
VecMonitor keeps, exactly). This absorbs float32 against float64 rewards and
summation, and SB3's Monitor rounding returns to 6 decimals. No absolute term
grows with the length, so that a dropped reward still shows in a long episode;
a dropped reward within the tolerance (a reward of 0, say) cannot show.
"""

import csv
import json
import os
import re

import gymnasium as gym
import numpy as np

from . import _jsonout
from . import _schema as S
from . import core
from . import wording
from .__about__ import __version__
from .errors import LedgerError
from .ledgerfile import CHUNK, atomic_file, open_regular, read_small_npz
from .read import read

LOG_FORMAT = "stepledger-episode-log"
# What a reader accepts of a trainer's episode log, so that no log, however crafted, takes unbounded memory.
MAX_LOG_MEMBER_BYTES = 64 << 20  # one array of an .npz log: 8M episodes of float64
MAX_LOG_CSV_BYTES = 32 << 20  # a CSV log (monitor.csv): about 1M episodes
LOG_FORMAT_VERSION = 1
RTOL = 1e-5
ATOL = 1e-5  # per step
MATCH_MODES = ("auto", "env", "order", "multiset")
LOG_FAULTS = ("log:drop-first", "log:short")

_MONITOR_NAME = re.compile(r"^(\d+)\.monitor\.csv$")
_SHORT_RUN = 64  # episodes up to this long get their float32 sums in lockstep


# ---------------------------------------------------------------- the env's episodes

class RecordedEpisodes:
    """Completed episodes derived from an env-side ledger, as columns.

    One row per completed episode, ordered by env then episode: ``env``,
    ``episode`` (the ledger's episode number, counted from 0 at the first
    reset, as compare counts), ``length``, ``ret`` (float64 sum), ``ret32``
    (running float32 sum), ``abs_sum`` (sum of |reward|) and ``end_step`` (how
    many step events the env's stream holds up to and including the episode's
    last step). Also ``unfinished`` (env -> (episode, steps)) for a stream's
    last episode still running when the ledger ended, ``cut`` (env -> list of
    episode numbers ended by a reset before terminated or truncated, an int64 array),
    ``stray_steps`` (env -> steps outside any episode), ``total_steps`` (env ->
    step events) and ``envs`` (every stream's env index).
    """

    def __init__(self, columns, unfinished, cut, stray_steps, total_steps, envs, partial):
        self.columns = columns
        self.unfinished, self.cut, self.stray_steps = unfinished, cut, stray_steps
        self.total_steps, self.envs, self.partial = total_steps, envs, partial

    def __len__(self):
        return int(self.columns["env"].shape[0])

    def of_env(self, env):
        sel = self.columns["env"] == env
        return {k: v[sel] for k, v in self.columns.items()}

    def restrict(self, envs):
        """The same, for the envs in ``envs`` only."""
        keep = set(envs)
        sel = np.isin(self.columns["env"], sorted(keep))
        only = lambda d: {e: v for e, v in d.items() if e in keep}  # noqa: E731
        return RecordedEpisodes({k: v[sel] for k, v in self.columns.items()}, only(self.unfinished), only(self.cut),
                                only(self.stray_steps), only(self.total_steps), [e for e in self.envs if e in keep],
                                self.partial)


class _Carry:
    """The state of one stream between chunks."""

    def __init__(self):
        self.ep, self.active = -1, False
        self.n, self.s64, self.s32, self.sabs = 0, 0.0, np.float32(0.0), 0.0
        self.steps, self.stray = 0, 0


def _rewards(bits, reward_dtype):
    bits = np.asarray(bits, dtype=np.uint64)
    invalid = bits == np.uint64(core.INVALID_DIGEST)
    if reward_dtype == "float32":
        r32 = (bits & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
        r64 = r32.astype(np.float64)
    else:
        r64 = bits.view(np.float64).copy()
        with np.errstate(over="ignore", invalid="ignore"):  # NaN and inf rewards are data, not errors
            r32 = r64.astype(np.float32)
    if invalid.any():
        r64 = np.where(invalid, np.nan, r64)
        r32 = np.where(invalid, np.float32(np.nan), r32).astype(np.float32)
    return r64, r32


def _running_f32(r32, starts, lengths, init):
    """Sequential float32 sums of r32[starts[j]:starts[j] + lengths[j]], each started from init[j]."""
    out = np.array(init, dtype=np.float32)
    short = np.flatnonzero((lengths > 0) & (lengths <= _SHORT_RUN))
    if short.size:
        for k in range(int(lengths[short].max())):
            alive = short[lengths[short] > k]
            out[alive] = out[alive] + r32[starts[alive] + k]
    for j in np.flatnonzero(lengths > _SHORT_RUN):
        a = int(starts[j])
        run = np.empty(int(lengths[j]) + 1, dtype=np.float32)
        run[0] = out[j]
        run[1:] = r32[a:a + int(lengths[j])]
        out[j] = np.add.accumulate(run, dtype=np.float32)[-1]
    return out


def _stream_episodes(stream, reward_dtype, rows, cut, chunk=CHUNK):
    """Append one stream's completed episodes to ``rows`` (lists by column); return its carry."""
    c = _Carry()
    for part in stream.chunks(names=("kind", "h_rew", "terminated", "truncated"), size=chunk):
        kind = np.asarray(part["kind"])
        m = kind.shape[0]
        if m == 0:
            continue
        r64, r32 = _rewards(part["h_rew"], reward_dtype)
        is_reset = kind == S.KIND_RESET
        is_step = ~is_reset
        end = is_step & (np.asarray(part["terminated"]) | np.asarray(part["truncated"]))
        seg = np.cumsum(is_reset)  # 0: the episode carried in from the previous chunk
        nseg = int(seg[-1]) + 1
        reset_idx = np.flatnonzero(is_reset)
        ends_before = np.cumsum(end) - end  # ends strictly before each event
        base = np.zeros(nseg, dtype=np.int64)
        base[1:] = ends_before[reset_idx]
        active0 = np.ones(nseg, dtype=bool)
        active0[0] = c.active
        member = is_step & (ends_before - base[seg] == 0) & active0[seg]
        c.stray += int(np.count_nonzero(is_step & ~member))
        step_count = c.steps + np.cumsum(is_step)
        c.steps = int(step_count[-1])

        mseg = seg[member]
        cnt = np.bincount(mseg, minlength=nseg).astype(np.int64)
        s64 = np.bincount(mseg, weights=r64[member], minlength=nseg)
        sabs = np.bincount(mseg, weights=np.abs(r64[member]), minlength=nseg)
        starts = np.zeros(nseg, dtype=np.int64)
        starts[1:] = reset_idx + 1
        init = np.zeros(nseg, dtype=np.float32)
        init[0] = c.s32 if c.active else 0.0
        s32 = _running_f32(r32, starts, cnt, init)
        if c.active:
            cnt[0] += c.n
            s64[0] += c.s64
            sabs[0] += c.sabs
        ended = np.zeros(nseg, dtype=bool)
        end_step = np.zeros(nseg, dtype=np.int64)
        last = np.flatnonzero(member & end)
        ended[seg[last]] = True
        end_step[seg[last]] = step_count[last]
        epno = c.ep + np.arange(nseg, dtype=np.int64)

        done = np.flatnonzero(ended & active0)
        rows["env"].append(np.full(done.size, stream.index, dtype=np.int64))
        rows["episode"].append(epno[done])
        rows["length"].append(cnt[done])
        rows["ret"].append(s64[done])
        rows["ret32"].append(s32[done])
        rows["abs_sum"].append(sabs[done])
        rows["end_step"].append(end_step[done])
        # segments followed by a reset, still running when it came: cut off
        cut_here = epno[:-1][active0[:-1] & ~ended[:-1]]
        cut_here = cut_here[cut_here >= 0]
        if cut_here.size:  # arrays, not lists of ints: a ledger of millions of resets stays small
            cut.setdefault(stream.index, []).append(cut_here)

        lastseg = nseg - 1
        c.ep = int(epno[lastseg])
        c.active = bool(active0[lastseg] and not ended[lastseg])
        if c.active:
            c.n, c.s64, c.s32, c.sabs = int(cnt[lastseg]), float(s64[lastseg]), s32[lastseg], float(sabs[lastseg])
        else:
            c.n, c.s64, c.s32, c.sabs = 0, 0.0, np.float32(0.0), 0.0
    return c


_REFUSE_TRAINER = ("%s: a trainer-side ledger; the episode check reads the env-side ledgers, the directory "
                   "LedgerEnv wrote env-N.npz into")


# Events a chunk when deriving episodes: about twenty arrays of a chunk's length are alive at once, so
# 256K events keep that near 40 MB whatever the ledger holds.
EPISODE_CHUNK = 1 << 18


def recorded_episodes(env_dir, chunk=EPISODE_CHUNK, progress=None):
    """Derive every env's completed episodes from the env-side ledgers in ``env_dir``.

    Returns a RecordedEpisodes. Reads ``chunk`` events at a time. Raises
    LedgerError when ``env_dir`` holds no readable env-side ledger.
    ``progress(done, total)``, if given, is called after each env.
    """
    ledger = read(env_dir)
    try:
        if ledger.side == "trainer":
            raise LedgerError(_REFUSE_TRAINER % env_dir)
        if ledger.side != "env":
            raise LedgerError("%s: not an env-side ledger (side %r)" % (env_dir, ledger.side))
        reward_dtype = ledger.meta.get(S.META_REWARD_DTYPE)
        if reward_dtype not in S.REWARD_DTYPES:
            raise LedgerError("%s: unknown reward dtype %r" % (env_dir, reward_dtype))
        names = ("env", "episode", "length", "ret", "ret32", "abs_sum", "end_step")
        rows = {k: [] for k in names}
        unfinished, cut, stray, total = {}, {}, {}, {}
        for k, (idx, stream) in enumerate(ledger.streams.items()):
            with np.errstate(over="ignore", invalid="ignore"):  # sums of inf and NaN rewards are data too
                c = _stream_episodes(stream, reward_dtype, rows, cut, chunk)
            if c.active:
                unfinished[idx] = (c.ep, c.n)
            stray[idx], total[idx] = c.stray, c.steps
            if progress is not None:
                progress(k + 1, len(ledger.streams))
        dtypes = {"ret": np.float64, "ret32": np.float32, "abs_sum": np.float64}
        columns = {k: (np.concatenate(v) if v else np.empty(0, dtypes.get(k, np.int64))) for k, v in rows.items()}
        cut = {e: np.concatenate(v) for e, v in cut.items()}
        return RecordedEpisodes(columns, unfinished, cut, stray, total, sorted(ledger.streams), ledger.partial)
    finally:
        ledger.close()


# ---------------------------------------------------------------- the trainer's log

class EpisodeLog:
    """A trainer's episode log: returns ``r``, lengths ``l`` and, if known, ``env`` indices, in log order.

    ``kind`` says where it came from ("tap", "monitor", "csv", "arrays"); ``source``
    names the file or "arrays". ``covers`` lists the envs the log is about
    when it is about some of them only (one Monitor's file), else None: every
    env of the ledgers.
    """

    def __init__(self, r, l, env=None, kind="arrays", source="arrays", covers=None):
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
        self.covers = None if covers is None else sorted(int(c) for c in covers)

    def __len__(self):
        return int(self.r.shape[0])

    @classmethod
    def from_arrays(cls, env, r, l):
        """From three parallel arrays; ``env`` may be None when the log has no env index."""
        return cls(r, l, env)

    def __repr__(self):
        return "<EpisodeLog %s (%s): %d episodes%s>" % (self.source, self.kind, len(self),
                                                       "" if self.env is not None else ", no env index")


def _as_log(log, env=None):
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


def read_episode_log(path):
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
        parts = [_read_csv(os.path.join(path, f)) for _, f in files]
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


def _read_npz(path):
    members = read_small_npz(path, MAX_LOG_MEMBER_BYTES, what="episode log")
    if "meta" in members:
        try:
            meta = json.loads(str(members[S.META_MEMBER][()]))
        except (ValueError, TypeError, RecursionError):  # deeply nested JSON recurses
            meta = {}
        if isinstance(meta, dict) and meta.get(S.META_FORMAT) == S.FORMAT_NAME:
            raise LedgerError("%s: a stepledger ledger (%s side), not an episode log; give the file EpisodeLogTap "
                              "wrote, or monitor.csv" % (path, meta.get(S.META_SIDE)))
        if isinstance(meta, dict) and meta.get("format") == LOG_FORMAT and \
                meta.get("format_version", 0) > LOG_FORMAT_VERSION:
            raise LedgerError("%s: episode log format version %s is newer than this stepledger reads"
                              % (path, meta.get("format_version")))
    if "r" not in members or "l" not in members:
        raise LedgerError("%s: not an episode log (an .npz episode log holds arrays r and l, and env if known)" % path)
    try:
        for name in ("r", "l", "env"):
            if name in members and members[name].dtype.kind not in "biuf":
                raise TypeError("%s is %s, not numbers" % (name, members[name].dtype))
        return EpisodeLog(members["r"], members["l"], members.get("env"), "tap", path)
    except (TypeError, ValueError) as exc:
        raise LedgerError("%s: not a readable episode log (%s)" % (path, exc)) from None


def _read_csv(path):
    fd, size = open_regular(path)
    if size > MAX_LOG_CSV_BYTES:
        os.close(fd)
        raise LedgerError("%s: an episode log of %d MB; a reader accepts at most %d MB of CSV (EpisodeLogTap's .npz "
                          "holds more)" % (path, size >> 20, MAX_LOG_CSV_BYTES >> 20))
    try:
        with open(fd, newline="", closefd=True) as f:
            text = f.read(MAX_LOG_CSV_BYTES + 1)
    except UnicodeDecodeError:
        raise LedgerError("%s: not an episode log (neither text nor an .npz)" % path) from None
    except OSError as exc:
        raise LedgerError("%s: cannot read the episode log (%s)" % (path, exc.strerror or exc)) from None
    lines = text.splitlines()
    first = 0
    while first < len(lines) and lines[first].startswith("#"):
        first += 1
    reader = csv.reader(lines[first:])
    header = next(reader, None)
    if header is None:
        raise LedgerError("%s: not an episode log (no header line with columns r and l)" % path)
    header = [h.strip() for h in header]
    if "r" not in header or "l" not in header:
        raise LedgerError("%s: not an episode log (its columns are %s; expected r and l, as in monitor.csv, "
                          "and env if known)" % (path, ", ".join(header[:8]) or "none"))
    ir, il = header.index("r"), header.index("l")
    ie = header.index("env") if "env" in header else None
    r, l_arr, env = [], [], []
    for n, row in enumerate(reader, start=first + 2):
        if not row or not any(x.strip() for x in row):
            continue
        try:
            r.append(float(row[ir]))
            lv = float(row[il])
            if lv != int(lv):
                raise ValueError
            l_arr.append(int(lv))
            if ie is not None:
                ev = float(row[ie])
                if ev != int(ev):
                    raise ValueError
                env.append(int(ev))
        except (ValueError, IndexError, OverflowError):
            raise LedgerError("%s: line %d is not a row of the episode log: %r" % (path, n, ",".join(row)[:80])) \
                from None
    m = _MONITOR_NAME.match(os.path.basename(path))
    if ie is not None:
        return EpisodeLog(r, l_arr, env, "csv", path)
    kind = "monitor" if "t" in header or path.endswith("monitor.csv") else "csv"
    if m:
        return EpisodeLog(r, l_arr, [int(m.group(1))] * len(r), kind, path, [int(m.group(1))])
    return EpisodeLog(r, l_arr, None, kind, path)


# ---------------------------------------------------------------- the tap

class EpisodeLogTap(gym.vector.VectorWrapper):
    """Saves what a vector ``RecordEpisodeStatistics`` reports, with each episode's env index.

    Put it outermost on the trainer side, around ``RecordEpisodeStatistics``
    (and whatever else the trainer wraps), so that it sees the ``info`` the
    training loop sees. At every step, for each env set in
    ``info["_episode"]``, it keeps ``info["episode"]["r"][i]`` and
    ``["l"][i]``. It changes nothing it passes through. ``close()`` (and
    ``flush()``) write ``path``: an ``.npz`` with ``env`` (int64), ``r``
    (float64), ``l`` (int64), ``vstep`` (int64, the tap's vector step count
    when the episode was reported, from 1) and ``meta`` (a JSON string).

    Example::

        envs = gym.vector.SyncVectorEnv([...])       # LedgerEnv outermost in each env
        envs = RecordEpisodeStatistics(envs)
        envs = EpisodeLogTap(envs, "ledger/episodes.npz")
        ...
        envs.close()
        print(check_episodes("ledger", "ledger/episodes.npz"))
    """

    def __init__(self, env, path, stats_key="episode"):
        super().__init__(env)
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError("EpisodeLogTap: path must be a path, got %r" % (path,))
        self.log_path = os.fspath(path)
        self.stats_key = stats_key
        self._env, self._r, self._l, self._vstep = [], [], [], []
        self._vsteps = 0
        self._closed = False

    def step(self, actions):
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        self._vsteps += 1
        self._take(infos)
        return obs, rewards, terminations, truncations, infos

    def _take(self, infos):
        stats = infos.get(self.stats_key) if isinstance(infos, dict) else None
        mask = infos.get("_" + self.stats_key) if stats is not None else None
        if stats is None or mask is None:
            return
        for i in np.flatnonzero(np.asarray(mask)):
            self._env.append(int(i))
            self._r.append(float(np.asarray(stats["r"])[i]))
            self._l.append(int(np.asarray(stats["l"])[i]))
            self._vstep.append(self._vsteps)

    @property
    def episodes(self):
        """The entries kept so far, as an EpisodeLog."""
        return EpisodeLog(self._r, self._l, self._env, "tap", self.log_path)

    def flush(self):
        """Write the log file now; tapping goes on."""
        mode = self.env.metadata.get("autoreset_mode") if isinstance(self.env.metadata, dict) else None
        meta = {"format": LOG_FORMAT, "format_version": LOG_FORMAT_VERSION, "stats_key": self.stats_key,
                "num_envs": int(self.num_envs),
                "autoreset_mode": getattr(mode, "name", None if mode is None else str(mode)),
                "gymnasium_version": gym.__version__, "stepledger_version": __version__}
        with atomic_file(self.log_path) as f:
            np.savez(f, env=np.asarray(self._env, dtype=np.int64), r=np.asarray(self._r, dtype=np.float64),
                     l=np.asarray(self._l, dtype=np.int64), vstep=np.asarray(self._vstep, dtype=np.int64),
                     meta=np.array(json.dumps(meta, sort_keys=True)))

    def close(self, **kwargs):
        """Write the log file, then close the wrapped env."""
        try:
            if not self._closed:
                self.flush()
                self._closed = True
        finally:
            super().close(**kwargs)


# ---------------------------------------------------------------- the report

class EpisodeDifference:
    """One line of an EpisodeReport.

    ``what``: ``"episode"`` (a logged episode against the recorded one it was
    paired with), ``"count"`` (the shared episodes agree but one side has
    more), ``"log_only"`` (the log names an env no ledger has), ``"extra"``
    (log rows left over after completion-order pairing), ``"unrecorded"`` and
    ``"unlogged"`` (multiset matching: a logged episode no recorded one
    matches, a recorded episode no logged one matches). ``episode`` is the
    env-side ledger's episode number, ``index`` the position in the log (from
    0) where known; ``logged`` and ``recorded`` are (return, length);
    ``fields`` lists what differs ("return", "length") for an ``"episode"``.
    """

    def __init__(self, env, what, episode=None, index=None, logged=None, recorded=None, tolerance=None,
                 n_logged=None, n_recorded=None, n_differ=None, fields=()):
        self.env, self.what, self.episode, self.index = env, what, episode, index
        self.fields = list(fields)
        self.logged, self.recorded, self.tolerance = logged, recorded, tolerance
        self.n_logged, self.n_recorded, self.n_differ = n_logged, n_recorded, n_differ

    def line(self):
        return wording.episode_difference(self.what, self.env, self.episode, self.index, self.logged, self.recorded,
                                          self.fields, self.n_logged, self.n_recorded, self.n_differ)

    def to_dict(self):
        d = {"env": self.env, "type": self.what}
        if self.what == "episode":
            d["fields"] = self.fields
        for key in ("episode", "index", "n_logged", "n_recorded", "n_differ", "tolerance"):
            value = getattr(self, key)
            if value is not None:
                d[key] = value
        for key in ("logged", "recorded"):
            value = getattr(self, key)
            if value is not None:
                d[key] = {"return": None if np.isnan(value[0]) else float(value[0]), "length": int(value[1])}
        d["line"] = self.line()
        return d


class EpisodeReport:
    """The result of an episode check. Truthy when the log agrees with the env's record.

    ``differences`` holds EpisodeDifference lines; ``mode`` is how the log's
    episodes were paired with the recorded ones (``"env"``, ``"order"`` or
    ``"multiset"``); ``str(report)`` is the text report.
    """

    def __init__(self, mode, envs, differences, n_compared, n_differ, recorded, log, rtol, atol, order_note=None):
        self.mode, self.envs, self.differences = mode, envs, differences
        self.n_compared, self.n_differ = n_compared, n_differ
        self.n_recorded, self.n_logged = len(recorded), len(log)
        self.unfinished = dict(recorded.unfinished)
        self.cut = {e: np.asarray(v, dtype=np.int64) for e, v in recorded.cut.items()}
        self.stray_steps = {e: n for e, n in recorded.stray_steps.items() if n}
        self.partial = recorded.partial
        self.log_source, self.log_kind = log.source, log.kind
        self.rtol, self.atol = rtol, atol
        self.order_note = order_note

    @property
    def ok(self):
        return not self.differences

    def __bool__(self):
        return self.ok

    def envs_differ(self):
        return sorted({d.env for d in self.differences if d.env is not None})

    def lines(self):
        out = [d.line() for d in self.differences]
        if self.mode == "multiset":
            n_unlogged = sum(d.n_differ or 1 for d in self.differences if d.what == "unlogged")
            n_unrec = sum(d.n_differ or 1 for d in self.differences if d.what == "unrecorded")
            out.append(wording.episodes_unmatched(n_unlogged, self.n_recorded, n_unrec, self.n_logged))
        else:
            out.append(wording.episodes_differ(len(self.envs_differ()), len(self.envs), self.n_differ,
                                               self.n_compared))
        if self.mode in wording.EPISODE_MODE_NOTES:
            out.append(self.order_note or wording.EPISODE_MODE_NOTES[self.mode])
        running = [n for _, n in self.unfinished.values()]
        if running:
            out.append(wording.unfinished_episodes(running))
        n_cut = sum(len(v) for v in self.cut.values())
        if n_cut:
            out.append(wording.cut_episodes(n_cut))
        if self.stray_steps:
            out.append(wording.stray_steps(sum(self.stray_steps.values())))
        if self.partial:
            out.append(wording.PARTIAL_EPISODES)
        return out

    def __str__(self):
        return "\n".join(self.lines())

    def __repr__(self):
        return "<EpisodeReport ok=%s mode=%s: %d differences, %d episodes compared>" % (
            self.ok, self.mode, len(self.differences), self.n_compared)

    def to_dict(self):
        return {
            "ok": self.ok, "mode": self.mode, "envs": list(self.envs), "envs_differ": self.envs_differ(),
            "episodes_compared": self.n_compared, "episodes_differ": self.n_differ,
            "episodes_recorded": self.n_recorded, "episodes_logged": self.n_logged,
            "differences": [d.to_dict() for d in self.differences],
            "unfinished": [{"env": e, "episode": ep, "steps": n} for e, (ep, n) in sorted(self.unfinished.items())],
            "cut": {str(e): np.asarray(v).tolist() for e, v in sorted(self.cut.items())},
            "stray_steps": {str(e): n for e, n in sorted(self.stray_steps.items())},
            "partial": self.partial, "log": {"source": self.log_source, "kind": self.log_kind},
            "tolerance": {"rtol": self.rtol, "atol": self.atol},
            "lines": self.lines(),
        }

    def to_json(self):
        return _jsonout.dumps(self.to_dict())


# ---------------------------------------------------------------- matching

def _close(lr, rec, rtol, atol):
    """Elementwise: is logged return lr within tolerance of the recorded columns ``rec``?"""
    tol = rtol * rec["abs_sum"] + atol
    with np.errstate(invalid="ignore"):
        return (np.abs(lr - rec["ret"]) <= tol) | (np.abs(lr - np.asarray(rec["ret32"], dtype=np.float64)) <= tol)


def _agree(lr, ll, rec, rtol, atol):
    """Elementwise: does logged (lr, ll) match recorded columns ``rec``?"""
    return (ll == rec["length"]) & _close(lr, rec, rtol, atol)


def _episode_diff(env, rec, j, lr, ll, rtol, atol, index, n_logged, n_recorded, n_bad):
    one = _take(rec, slice(j, j + 1))
    fields = [] if bool(_close(np.float64(lr), one, rtol, atol)[0]) else ["return"]
    if int(ll) != int(rec["length"][j]):
        fields.append("length")
    return EpisodeDifference(env, "episode", int(rec["episode"][j]), index, (float(lr), int(ll)),
                             (float(rec["ret"][j]), int(rec["length"][j])), _tolerance(rec, j, rtol, atol),
                             n_logged, n_recorded, n_bad, fields)


def _tolerance(rec, j, rtol, atol):
    return float(rtol * rec["abs_sum"][j] + atol)


def _take(cols, idx):
    return {k: v[idx] for k, v in cols.items()}


def _first_bad(env, rec, lr, ll, rtol, atol, n_logged, n_recorded):
    """The first difference among pairs (rec[k], log[k]) of one env, its position k, and how many pairs differ."""
    bad = np.flatnonzero(~_agree(lr, ll, rec, rtol, atol))
    if not bad.size:
        return None, None, 0
    j = int(bad[0])
    d = _episode_diff(env, rec, j, lr[j], ll[j], rtol, atol, None, n_logged, n_recorded, int(bad.size))
    return d, j, int(bad.size)


def _by_env(recorded, log, rtol, atol):
    envs = sorted(set(recorded.envs) | set(int(e) for e in np.unique(log.env)))
    diffs, n_compared, n_differ = [], 0, 0
    for e in envs:
        sel = np.flatnonzero(log.env == e)
        if e not in recorded.envs:
            diffs.append(EpisodeDifference(e, "log_only", n_logged=int(sel.size), n_recorded=0))
            continue
        rec = recorded.of_env(e)
        n_rec, n_log = len(rec["env"]), int(sel.size)
        k = min(n_rec, n_log)
        d, j, bad = _first_bad(e, _take(rec, slice(0, k)), log.r[sel[:k]], log.l[sel[:k]], rtol, atol, n_log,
                               n_rec)
        n_compared += k
        n_differ += bad
        if d is not None:
            d.index = int(sel[j])
            diffs.append(d)
        elif n_rec != n_log:
            ep = int(rec["episode"][k]) if n_rec > k else None
            diffs.append(EpisodeDifference(e, "count", ep, n_logged=n_log, n_recorded=n_rec))
    return envs, diffs, n_compared, n_differ


def _in_order(recorded, log, rtol, atol):
    cols = recorded.columns
    order = np.lexsort((cols["env"], cols["end_step"]))
    rec = _take(cols, order)
    k = min(len(order), len(log))
    envs = list(recorded.envs)
    ok = _agree(log.r[:k], log.l[:k], _take(rec, slice(0, k)), rtol, atol)
    diffs, n_differ = [], int(np.count_nonzero(~ok))
    for e in envs:
        mine = np.flatnonzero(rec["env"] == e)
        paired = mine[mine < k]
        n_rec = int(mine.size)
        n_log = int(paired.size)
        bad = paired[~ok[paired]]
        if bad.size:
            j = int(bad[0])
            diffs.append(_episode_diff(e, rec, j, log.r[j], log.l[j], rtol, atol, j, n_log, n_rec, int(bad.size)))
        elif n_rec != n_log:
            diffs.append(EpisodeDifference(e, "count", int(rec["episode"][mine[n_log]]), n_logged=n_log,
                                           n_recorded=n_rec))
    if len(log) > k:
        diffs.append(EpisodeDifference(None, "extra", index=k, logged=(float(log.r[k]), int(log.l[k])),
                                       n_logged=len(log) - k))
    return envs, diffs, k, n_differ


def _multiset(recorded, log, rtol, atol):
    """Match logged (return, length) to recorded episodes: same length, return within tolerance.

    Per length, each recorded episode is an interval of returns it accepts;
    taking intervals by their upper end and giving each the smallest free
    logged return inside it matches as many as any matching can.
    """
    cols = recorded.columns
    n_rec = len(cols["env"])
    tol = rtol * cols["abs_sum"] + atol
    lo = np.fmin(cols["ret"], cols["ret32"].astype(np.float64)) - tol
    hi = np.fmax(cols["ret"], cols["ret32"].astype(np.float64)) + tol
    rec_matched = np.zeros(n_rec, dtype=bool)
    log_matched = np.zeros(len(log), dtype=bool)
    for length in np.union1d(np.unique(cols["length"]), np.unique(log.l)):
        ri = np.flatnonzero(cols["length"] == length)
        li = np.flatnonzero(log.l == length)
        if not ri.size or not li.size:
            continue
        li = li[np.argsort(log.r[li], kind="stable")]
        vals = log.r[li]
        nxt = list(range(li.size + 1))  # the next free logged return at or after each position
        for j in ri[np.argsort(hi[ri], kind="stable")]:
            p = q = int(np.searchsorted(vals, lo[j], side="left"))
            while nxt[p] != p:
                p = nxt[p]
            while nxt[q] != p:  # path compression
                nxt[q], q = p, nxt[q]
            if p < li.size and vals[p] <= hi[j]:
                nxt[p] = p + 1
                rec_matched[j] = True
                log_matched[li[p]] = True
    diffs = []
    order = np.lexsort((cols["env"], cols["end_step"]))
    for e in recorded.envs:
        un = [j for j in order if cols["env"][j] == e and not rec_matched[j]]
        if un:
            j = un[0]
            diffs.append(EpisodeDifference(e, "unlogged", int(cols["episode"][j]),
                                           recorded=(float(cols["ret"][j]), int(cols["length"][j])),
                                           tolerance=float(tol[j]), n_differ=len(un)))
    unl = np.flatnonzero(~log_matched)
    if unl.size:
        j = int(unl[0])
        diffs.append(EpisodeDifference(None, "unrecorded", index=j, logged=(float(log.r[j]), int(log.l[j])),
                                       n_differ=int(unl.size)))
    n_compared = int(np.count_nonzero(rec_matched))
    return list(recorded.envs), diffs, n_compared, int(np.count_nonzero(~rec_matched)) + int(unl.size)


def check_episodes(env_dir, log, *, env=None, match="auto", rtol=RTOL, atol=ATOL, progress=None):
    """Check a trainer's episode log against the episodes the env-side ledgers recorded.

    ``log`` is a path (``monitor.csv``, a directory of ``N.monitor.csv``,
    EpisodeLogTap's ``.npz``, a CSV with env, r, l), an EpisodeLog, a dict
    with arrays ``r``, ``l`` and optionally ``env``, or rows of (env, return,
    length). ``env`` says which env a log without env indices belongs to.
    ``match``: ``"auto"`` pairs per env in order when the log knows each
    episode's env, else in completion order when it can be derived from the
    ledgers (every env's stream has the same number of steps, as with SB3's
    VecEnvs and Gymnasium's SAME_STEP), else as a multiset; or force
    ``"env"``, ``"order"`` or ``"multiset"``.

    ``progress(done, total)``, if given, is called as the envs' ledgers are read.

    Returns an EpisodeReport, truthy when the log agrees. Raises LedgerError
    when it cannot check (a missing or unreadable ledger or log, a
    trainer-side ledger given as ``env_dir``).
    """
    if match not in MATCH_MODES:
        raise ValueError("match must be one of %s, got %r" % (", ".join(MATCH_MODES), match))
    if not (rtol >= 0 and atol >= 0):
        raise ValueError("rtol and atol must be non-negative")
    recorded = recorded_episodes(env_dir, progress=progress)
    log = _as_log(log, env)
    if log.covers is not None:  # a log of some envs only: check those
        recorded = recorded.restrict(log.covers)
    steps = set(recorded.total_steps.values())
    derivable = len(steps) <= 1
    note = None
    if match == "auto":
        mode = "env" if log.env is not None else ("order" if derivable else "multiset")
        if mode == "multiset":
            note = wording.MULTISET_BY_DEFAULT
    else:
        mode = match
    if mode == "env":
        if log.env is None:
            raise LedgerError("%s: the log has no env index; pass env=N (--env N) or match it in order or as a "
                              "multiset" % log.source)
        envs, diffs, n_compared, n_differ = _by_env(recorded, log, rtol, atol)
    elif mode == "order":
        envs, diffs, n_compared, n_differ = _in_order(recorded, log, rtol, atol)
        if not derivable:
            note = wording.ORDER_GUESSED
    else:
        envs, diffs, n_compared, n_differ = _multiset(recorded, log, rtol, atol)
    return EpisodeReport(mode, envs, diffs, n_compared, n_differ, recorded, log, rtol, atol, note)
