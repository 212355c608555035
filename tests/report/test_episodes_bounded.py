"""The episode check keeps only the recorded episodes a log can be paired with, and reports exactly
what it reported when it kept them all.

The reference is the check as it was: every completed episode derived (recorded_episodes), then
paired. Ledgers are made of explicit events with episodes of varied lengths, cut episodes, steps
outside any episode and unfinished last episodes; logs are shorter than the ledgers (the case the
bounded keepers exist for), as long, or longer, with and without env indices. Small chunks and no
slack make the keepers drop rows as they go.
"""

import numpy as np
import pytest
from gymnasium import spaces as gs

from stepledger.format import schema as S
from stepledger import core
from stepledger import wording
from stepledger.episodes import EpisodeReport, check_episodes, recorded_episodes
from stepledger.episodes import derive as D
from stepledger.episodes import match as M
from stepledger.report.episodes.logs import EpisodeLog
from stepledger.recording.recording import Recording
from stepledger.format.spaces import LeafLayout

BOX = LeafLayout(gs.Box(-1, 1, (1,), np.float32))


def _streams(seed, n_envs=3):
    rng = np.random.default_rng(seed)
    streams = {}
    for e in range(n_envs):
        events = []
        if e == 1:
            events.append((S.KIND_STEP, 0.5, False, False))  # a step before the first reset
        for _ in range(int(rng.integers(20, 60))):
            events.append((S.KIND_RESET, 0.0, False, False))
            n = int(rng.integers(1, 6))
            for k in range(n):
                end = k == n - 1 and rng.random() > 0.1  # now and then cut by the next reset
                events.append((S.KIND_STEP, float(np.float32(rng.normal())), end and rng.random() > 0.3,
                               end and rng.random() <= 0.3))
        events.append((S.KIND_RESET, 0.0, False, False))
        events.append((S.KIND_STEP, 1.0, False, False))  # unfinished
        streams[e] = events
    return streams


def _write(path, streams):
    rec = Recording(str(path / "env-0.npz"), "env", sorted(streams), BOX, BOX, np.float32, False)
    for k, env in enumerate(sorted(streams)):
        for kind, r, te, tr in streams[env]:
            rec.buffers[k].append(kind, 1, 0, core.reward_bits(r, True) if kind else 0, te, tr)
    rec.close()
    return str(path)


def _reference(env_dir, log, mode):
    """The report as the check made it when it kept every recorded episode."""
    recorded = recorded_episodes(env_dir)
    pair = {"env": M._by_env, "order": M._in_order}[mode]
    envs, diffs, n_compared, n_differ = pair(recorded, log, M.RTOL, M.ATOL)
    guessed = mode == "order" and len(set(recorded.total_steps.values())) > 1
    return EpisodeReport(mode, envs, diffs, n_compared, n_differ, recorded, log, M.RTOL, M.ATOL,
                         wording.ORDER_GUESSED if guessed else None)


def _logs(recorded, rng):
    """Logs cut from the recorded episodes: shorter per env, shorter in order, one wrong return, longer."""
    cols = recorded.columns
    out = []
    for keep in (0, 3, 10, 10 ** 6):
        sel = np.concatenate([np.flatnonzero(cols["env"] == e)[:keep] for e in recorded.envs])
        r = cols["ret"][sel].copy()
        if r.size > 4:
            r[r.size // 2] += 1.0
        out.append(("env", EpisodeLog(r, cols["length"][sel], cols["env"][sel])))
        order = np.lexsort((cols["env"], cols["end_step"]))[:keep * len(recorded.envs)]
        r = cols["ret"][order].copy()
        if r.size > 4:
            r[r.size // 3] -= 1.0
        out.append(("order", EpisodeLog(r, cols["length"][order])))
    extra = EpisodeLog(np.append(cols["ret"][order], [1.0, 2.0]), np.append(cols["length"][order], [1, 1]))
    out.append(("order", extra))  # more logged than recorded
    stray = EpisodeLog([1.0, 2.0], [1, 1], [0, 7])  # an env no ledger records
    out.append(("env", stray))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bounded_check_reports_what_the_full_check_reported(tmp_path, seed):
    env_dir = _write(tmp_path, _streams(seed))
    for mode, log in _logs(recorded_episodes(env_dir), np.random.default_rng(seed)):
        got = check_episodes(env_dir, log, match=mode)
        want = _reference(env_dir, log, mode)
        assert got.to_dict() == want.to_dict(), (mode, len(log))
        assert got.lines() == want.lines()


@pytest.mark.parametrize("seed", [0, 3])
def test_keepers_hold_no_more_than_the_log_needs(tmp_path, seed):
    env_dir = _write(tmp_path, _streams(seed, n_envs=4))
    full = recorded_episodes(env_dir)
    ledger = D.open_env_ledger(env_dir)
    try:
        for k in (0, 5, 17):
            # in completion order: the k that ended first, whatever the chunks; no slack, so rows drop as they come
            keeper = D.Earliest(k, slack=0)
            kept = D.derive(ledger, keeper, chunk=7)
            order = np.lexsort((full.columns["env"], full.columns["end_step"]))[:k]
            assert sorted(kept.columns["end_step"].tolist()) == sorted(full.columns["end_step"][order].tolist())
            assert len(kept.columns["env"]) == min(k, len(full)) and len(kept) == len(full)
            assert kept.counts == full.counts
            for e in full.envs:  # each env's first episode not kept
                mine = full.columns["episode"][full.columns["env"] == e]
                n_kept = int(np.count_nonzero(kept.columns["env"] == e))
                assert kept.beyond.get(e) == (int(mine[n_kept]) if n_kept < mine.size else None)
            # per env: the first limits[e] + 1 of each env
            limits = {0: k, 2: 1}
            kept = D.derive(ledger, D.FirstPerEnv(limits), chunk=7)
            for e in full.envs:
                mine = full.columns["episode"][full.columns["env"] == e]
                assert kept.columns["episode"][kept.columns["env"] == e].tolist() == \
                    mine[:limits.get(e, 0) + 1].tolist()
            assert kept.counts == full.counts
    finally:
        ledger.close()


def _multiset_logs(recorded):
    """Logs for multiset matching: some of the recorded episodes shuffled, one wrong, one never recorded."""
    cols = recorded.columns
    rng = np.random.default_rng(5)
    out = []
    for keep in (0, 4, 25, 10 ** 6):
        sel = rng.permutation(len(cols["env"]))[:keep]
        r, ln = cols["ret"][sel].copy(), cols["length"][sel].copy()
        if r.size > 4:
            r[1] += 1.0
            ln[2] += 1
        out.append(EpisodeLog(np.append(r, 99.0), np.append(ln, 1)))
    return out


def _bounded_multiset(env_dir, log, chunk=7):
    ledger = D.open_env_ledger(env_dir)
    try:
        keeper = M.Matchable(log, M.RTOL, M.ATOL, slack=0)
        held = []
        trim = keeper._trim

        def watched():
            trim()
            held.append(keeper.held)
        keeper._trim = watched
        recorded = D.derive(ledger, keeper, chunk=chunk)
    finally:
        ledger.close()
    return recorded, M._multiset(recorded, log, M.RTOL, M.ATOL, keeper.dropped), held


@pytest.mark.parametrize("seed", [0, 1])
def test_bounded_multiset_reports_what_matching_every_episode_reported(tmp_path, seed):
    # distinct random returns: one maximum matching only, so the report is the same line for line
    env_dir = _write(tmp_path, _streams(seed))
    full = recorded_episodes(env_dir)
    for log in _multiset_logs(full):
        want = EpisodeReport("multiset", *M._multiset(full, log, M.RTOL, M.ATOL), full, log, M.RTOL, M.ATOL)
        recorded, got, held = _bounded_multiset(env_dir, log)
        got = EpisodeReport("multiset", *got, recorded, log, M.RTOL, M.ATOL)
        assert got.to_dict() == want.to_dict(), len(log)
        assert bool(held) == (len(full) > 2 * len(log))  # rows dropped as they come where the log is shorter
        assert max(held, default=0) <= len(log)  # after each drop, no more rows than the log has episodes
        assert check_episodes(env_dir, log, match="multiset").to_dict() == want.to_dict()


def test_bounded_multiset_matches_as_many_when_matchings_are_many(tmp_path):
    # every episode of one length and one return: which recorded ones stay unmatched is a choice,
    # but how many are matched, unlogged and unrecorded is not
    streams = {e: [(S.KIND_RESET, 0.0, False, False), (S.KIND_STEP, 0.25, True, False)] * (30 + 7 * e)
               for e in range(3)}
    env_dir = _write(tmp_path, streams)
    full = recorded_episodes(env_dir)
    for n in (0, 5, 40, 200):
        log = EpisodeLog(np.full(n, 0.25), np.ones(n, dtype=np.int64))
        want = M._multiset(full, log, M.RTOL, M.ATOL)
        recorded, got, held = _bounded_multiset(env_dir, log, chunk=5)
        assert got[2:] == want[2:]  # episodes compared, episodes differing
        count = {w: sum(d.n_differ for d in diffs if d.what == w) for diffs in (got[1], want[1])
                 for w in ("unlogged", "unrecorded")}
        assert count == {w: sum(d.n_differ for d in want[1] if d.what == w) for w in ("unlogged", "unrecorded")}
        assert max(held, default=0) <= n and len(recorded) == len(full)


def test_logs_past_the_episode_limit_are_refused_in_one_line(tmp_path, monkeypatch):
    from stepledger.episodes import logs as L
    from stepledger.errors import LedgerError
    monkeypatch.setattr(L, "MAX_LOG_EPISODES", 5)
    monkeypatch.setattr(L, "MAX_LOG_MEMBER_BYTES", 1 << 20)
    (tmp_path / "log.csv").write_text("r,l\n" + "1.5,2\n" * 6)
    with pytest.raises(LedgerError, match=r"log.csv: an episode log of more than 5 episodes; a reader accepts at "
                                          r"most 5$"):
        L.read_episode_log(str(tmp_path / "log.csv"))
    (tmp_path / "log.csv").write_text("r,l\n" + "1.5,2\n" * 5)
    assert len(L.read_episode_log(str(tmp_path / "log.csv"))) == 5
    mon = tmp_path / "mon"
    mon.mkdir()
    for i in range(2):  # 3 + 3 over a directory: more than 5 together
        (mon / ("%d.monitor.csv" % i)).write_text('#{"t_start": 0}\nr,l,t\n' + "1.0,1,0\n" * 3)
    with pytest.raises(LedgerError, match=r"mon: an episode log of more than 5 episodes"):
        L.read_episode_log(str(mon))
    np.savez(tmp_path / "log.npz", r=np.ones(6), l=np.ones(6, np.int64))
    with pytest.raises(LedgerError, match=r"log.npz: an episode log of more than 5 episodes"):
        L.read_episode_log(str(tmp_path / "log.npz"))
    np.savez(tmp_path / "big.npz", r=np.ones(1 << 18), l=np.ones(1 << 18, np.int64))  # 2 MB arrays
    with pytest.raises(LedgerError, match=r"big.npz: member r declares \d+ bytes; a reader accepts at most 1048576"):
        L.read_episode_log(str(tmp_path / "big.npz"))


def test_cut_episodes_are_counted_all_and_listed_first_only(tmp_path, monkeypatch):
    # a ledger of resets only after one step each, never an end: every episode is cut off by the next reset
    monkeypatch.setattr(D, "CUT_LISTED", 4)
    streams = {e: [(S.KIND_RESET, 0.0, False, False), (S.KIND_STEP, 0.5, False, False)] * (10 + e) for e in range(2)}
    env_dir = _write(tmp_path, streams)
    rec = D.recorded_episodes(env_dir, chunk=3)
    assert {e: v.tolist() for e, v in rec.cut.items()} == {0: [0, 1, 2, 3], 1: [0, 1, 2, 3]}
    assert rec.cut_counts == {0: 9, 1: 10}  # each env's last episode is unfinished, not cut
    report = check_episodes(env_dir, EpisodeLog([], []), match="order")
    assert report.to_dict()["cut_count"] == {"0": 9, "1": 10}
    assert wording.cut_episodes(19) in report.lines()
