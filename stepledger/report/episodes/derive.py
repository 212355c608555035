"""Episodes from the env-side ledger: each env's completed episodes, their lengths and returns.

An episode is a reset event and the step events after it, up to and including
the first step with terminated or truncated (see ``stepledger.episodes``).
Ledgers are read chunk by chunk. ``recorded_episodes`` keeps one summary row
per completed episode; the episode check keeps only the rows a log can be
paired with (``FirstPerEnv``, ``Earliest``), so that its memory is bounded by
the log's length (which the log readers bound), not by the ledger's.
"""

from __future__ import annotations

from typing import Any, Callable, Collection

import numpy as np

from stepledger.format import schema as S
from stepledger import core
from stepledger.errors import LedgerError
from stepledger.format.ledgerfile import CHUNK
from stepledger.report.read import Ledger, LedgerPath, Stream, read

#: episodes' rows as columns (COLUMNS' names)
Rows = dict[str, np.ndarray]

_SHORT_RUN = 64  # episodes up to this long get their float32 sums in lockstep
CUT_LISTED = 1000  # cut-off episodes listed by number, per env (all are counted)


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
    episode numbers ended by a reset before terminated or truncated, an int64 array
    of each env's first CUT_LISTED; ``cut_counts``, env -> how many in all),
    ``stray_steps`` (env -> steps outside any episode), ``total_steps`` (env ->
    step events) and ``envs`` (every stream's env index).

    ``counts`` (env -> completed episodes) counts every completed episode,
    kept or not; ``beyond`` (env -> episode number) names each env's first
    completed episode that was not kept, where some were not (the episode
    check keeps only what a log can be paired with). ``len()`` is the number
    of completed episodes.
    """

    def __init__(self, columns: Rows, unfinished: dict[int, tuple[int, int]], cut: dict[int, np.ndarray],
                 stray_steps: dict[int, int], total_steps: dict[int, int], envs: list[int], partial: bool,
                 counts: dict[int, int] | None = None, beyond: dict[int, int] | None = None,
                 cut_counts: dict[int, int] | None = None) -> None:
        self.columns = columns
        self.unfinished, self.cut, self.stray_steps = unfinished, cut, stray_steps
        self.cut_counts = {e: len(v) for e, v in cut.items()} if cut_counts is None else dict(cut_counts)
        self.total_steps, self.envs, self.partial = total_steps, envs, partial
        if counts is None:
            found, n = np.unique(columns["env"], return_counts=True)
            counts = {int(e): int(c) for e, c in zip(found, n)}
        self.counts = counts
        self.beyond = dict(beyond or {})

    def __len__(self) -> int:
        return sum(self.counts.values())

    def of_env(self, env: int) -> Rows:
        sel = self.columns["env"] == env
        return {k: v[sel] for k, v in self.columns.items()}


COLUMNS = (("env", np.int64), ("episode", np.int64), ("length", np.int64), ("ret", np.float64),
           ("ret32", np.float32), ("abs_sum", np.float64), ("end_step", np.int64))


class KeepAll:
    """Keeps every completed episode's row."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {k: [] for k, _ in COLUMNS}
        self.beyond: dict[int, int] = {}

    def add(self, rows: Rows) -> None:
        for k, _ in COLUMNS:
            self.parts[k].append(rows[k])

    def columns(self) -> Rows:
        return merge(self.parts)


class FirstPerEnv(KeepAll):
    """Keeps each env's first ``limits[env]`` completed episodes and one more (the first one a log
    pairing per env leaves over): what a log with env indices is compared with."""

    def __init__(self, limits: dict[int, int]) -> None:
        super().__init__()
        self.room = {e: int(n) + 1 for e, n in limits.items()}

    def add(self, rows: Rows) -> None:
        if not rows["env"].size:
            return
        env = int(rows["env"][0])
        room = self.room.get(env, 1)
        if room < rows["env"].size and env not in self.beyond:
            self.beyond[env] = int(rows["episode"][room])
        self.room[env] = max(0, room - int(rows["env"].size))
        if room:
            super().add({k: v[:room] for k, v in rows.items()})


def room(k: int, slack: int) -> int:
    """Rows a keeper that needs ``k`` of them holds before it drops some: a quarter as many again, and
    ``slack`` (each drop sorts what is held: the more often, the less memory and the more time)."""
    return k + k // 4 + slack


def merge(parts: dict[str, list[np.ndarray]]) -> Rows:
    """The rows of ``parts`` as columns, each column's pieces joined in place one column at a time (so that
    the rows are held once, and one column twice, not all of them twice)."""
    for name, dt in COLUMNS:
        if len(parts[name]) != 1:
            parts[name] = [np.concatenate(parts[name]) if parts[name] else np.empty(0, dt)]
    return {name: parts[name][0] for name, _ in COLUMNS}


def thin(parts: dict[str, list[np.ndarray]], keep: np.ndarray) -> None:
    """Keep rows ``keep`` (a mask or ascending indices over the rows of ``parts``) of each column, one
    column at a time, so that no more than one column is copied at once."""
    for name in list(parts):
        col = np.concatenate(parts[name]) if len(parts[name]) != 1 else parts[name][0]
        parts[name] = [col[keep]]


class Thinning(KeepAll):
    """Keeps rows as they come, and whenever more than ``room(k, slack)`` are held, drops (``_trim``) those
    it no longer needs."""

    def __init__(self, k: int, slack: int = 1 << 16) -> None:
        super().__init__()
        self.k, self.slack, self.held = int(k), int(slack), 0

    def add(self, rows: Rows) -> None:
        super().add(rows)
        self.held += int(rows["env"].size)
        if self.held > room(self.k, self.slack):
            self._trim()

    def _trim(self) -> None:
        raise NotImplementedError


class Earliest(Thinning):
    """Keeps the ``k`` completed episodes that ended first across all envs, in completion order (the
    vector step each ended at, then env index): what a log without env indices is paired with in order.
    Rows are dropped as they come, so that no more than ``room(k, slack)`` are held at once."""

    def __init__(self, k: int, slack: int = 1 << 16) -> None:
        super().__init__(k, slack)
        self._beyond_end: dict[int, int] = {}  # env -> end_step of its episode in beyond

    def _trim(self) -> None:
        env = _concat_one(self.parts, "env")
        end_step = _concat_one(self.parts, "end_step")
        order = np.lexsort((env, end_step))
        drop = order[self.k:]
        if drop.size:
            episode = _concat_one(self.parts, "episode")
            for found in np.unique(env[drop]):
                mine = drop[env[drop] == found]
                first = int(mine[np.argmin(end_step[mine])])
                e = int(found)
                # an env's episodes end in order: the earliest dropped one is its first not kept
                if e not in self.beyond or end_step[first] < self._beyond_end[e]:
                    self.beyond[e] = int(episode[first])
                    self._beyond_end[e] = int(end_step[first])
            del episode
        keep = np.sort(order[:self.k])  # back in env, episode order
        del env, end_step, order, drop
        thin(self.parts, keep)
        self.held = int(keep.size)

    def columns(self) -> Rows:
        self._trim()
        return merge(self.parts)


def _concat_one(parts: dict[str, list[np.ndarray]], name: str) -> np.ndarray:
    return np.concatenate(parts[name]) if parts[name] else np.empty(0, dict(COLUMNS)[name])


class _Carry:
    """The state of one stream between chunks."""

    def __init__(self) -> None:
        self.ep, self.active = -1, False
        self.n, self.s64, self.sabs = 0, 0.0, 0.0
        self.s32: np.float32 = np.float32(0.0)
        self.steps, self.stray = 0, 0


def _rewards(bits: Any, reward_dtype: str | None) -> tuple[np.ndarray, np.ndarray]:

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


def _running_f32(r32: np.ndarray, starts: np.ndarray, lengths: np.ndarray, init: np.ndarray) -> np.ndarray:
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


def _stream_episodes(stream: Stream, reward_dtype: str | None, keeper: KeepAll, cut: dict[int, list[Any]],
                     chunk: int = CHUNK) -> tuple[_Carry, int]:
    """Hand one stream's completed episodes to ``keeper``, a chunk at a time; return its carry and
    how many episodes were completed."""
    completed = 0
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
        keeper.add({"env": np.full(done.size, stream.index, dtype=np.int64), "episode": epno[done],
                    "length": cnt[done], "ret": s64[done], "ret32": s32[done], "abs_sum": sabs[done],
                    "end_step": end_step[done]})
        completed += int(done.size)
        # segments followed by a reset, still running when it came: cut off
        cut_here = epno[:-1][active0[:-1] & ~ended[:-1]]
        cut_here = cut_here[cut_here >= 0]
        if cut_here.size:  # the first CUT_LISTED of an env listed, every one counted: any ledger stays small
            listed, n = cut.setdefault(stream.index, [[], 0])
            have = sum(len(v) for v in listed)
            if have < CUT_LISTED:
                listed.append(cut_here[:CUT_LISTED - have])
            cut[stream.index][1] = n + int(cut_here.size)

        lastseg = nseg - 1
        c.ep = int(epno[lastseg])
        c.active = bool(active0[lastseg] and not ended[lastseg])
        if c.active:
            c.n, c.s64, c.s32, c.sabs = int(cnt[lastseg]), float(s64[lastseg]), s32[lastseg], float(sabs[lastseg])
        else:
            c.n, c.s64, c.s32, c.sabs = 0, 0.0, np.float32(0.0), 0.0
    return c, completed


_REFUSE_TRAINER = ("%s: a trainer-side ledger; the episode check reads the env-side ledgers, the directory "
                   "LedgerEnv wrote env-N.npz into")


# Events a chunk when deriving episodes: about twenty arrays of a chunk's length are alive at once, so
# 256K events keep that near 40 MB whatever the ledger holds.
EPISODE_CHUNK = 1 << 18


def open_env_ledger(env_dir: LedgerPath) -> Ledger:
    """The env-side ledgers in ``env_dir``, read (LedgerError when they are not, or are the trainer's)."""
    ledger = read(env_dir)
    try:
        if ledger.side == "trainer":
            raise LedgerError(_REFUSE_TRAINER % env_dir)
        if ledger.side != "env":
            raise LedgerError("%s: not an env-side ledger (side %r)" % (env_dir, ledger.side))
        if ledger.meta.get(S.META_REWARD_DTYPE) not in S.REWARD_DTYPES:
            raise LedgerError("%s: unknown reward dtype %r" % (env_dir, ledger.meta.get(S.META_REWARD_DTYPE)))
    except BaseException:
        ledger.close()
        raise
    return ledger


def derive(ledger: Ledger, keeper: KeepAll | None = None, envs: Collection[int] | None = None,
           chunk: int = EPISODE_CHUNK, progress: Callable[[int, int], Any] | None = None) -> RecordedEpisodes:
    """The RecordedEpisodes of an open env ledger's streams (those in ``envs`` if given); ``keeper``
    (KeepAll by default) says which rows are kept."""
    keeper = KeepAll() if keeper is None else keeper
    reward_dtype = ledger.meta.get(S.META_REWARD_DTYPE)
    streams = [(idx, st) for idx, st in ledger.streams.items() if envs is None or idx in envs]
    unfinished: dict[int, tuple[int, int]] = {}
    cut: dict[int, list[Any]] = {}  # env -> [the cut episodes listed, a list of arrays; how many in all]
    stray: dict[int, int] = {}
    total: dict[int, int] = {}
    counts: dict[int, int] = {}
    for k, (idx, stream) in enumerate(streams):
        with np.errstate(over="ignore", invalid="ignore"):  # sums of inf and NaN rewards are data too
            c, counts[idx] = _stream_episodes(stream, reward_dtype, keeper, cut, chunk)
        if c.active:
            unfinished[idx] = (c.ep, c.n)
        stray[idx], total[idx] = c.stray, c.steps
        if progress is not None:
            progress(k + 1, len(streams))
    columns = keeper.columns()
    cut_counts = {e: n for e, (_, n) in cut.items()}
    listed = {e: np.concatenate(v) for e, (v, _) in cut.items()}
    return RecordedEpisodes(columns, unfinished, listed, stray, total, sorted(idx for idx, _ in streams),
                            ledger.partial, {e: n for e, n in counts.items() if n}, keeper.beyond, cut_counts)


def recorded_episodes(env_dir: LedgerPath, chunk: int = EPISODE_CHUNK,
                      progress: Callable[[int, int], Any] | None = None) -> RecordedEpisodes:

    """Derive every env's completed episodes from the env-side ledgers in ``env_dir``.

    Returns a RecordedEpisodes. Reads ``chunk`` events at a time. Raises
    LedgerError when ``env_dir`` holds no readable env-side ledger.
    ``progress(done, total)``, if given, is called after each env.
    """
    ledger = open_env_ledger(env_dir)
    try:
        return derive(ledger, chunk=chunk, progress=progress)
    finally:
        ledger.close()
