"""Episodes from the env-side ledger: each env's completed episodes, their lengths and returns.

An episode is a reset event and the step events after it, up to and including
the first step with terminated or truncated (see ``stepledger.episodes``).
Ledgers are read chunk by chunk; one summary row per completed episode is kept.
"""

import numpy as np

from .. import _schema as S
from .. import core
from ..errors import LedgerError
from ..ledgerfile import CHUNK
from ..read import read

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
