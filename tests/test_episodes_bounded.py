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

from stepledger import _schema as S
from stepledger import core, wording
from stepledger.episodes import EpisodeReport, check_episodes, recorded_episodes
from stepledger.episodes import derive as D
from stepledger.episodes import match as M
from stepledger.episodes.logs import EpisodeLog
from stepledger.recording import Recording
from stepledger.spaces import LeafLayout

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
