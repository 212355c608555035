"""Pairing the trainer's logged episodes with the recorded ones, and the report of what differs.

Per env in order when the log knows each episode's env, in completion order
when that order can be derived from the ledgers, else as a multiset of
(return, length); see ``check_episodes``. The report's lines are worded in
``stepledger.wording``.
"""

from __future__ import annotations

import array
from typing import Any, Callable, Iterator, Union

import numpy as np

from stepledger import wording
from stepledger.report.base import DifferenceReport
from stepledger.errors import LedgerError
from stepledger.report.episodes.derive import (Earliest, FirstPerEnv, RecordedEpisodes, Thinning, derive, merge,
                                               open_env_ledger, thin)
from stepledger.report.episodes.logs import EpisodeLog, as_log
from stepledger.report.read import LedgerPath

#: an episode as a report shows it: (return, length)
Episode = tuple[float, int]
#: recorded episodes' columns (``RecordedEpisodes.columns``: env, episode, length, ret, ret32, abs_sum, end_step)
EpisodeColumns = dict[str, np.ndarray]
#: what ``check_episodes`` takes as the trainer's log (see its docstring)
LogSpec = Union[LedgerPath, EpisodeLog, dict[str, Any], list[Any], tuple[Any, ...]]

RTOL = 1e-5
ATOL = 1e-5  # once per episode
MATCH_MODES = ("auto", "env", "order", "multiset")


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

    def __init__(self, env: int | None, what: str, episode: int | None = None, index: int | None = None,
                 logged: Episode | None = None, recorded: Episode | None = None, tolerance: float | None = None,
                 n_logged: int | None = None, n_recorded: int | None = None, n_differ: int | None = None,
                 fields: list[str] | tuple[str, ...] = ()) -> None:
        self.env, self.what, self.episode, self.index = env, what, episode, index
        self.fields = list(fields)
        self.logged, self.recorded, self.tolerance = logged, recorded, tolerance
        self.n_logged, self.n_recorded, self.n_differ = n_logged, n_recorded, n_differ

    def line(self) -> str:
        """The report's line for this difference."""
        return wording.episode_difference(self.what, self.env, self.episode, self.index, self.logged, self.recorded,
                                          self.fields, self.n_logged, self.n_recorded, self.n_differ)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"env": self.env, "type": self.what}
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


class EpisodeReport(DifferenceReport):
    """The result of an episode check. Truthy when the log agrees with the env's record.

    ``differences`` holds EpisodeDifference lines; ``mode`` is how the log's
    episodes were paired with the recorded ones (``"env"``, ``"order"`` or
    ``"multiset"``); ``str(report)`` is the text report.
    """

    differences: list[EpisodeDifference]

    def __init__(self, mode: str, envs: list[int], differences: list[EpisodeDifference], n_compared: int,
                 n_differ: int, recorded: RecordedEpisodes, log: EpisodeLog, rtol: float, atol: float,
                 order_note: str | None = None) -> None:
        self.mode, self.envs, self.differences = mode, envs, differences
        self.n_compared, self.n_differ = n_compared, n_differ
        self.n_recorded, self.n_logged = len(recorded), len(log)
        self.unfinished = dict(recorded.unfinished)
        self.cut = {e: np.asarray(v, dtype=np.int64) for e, v in recorded.cut.items()}
        self.cut_counts = dict(recorded.cut_counts)
        self.stray_steps = {e: n for e, n in recorded.stray_steps.items() if n}
        self.partial = recorded.partial
        self.log_source, self.log_kind = log.source, log.kind
        self.rtol, self.atol = rtol, atol
        self.order_note = order_note

    def envs_differ(self) -> list[int]:
        """The envs with a difference, in order."""
        return sorted({d.env for d in self.differences if d.env is not None})

    def lines(self) -> list[str]:
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
        n_cut = sum(self.cut_counts.values())
        if n_cut:
            out.append(wording.cut_episodes(n_cut))
        if self.stray_steps:
            out.append(wording.stray_steps(sum(self.stray_steps.values())))
        if self.partial:
            out.append(wording.PARTIAL_EPISODES)
        return out

    def __repr__(self) -> str:
        return "<EpisodeReport ok=%s mode=%s: %d differences, %d episodes compared>" % (
            self.ok, self.mode, len(self.differences), self.n_compared)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "mode": self.mode, "envs": list(self.envs), "envs_differ": self.envs_differ(),
            "episodes_compared": self.n_compared, "episodes_differ": self.n_differ,
            "episodes_recorded": self.n_recorded, "episodes_logged": self.n_logged,
            "differences": [d.to_dict() for d in self.differences],
            "unfinished": [{"env": e, "episode": ep, "steps": n} for e, (ep, n) in sorted(self.unfinished.items())],
            "cut": {str(e): np.asarray(v).tolist() for e, v in sorted(self.cut.items())},
            "cut_count": {str(e): n for e, n in sorted(self.cut_counts.items())},
            "stray_steps": {str(e): n for e, n in sorted(self.stray_steps.items())},
            "partial": self.partial, "log": {"source": self.log_source, "kind": self.log_kind},
            "tolerance": {"rtol": self.rtol, "atol": self.atol},
            "lines": self.lines(),
        }



# ---------------------------------------------------------------- matching

def _close(lr: Any, rec: EpisodeColumns, rtol: float, atol: float) -> np.ndarray:
    """Elementwise: is logged return lr within tolerance of the recorded columns ``rec``?"""
    tol = rtol * rec["abs_sum"] + atol
    with np.errstate(invalid="ignore"):
        return (np.abs(lr - rec["ret"]) <= tol) | (np.abs(lr - np.asarray(rec["ret32"], dtype=np.float64)) <= tol)


def _agree(lr: Any, ll: Any, rec: EpisodeColumns, rtol: float, atol: float) -> np.ndarray:
    """Elementwise: does logged (lr, ll) match recorded columns ``rec``?"""
    return (ll == rec["length"]) & _close(lr, rec, rtol, atol)


def _episode_diff(env: int, rec: EpisodeColumns, j: int, lr: Any, ll: Any, rtol: float, atol: float,
                  index: int | None, n_logged: int, n_recorded: int, n_bad: int) -> EpisodeDifference:
    one = _take(rec, slice(j, j + 1))
    fields = [] if bool(_close(np.float64(lr), one, rtol, atol)[0]) else ["return"]
    if int(ll) != int(rec["length"][j]):
        fields.append("length")
    return EpisodeDifference(env, "episode", int(rec["episode"][j]), index, (float(lr), int(ll)),
                             (float(rec["ret"][j]), int(rec["length"][j])), _tolerance(rec, j, rtol, atol),
                             n_logged, n_recorded, n_bad, fields)


def _tolerance(rec: EpisodeColumns, j: int, rtol: float, atol: float) -> float:
    return float(rtol * rec["abs_sum"][j] + atol)


def _take(cols: EpisodeColumns, idx: Any) -> EpisodeColumns:
    return {k: v[idx] for k, v in cols.items()}


def _first_bad(env: int, rec: EpisodeColumns, lr: np.ndarray, ll: np.ndarray, rtol: float, atol: float,
               n_logged: int, n_recorded: int) -> tuple[EpisodeDifference | None, int | None, int]:
    """The first difference among pairs (rec[k], log[k]) of one env, its position k, and how many pairs differ."""
    bad = np.flatnonzero(~_agree(lr, ll, rec, rtol, atol))
    if not bad.size:
        return None, None, 0
    j = int(bad[0])
    d = _episode_diff(env, rec, j, lr[j], ll[j], rtol, atol, None, n_logged, n_recorded, int(bad.size))
    return d, j, int(bad.size)


#: what each way of pairing gives the report: (envs, differences, episodes compared, episodes that differ)
_Paired = tuple[list[int], list[EpisodeDifference], int, int]


def _by_env(recorded: RecordedEpisodes, log: EpisodeLog, rtol: float, atol: float) -> _Paired:
    assert log.env is not None  # pairing per env: check_episodes chose it for a log with env indices
    envs = sorted(set(recorded.envs) | set(int(e) for e in np.unique(log.env)))

    diffs: list[EpisodeDifference] = []
    n_compared, n_differ = 0, 0
    for e in envs:
        sel = np.flatnonzero(log.env == e)
        if e not in recorded.envs:
            diffs.append(EpisodeDifference(e, "log_only", n_logged=int(sel.size), n_recorded=0))
            continue
        rec = recorded.of_env(e)  # its first n_log + 1 episodes at least
        n_rec, n_log = recorded.counts.get(e, 0), int(sel.size)
        k = min(n_rec, n_log)
        d, j, bad = _first_bad(e, _take(rec, slice(0, k)), log.r[sel[:k]], log.l[sel[:k]], rtol, atol, n_log,
                               n_rec)
        n_compared += k
        n_differ += bad
        if d is not None and j is not None:
            d.index = int(sel[j])
            diffs.append(d)
        elif n_rec != n_log:
            ep = int(rec["episode"][k]) if n_rec > k else None
            diffs.append(EpisodeDifference(e, "count", ep, n_logged=n_log, n_recorded=n_rec))
    return envs, diffs, n_compared, n_differ


def _in_order(recorded: RecordedEpisodes, log: EpisodeLog, rtol: float, atol: float) -> _Paired:
    cols = recorded.columns
    order = np.lexsort((cols["env"], cols["end_step"]))
    rec = _take(cols, order)
    k = min(len(recorded), len(log))  # the recorded episodes kept: the k that ended first at least
    envs = list(recorded.envs)
    ok = _agree(log.r[:k], log.l[:k], _take(rec, slice(0, k)), rtol, atol)
    diffs: list[EpisodeDifference] = []
    n_differ = int(np.count_nonzero(~ok))
    for e in envs:
        mine = np.flatnonzero(rec["env"] == e)
        paired = mine[mine < k]
        n_rec = recorded.counts.get(e, 0)
        n_log = int(paired.size)
        bad = paired[~ok[paired]]
        if bad.size:
            j = int(bad[0])
            diffs.append(_episode_diff(e, rec, j, log.r[j], log.l[j], rtol, atol, j, n_log, n_rec, int(bad.size)))
        elif n_rec != n_log:
            first = int(rec["episode"][mine[n_log]]) if mine.size > n_log else recorded.beyond[e]
            diffs.append(EpisodeDifference(e, "count", first, n_logged=n_log, n_recorded=n_rec))
    if len(log) > k:
        diffs.append(EpisodeDifference(None, "extra", index=k, logged=(float(log.r[k]), int(log.l[k])),
                                       n_logged=len(log) - k))
    return envs, diffs, k, n_differ


def _intervals(cols: EpisodeColumns, rtol: float, atol: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each recorded episode's tolerance and the interval of logged returns it accepts: (tol, lo, hi)."""
    tol = rtol * cols["abs_sum"] + atol
    ret32 = cols["ret32"].astype(np.float64)
    return tol, np.fmin(cols["ret"], ret32) - tol, np.fmax(cols["ret"], ret32) + tol


def _max_matching(cols: EpisodeColumns, log: EpisodeLog, rtol: float, atol: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A maximum matching of recorded episodes ``cols`` to logged ones: same length, return within
    tolerance. Returns (recorded matched, logged matched, tol), boolean masks and the tolerances.

    Per length, with the logged returns sorted, each recorded episode accepts a
    range [first, last) of them. Taking ranges by their end and giving each
    the smallest free logged return inside it matches as many as any matching
    can. Episodes with the same range are interchangeable, so they are taken
    as one group (the first ones in ledger order are matched): the loop runs
    once per group and once per match, not once per recorded episode.
    """
    n_rec = len(cols["env"])
    tol, lo, hi = _intervals(cols, rtol, atol)
    rec_matched = np.zeros(n_rec, dtype=bool)
    log_matched = np.zeros(len(log), dtype=bool)
    for length in np.intersect1d(cols["length"], log.l):
        ri = np.flatnonzero(cols["length"] == length)
        li = np.flatnonzero(log.l == length)
        li = li[np.argsort(log.r[li], kind="stable")]
        vals = log.r[li]
        first = np.searchsorted(vals, lo[ri], side="left")
        last = np.searchsorted(vals, hi[ri], side="right")  # NaN bounds give an empty range
        holds = first < last
        if not holds.any():
            continue
        ri, first, last = ri[holds], first[holds], last[holds]
        order = np.lexsort((ri, first, last))
        ri, first, last = ri[order], first[order], last[order]
        starts = np.flatnonzero(np.r_[True, (first[1:] != first[:-1]) | (last[1:] != last[:-1])])
        stops = np.r_[starts[1:], ri.size]
        nxt = array.array("q", range(li.size + 1))  # the next free logged return at or after each position
        for a, b in _groups(starts, stops):
            begin, end = int(first[a]), int(last[a])
            while a < b:
                p = q = begin
                while nxt[p] != p:
                    p = nxt[p]
                while nxt[q] != p:  # path compression
                    nxt[q], q = p, nxt[q]
                if p >= end:
                    break
                nxt[p] = p + 1
                rec_matched[ri[a]] = True
                log_matched[li[p]] = True
                a += 1
    return rec_matched, log_matched, tol


def _groups(starts: np.ndarray, stops: np.ndarray, block: int = 1 << 16) -> Iterator[tuple[int, int]]:
    """(start, stop) pairs as Python ints, a block at a time (a list of a million ints is 36 MB)."""
    for i in range(0, starts.size, block):
        yield from zip(starts[i:i + block].tolist(), stops[i:i + block].tolist())


class Matchable(Thinning):
    """Keeps the recorded episodes a multiset matching with ``log`` may still pair, as they come.

    When the rows held pass ``room(len(log), slack)``, a maximum matching of them
    is made and the rows it leaves unmatched are dropped, counted per env
    (``dropped``: env -> [count, (end_step, episode, ret, length, tol) of its
    first]). Matchings of a bipartite graph form a matroid: the episodes a
    maximum matching leaves out are never needed for a maximum matching of
    those held together with any that come later, so the final matching is as
    large as one over every recorded episode, and at most ``len(log)`` rows
    stay held after each drop.
    """

    def __init__(self, log: EpisodeLog, rtol: float, atol: float, slack: int = 1 << 16) -> None:
        super().__init__(len(log), slack)
        self.log, self.rtol, self.atol = log, rtol, atol
        # env -> [count, (end_step, episode, ret, length, tol) of its first]
        self.dropped: dict[int, list[Any]] = {}

    def _trim(self) -> None:
        cols = merge(self.parts)
        matched, _, tol = _max_matching(cols, self.log, self.rtol, self.atol)
        self.drop(cols, ~matched, tol)
        del cols, tol
        thin(self.parts, matched)
        self.held = int(np.count_nonzero(matched))

    def drop(self, cols: EpisodeColumns, sel: np.ndarray, tol: np.ndarray) -> None:
        """Count the rows ``sel`` of ``cols`` as unmatched, and remember each env's first."""
        envs = cols["env"][sel]
        for env in np.unique(envs):
            mine = np.flatnonzero(sel & (cols["env"] == env))
            j = int(mine[np.argmin(cols["end_step"][mine])])
            first = (int(cols["end_step"][j]), int(cols["episode"][j]), float(cols["ret"][j]),
                     int(cols["length"][j]), float(tol[j]))
            entry = self.dropped.setdefault(int(env), [0, first])
            entry[0] += int(mine.size)
            entry[1] = min(entry[1], first)


def _multiset(recorded: RecordedEpisodes, log: EpisodeLog, rtol: float, atol: float,
              dropped: dict[int, list[Any]] | None = None) -> _Paired:
    """Match logged (return, length) to recorded episodes as a multiset (see _max_matching).

    ``dropped`` (Matchable.dropped) counts the recorded episodes left out as
    unmatched while the ledgers were read.
    """
    cols = recorded.columns
    rec_matched, log_matched, tol = _max_matching(cols, log, rtol, atol)
    unmatched = Matchable(log, rtol, atol)
    unmatched.dropped = {e: list(v) for e, v in (dropped or {}).items()}
    unmatched.drop(cols, ~rec_matched, tol)
    diffs: list[EpisodeDifference] = []
    for e in recorded.envs:
        if e in unmatched.dropped:
            n, (_, episode, ret, length, tolerance) = unmatched.dropped[e]
            diffs.append(EpisodeDifference(e, "unlogged", episode, recorded=(ret, length), tolerance=tolerance,
                                           n_differ=n))
    unl = np.flatnonzero(~log_matched)
    if unl.size:
        j = int(unl[0])
        diffs.append(EpisodeDifference(None, "unrecorded", index=j, logged=(float(log.r[j]), int(log.l[j])),
                                       n_differ=int(unl.size)))
    n_unlogged = sum(v[0] for v in unmatched.dropped.values())
    n_compared = int(np.count_nonzero(rec_matched))
    return list(recorded.envs), diffs, n_compared, n_unlogged + int(unl.size)


def check_episodes(env_dir: LedgerPath, log: LogSpec, *, env: int | None = None, match: str = "auto",
                   rtol: float = RTOL, atol: float = ATOL,
                   progress: Callable[[int, int], Any] | None = None) -> EpisodeReport:
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
    ledger = open_env_ledger(env_dir)
    try:
        episodes = as_log(log, env)
        # Only what the log can be paired with is kept: memory bounded by the log, not by the ledgers.
        covers = None if episodes.covers is None else set(episodes.covers)  # a log of some envs only: check those
        mode = match if match != "auto" else ("env" if episodes.env is not None else "order")
        keeper: FirstPerEnv | Earliest | Matchable
        if mode == "env":
            if episodes.env is None:
                raise LedgerError("%s: the log has no env index; pass env=N (--env N) or match it in order or as "
                                  "a multiset" % episodes.source)
            found, n = np.unique(episodes.env, return_counts=True)
            keeper = FirstPerEnv({int(e): int(c) for e, c in zip(found, n)})
        else:
            keeper = Earliest(len(episodes)) if mode == "order" else Matchable(episodes, rtol, atol)
        recorded = derive(ledger, keeper, covers, progress=progress)
        derivable = len(set(recorded.total_steps.values())) <= 1
        note = None
        if match == "auto" and mode == "order" and not derivable:
            mode, note = "multiset", wording.MULTISET_BY_DEFAULT
            keeper = Matchable(episodes, rtol, atol)
            recorded = derive(ledger, keeper, covers, progress=progress)
    finally:
        ledger.close()
    if mode == "env":
        envs, diffs, n_compared, n_differ = _by_env(recorded, episodes, rtol, atol)
    elif mode == "order":
        envs, diffs, n_compared, n_differ = _in_order(recorded, episodes, rtol, atol)
        if not derivable:
            note = wording.ORDER_GUESSED
    else:
        assert isinstance(keeper, Matchable)  # the multiset's keeper
        envs, diffs, n_compared, n_differ = _multiset(recorded, episodes, rtol, atol, keeper.dropped)
    return EpisodeReport(mode, envs, diffs, n_compared, n_differ, recorded, episodes, rtol, atol, note)

