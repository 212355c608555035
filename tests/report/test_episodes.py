"""The episode check: the trainer's episode log against the episodes the env-side ledgers recorded.

Clean logs pass (SB3 VecMonitor and Monitor, Gymnasium 1.4's vector
RecordEpisodeStatistics under NEXT_STEP and SAME_STEP); the paper's log faults
``log:drop-first`` and ``log:short``, injected through a faulty tap, are caught
at the first affected episode; and Gymnasium 1.3.0's real SAME_STEP bug is
caught at each env's second episode, in a second venv.
"""

import functools
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers.vector import RecordEpisodeStatistics
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stepledger
from stepledger import LedgerEnv, LedgerError, LedgerVectorEnv, compare, read
from stepledger.format import schema as S
from stepledger import core
from stepledger.cli.main import main
from stepledger.episodes import (EpisodeLog, EpisodeLogTap, check_episodes, read_episode_log,
                                 recorded_episodes)
from stepledger.recording.recording import Recording
from stepledger.format.spaces import LeafLayout

from side_venv import cached_venv, imported_version  # noqa: E402
from trainer_envs import make_ledger_gym  # noqa: E402  (importable by worker processes)

BOX = gym.spaces.Box(-1, 1, (1,), np.float32)
ACT = gym.spaces.Discrete(2)
N_ENVS = 3


# ---------------------------------------------------------------- envs and helpers

class RewardEnv(gym.Env):
    """Episodes of ``lengths[k % len]`` steps with varied float rewards; ends alternate terminated, truncated."""

    metadata = {"render_modes": []}
    observation_space = BOX
    action_space = ACT

    def __init__(self, index=0, lengths=(4, 6, 5)):
        self.index, self.lengths = index, lengths
        self.episode, self.t = -1, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        n = self.lengths[self.episode % len(self.lengths)]
        reward = -(1.0 + 0.37 * self.t + 0.0131 * self.episode + 0.1 * self.index) / 3.0
        end = self.t >= n
        term, trunc = end and self.episode % 2 == 0, end and self.episode % 2 == 1
        return np.full(1, self.t / 10, np.float32), reward, term, trunc, {}


def make_env(directory, i, monitor_dir=None):
    env = RewardEnv(i, lengths=(4 + i, 6, 5 + 2 * i))
    if monitor_dir is not None:
        from stable_baselines3.common.monitor import Monitor
        env = Monitor(env, os.path.join(monitor_dir, str(i)))  # writes monitor_dir/i.monitor.csv
    return LedgerEnv(env, directory, index=i)  # outermost in the env


def write_ledger(path, streams, reward_dtype=np.float32):
    """An env-side ledger from explicit events: streams maps env -> [(kind, reward, terminated, truncated)]."""
    rec = Recording(path, "env", sorted(streams), LeafLayout(BOX), LeafLayout(ACT), reward_dtype, False)
    is_f32 = np.dtype(reward_dtype) == np.float32
    for k, env in enumerate(sorted(streams)):
        for kind, r, te, tr in streams[env]:
            rec.buffers[k].append(kind, 1, 0, core.reward_bits(r, is_f32) if kind else 0, te, tr)
    rec.close()
    return path


def reference_episodes(events, reward_dtype=np.float32):
    """Completed episodes by plain Python: (episode, length, float64 sum, float32 running sum), cut, unfinished."""
    out, cut, ep, cur = [], [], -1, None
    for kind, r, te, tr in events:
        if kind == S.KIND_RESET:
            if cur is not None:
                cut.append(ep)
            ep += 1
            cur = [0, 0.0, np.float32(0)]
            continue
        if cur is None:
            continue
        rr = float(np.float32(r)) if reward_dtype == np.float32 else float(r)
        cur[0] += 1
        cur[1] += rr
        cur[2] = np.float32(cur[2] + np.float32(rr))
        if te or tr:
            out.append((ep, cur[0], cur[1], cur[2]))
            cur = None
    return out, cut, (None if cur is None else (ep, cur[0]))


class FaultyTap(EpisodeLogTap):
    """An EpisodeLogTap that logs a log fault: for env ``target`` from its ``at``-th logged episode on,
    ``log:drop-first`` leaves the episode's first reward out of the logged return, ``log:short`` counts
    its length one short. It follows the autoreset mode to find each episode's first reward."""

    def __init__(self, env, path, fault, target=1, at=2):
        super().__init__(env, path)
        n = self.num_envs
        self.fault, self.target, self.at = fault, target, at
        self.same = self.env.metadata.get("autoreset_mode") == AutoresetMode.SAME_STEP
        self.first = np.zeros(n)
        self.fresh = np.ones(n, dtype=bool)
        self.pending = np.zeros(n, dtype=bool)
        self.count = np.zeros(n, dtype=int)

    def reset(self, *, seed=None, options=None):
        out = self.env.reset(seed=seed, options=options)
        self.fresh[:] = True
        self.pending[:] = False
        return out

    def step(self, actions):
        obs, rew, term, trunc, info = self.env.step(actions)
        self._vsteps += 1
        take = ~self.pending & self.fresh  # under NEXT_STEP a pending env's step is its reset
        self.first[take] = rew[take]
        self.fresh[take] = False
        self.fresh[self.pending] = True
        self.pending[:] = False
        n0 = len(self._r)
        self._take(info)
        for k in range(n0, len(self._r)):
            e = self._env[k]
            if e == self.target and self.count[e] >= self.at:
                if self.fault == "log:drop-first":
                    self._r[k] -= self.first[e]
                else:
                    self._l[k] -= 1
            self.count[e] += 1
        done = term | trunc
        if self.same:
            self.fresh[done] = True
        else:
            self.pending[done] = True
        return obs, rew, term, trunc, info


def run_gym(directory, mode, steps=40, fault=None, trainer_ledger=False, make=None):
    fns = [functools.partial(make_ledger_gym, "Pendulum-v1", directory, i, max_episode_steps=4 + i) if make is None
           else functools.partial(make, directory, i) for i in range(N_ENVS)]
    envs = SyncVectorEnv(fns, autoreset_mode=mode)
    if trainer_ledger:
        envs = LedgerVectorEnv(envs, os.path.join(directory, "trainer.npz"))  # innermost
    envs = RecordEpisodeStatistics(envs)
    path = os.path.join(directory, "episodes.npz")
    envs = FaultyTap(envs, path, fault) if fault else EpisodeLogTap(envs, path)  # outermost
    envs.reset(seed=0)
    envs.action_space.seed(0)
    for _ in range(steps):
        envs.step(envs.action_space.sample())
    envs.close()
    return path


def first_reward(directory, env, episode):
    """The reward of the first step of ``episode`` in env ``env``'s ledger, as the ledger holds it."""
    with read(directory) as ledger:
        c = ledger.streams[env].columns
        f32 = ledger.meta["reward_dtype"] == "float32"
    i = int(np.flatnonzero((c["episode"] == episode) & (c["step"] == 1))[0])
    bits = np.array(c["h_rew"][i], dtype=np.uint64)
    return float(bits.astype(np.uint32).view(np.float32)[()] if f32 else bits.view(np.float64)[()])


def recorded_of(directory, env, episode):
    rec = recorded_episodes(directory).of_env(env)
    j = int(np.flatnonzero(rec["episode"] == episode)[0])
    return float(rec["ret"][j]), int(rec["length"][j])


# ---------------------------------------------------------------- deriving episodes

def test_episodes_from_a_hand_made_ledger(tmp_path):
    R, T = S.KIND_RESET, S.KIND_STEP
    events = [(T, 9.0, False, False),  # before the first reset: outside any episode
              (R, 0, False, False), (T, 1.5, False, False), (T, 2.25, True, False),  # episode 0: 2 steps
              (T, 7.0, False, False),  # after the end, before the next reset
              (R, 0, False, False), (T, -1.0, False, False),  # episode 1: cut off by a reset
              (R, 0, False, False), (T, 0.5, False, True),  # episode 2: 1 step, truncated
              (R, 0, False, False), (T, 4.0, False, False)]  # episode 3: unfinished
    d = tmp_path / "led"
    d.mkdir()
    write_ledger(str(d / "env-0.npz"), {0: events})
    for chunk in (1, 2, 3, 5, 1 << 20):
        rec = recorded_episodes(str(d), chunk=chunk)
        c = rec.columns
        assert c["episode"].tolist() == [0, 2]
        assert c["length"].tolist() == [2, 1]
        assert c["ret"].tolist() == [3.75, 0.5]
        assert c["end_step"].tolist() == [3, 6]
        assert {e: v.tolist() for e, v in rec.cut.items()} == {0: [1]} and rec.unfinished == {0: (3, 1)} and rec.stray_steps == {0: 2}
    report = check_episodes(str(d), {"env": [0, 0], "r": [3.75, 0.5], "l": [2, 1]})
    assert report.ok, str(report)
    lines = str(report).splitlines()
    assert lines[0] == "0 of 1 envs differ; 0 of 2 compared episodes differ"
    assert "note: 1 unfinished episode (the last of its env's ledger, 1 steps so far) is not compared" in lines
    assert any("1 episodes ended by a reset" in x for x in lines)
    assert any("2 steps outside any episode" in x for x in lines)


_REWARD = st.floats(-1e4, 1e4, allow_nan=False, width=32)
_EVENT = st.one_of(
    st.just((S.KIND_RESET, 0.0, False, False)),
    st.tuples(st.just(S.KIND_STEP), _REWARD, st.just(False), st.just(False)),  # a step that goes on
    st.builds(lambda r, flags: (S.KIND_STEP, r, *flags), _REWARD,
              st.sampled_from([(False, False), (True, False), (False, True)])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams=st.lists(st.lists(_EVENT, min_size=1, max_size=90), min_size=1, max_size=3),
       chunk=st.integers(1, 9), f64=st.booleans())
def test_episodes_match_a_plain_python_reference(streams, chunk, f64):
    dtype = np.float64 if f64 else np.float32
    with tempfile.TemporaryDirectory() as d:
        write_ledger(os.path.join(d, "env-0.npz"), dict(enumerate(streams)), dtype)
        rec = recorded_episodes(d, chunk=chunk)
    for e, events in enumerate(streams):
        want, cut, unfinished = reference_episodes(events, dtype)
        got = rec.of_env(e)
        assert got["episode"].tolist() == [w[0] for w in want]
        assert got["length"].tolist() == [w[1] for w in want]
        np.testing.assert_allclose(got["ret"], [w[2] for w in want], rtol=1e-12, atol=1e-9)
        assert got["ret32"].tolist() == [float(w[3]) for w in want]  # bit for bit the sequential float32 sum
        assert list(rec.cut.get(e, [])) == cut
        assert rec.unfinished.get(e) == unfinished


def test_long_episode_float32_running_sum_is_accepted(tmp_path):
    # VecMonitor sums in float32: over 20000 rewards of 0.1 its sum drifts by about 1, far outside the
    # tolerance of the float64 sum (1e-5 * 2000 + 1e-5). The running float32 sum the check also derives
    # matches it exactly, and a dropped reward of 0.1 still shows.
    n = 20000
    events = [(S.KIND_RESET, 0, False, False)] + [(S.KIND_STEP, 0.1, False, i == n - 1) for i in range(n)]
    d = tmp_path / "led"
    d.mkdir()
    write_ledger(str(d / "env-0.npz"), {0: events})
    acc = np.float32(0)
    for _ in range(n):
        acc = np.float32(acc + np.float32(0.1))
    exact = float(np.float64(np.float32(0.1)) * n)
    assert abs(float(acc) - exact) > 1e-5 * exact + 1e-5  # outside the tolerance of the float64 sum
    assert recorded_episodes(str(d)).columns["ret32"][0] == acc
    assert check_episodes(str(d), {"env": [0], "r": [float(acc)], "l": [n]})
    assert check_episodes(str(d), {"env": [0], "r": [exact], "l": [n]})
    assert not check_episodes(str(d), {"env": [0], "r": [exact - 0.1], "l": [n]})  # a first reward dropped


# ---------------------------------------------------------------- Gymnasium

@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_gymnasium_record_episode_statistics_clean(tmp_path, mode):
    d = str(tmp_path)
    log = run_gym(d, mode, trainer_ledger=True)
    assert compare(d, os.path.join(d, "trainer.npz"))  # the boundary is clean too
    report = check_episodes(d, log)
    assert report.ok, str(report)
    assert report.mode == "env" and report.n_compared >= 3 * N_ENVS
    assert main(["episodes", d, log]) == 0


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_gymnasium_terminated_and_truncated_clean(tmp_path, mode):
    d = str(tmp_path)
    log = run_gym(d, mode, steps=30, make=make_env)  # episodes end by terminated and by truncated
    report = check_episodes(d, log)
    assert report.ok, str(report)
    assert report.n_compared >= 3 * N_ENVS


def test_gymnasium_async_same_step_clean(tmp_path):
    d = str(tmp_path)
    fns = [functools.partial(make_ledger_gym, "Pendulum-v1", d, i, max_episode_steps=4 + i) for i in range(N_ENVS)]
    envs = gym.vector.AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    envs = EpisodeLogTap(RecordEpisodeStatistics(envs), os.path.join(d, "episodes.npz"))
    envs.reset(seed=1)
    envs.action_space.seed(1)
    for _ in range(30):
        envs.step(envs.action_space.sample())
    envs.close()
    report = check_episodes(d, os.path.join(d, "episodes.npz"))
    assert report.ok and report.n_compared >= 3 * N_ENVS, str(report)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("fault", ["log:drop-first", "log:short"])
def test_gymnasium_log_faults_caught_at_first_affected_episode(tmp_path, mode, fault):
    d = str(tmp_path)
    log = run_gym(d, mode, fault=fault)  # env 1, from its third episode (episode 2) on
    report = check_episodes(d, log)
    assert not report
    assert [(x.env, x.what, x.episode) for x in report.differences] == [(1, "episode", 2)], str(report)
    diff = report.differences[0]
    ret, length = recorded_of(d, 1, 2)
    assert diff.recorded == (ret, length)
    if fault == "log:drop-first":
        assert diff.logged[1] == length
        assert diff.logged[0] == pytest.approx(ret - first_reward(d, 1, 2), abs=1e-5)
    else:
        assert diff.logged == (pytest.approx(ret, abs=1e-5), length - 1)
    assert diff.n_differ == report.n_differ >= 2  # every later episode of env 1 too
    assert str(report).splitlines()[0] == (
        "env 1, episode 2: logged return %.8g over %d steps, env recorded return %.8g over %d steps"
        % (diff.logged[0], diff.logged[1], ret, length))
    assert "1 of 3 envs differ" in str(report)
    assert main(["episodes", d, log]) == 1


def test_tap_file_format(tmp_path):
    d = str(tmp_path)
    log = run_gym(d, AutoresetMode.SAME_STEP)
    with np.load(log, allow_pickle=False) as z:
        assert sorted(z.files) == ["env", "l", "meta", "r", "vstep"]
        meta = json.loads(str(z["meta"][()]))
        assert meta["format"] == "stepledger-episode-log" and meta["autoreset_mode"] == "SAME_STEP"
        assert z["env"].dtype == np.int64 and z["r"].dtype == np.float64 and z["l"].dtype == np.int64
        assert np.all(np.diff(z["vstep"]) >= 0)
    parsed = read_episode_log(log)
    assert parsed.kind == "tap" and parsed.env is not None and len(parsed) >= 3 * N_ENVS


# ---------------------------------------------------------------- Stable-Baselines3

try:
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnvWrapper, VecMonitor
except ImportError:  # the SB3 tests skip; the rest runs
    DummyVecEnv = SubprocVecEnv = VecMonitor = None
    VecEnvWrapper = object
needs_sb3 = pytest.mark.skipif(VecMonitor is None, reason="stable-baselines3 is not installed")


class _FirstRewards(VecEnvWrapper):
    """Passes everything through; notes each env's first reward of the episode and, per step, the envs done."""

    def __init__(self, venv):
        super().__init__(venv)
        self.first = np.zeros(self.num_envs)
        self.fresh = np.ones(self.num_envs, dtype=bool)
        self.queue = []

    def reset(self):
        obs = self.venv.reset()
        self.fresh[:] = True
        self.queue.clear()
        return obs

    def step_wait(self):
        obs, rew, done, infos = self.venv.step_wait()
        self.first[self.fresh] = rew[self.fresh]
        self.fresh[:] = False
        self.queue.extend((int(i), float(self.first[i])) for i in np.flatnonzero(done))
        self.fresh[done] = True
        return obs, rew, done, infos


class FaultyVecMonitor(VecMonitor or object):
    """A real VecMonitor whose rows (and info["episode"]) carry a log fault for env ``target`` from
    its ``at``-th episode on. VecMonitor writes the rows of a step's done envs in env order."""

    def __init__(self, venv, filename, fault, target=1, at=2):
        self.peek = _FirstRewards(venv)
        super().__init__(self.peek, filename)
        self.count = np.zeros(self.num_envs, dtype=int)
        write = self.results_writer.write_row

        def write_row(info):
            i, first = self.peek.queue.pop(0)
            if i == target and self.count[i] >= at:
                if fault == "log:drop-first":
                    info["r"] = info["r"] - np.float32(first)
                else:
                    info["l"] = info["l"] - 1
            self.count[i] += 1
            write(info)

        self.results_writer.write_row = write_row


def run_sb3(directory, kind="dummy", steps=40, fault=None):
    fns = [functools.partial(make_ledger_gym, "Pendulum-v1", directory, i, max_episode_steps=4 + i)
           for i in range(N_ENVS)]
    # fork: forkserver and spawn workers import SB3 and torch again, seconds each
    start = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    venv = DummyVecEnv(fns) if kind == "dummy" else SubprocVecEnv(fns, start_method=start)
    path = os.path.join(directory, "monitor.csv")
    venv = FaultyVecMonitor(venv, path, fault) if fault else VecMonitor(venv, path)
    venv.seed(0)
    venv.reset()
    actions = np.random.default_rng(0).uniform(-2, 2, size=(steps, N_ENVS, 1)).astype(np.float32)
    for a in actions:
        venv.step(a)
    venv.close()
    return path


@needs_sb3
@pytest.mark.parametrize("kind", ["dummy", "subproc"])
def test_sb3_vecmonitor_clean(tmp_path, kind):
    d = str(tmp_path)
    log = run_sb3(d, kind)
    report = check_episodes(d, log)
    assert report.ok, str(report)
    assert report.mode == "order" and report.n_compared >= 3 * N_ENVS
    assert "completion order" in str(report)
    assert check_episodes(d, log, match="multiset")
    if kind == "dummy":
        # DummyVecEnv hands VecMonitor float32 rewards, which it sums in float32: the running float32 sum exactly
        rec = recorded_episodes(d).columns
        order = np.lexsort((rec["env"], rec["end_step"]))
        parsed = read_episode_log(log)
        assert np.array_equal(parsed.r.astype(np.float32), rec["ret32"][order][:len(parsed)])


@needs_sb3
def test_sb3_ppo_vecmonitor_clean(tmp_path):
    from stable_baselines3 import PPO
    d = str(tmp_path)
    venv = VecMonitor(DummyVecEnv([functools.partial(make_env, d, i) for i in range(N_ENVS)]),
                      os.path.join(d, "monitor.csv"))
    model = PPO("MlpPolicy", venv, n_steps=32, batch_size=48, n_epochs=1, seed=0, device="cpu")
    model.learn(96 * 2)
    model.learn(96, reset_num_timesteps=True)  # resets the envs mid-episode: those episodes are cut
    venv.close()
    report = check_episodes(d, os.path.join(d, "monitor.csv"))
    assert report.ok, str(report)
    assert report.n_compared >= 20 and sum(len(v) for v in report.cut.values()) >= 1


@needs_sb3
@pytest.mark.parametrize("kind", ["dummy", "subproc"])
@pytest.mark.parametrize("fault", ["log:drop-first", "log:short"])
def test_sb3_log_faults_caught_at_first_affected_episode(tmp_path, kind, fault):
    d = str(tmp_path)
    log = run_sb3(d, kind, fault=fault)
    report = check_episodes(d, log)
    assert not report
    assert [(x.env, x.what, x.episode) for x in report.differences] == [(1, "episode", 2)], str(report)
    diff = report.differences[0]
    ret, length = recorded_of(d, 1, 2)
    if fault == "log:drop-first":
        assert diff.logged[1] == length
        assert diff.logged[0] == pytest.approx(ret - first_reward(d, 1, 2), abs=1e-4)
    else:
        assert diff.logged == (pytest.approx(ret, abs=1e-4), length - 1)
    multi = check_episodes(d, log, match="multiset")
    assert not multi
    assert multi.differences[0].what == "unlogged"
    assert (multi.differences[0].env, multi.differences[0].episode) == (1, 2)
    assert main(["episodes", d, log, "--json"]) == 1


@needs_sb3
def test_sb3_monitor_files_per_env(tmp_path):
    d, mon = str(tmp_path / "led"), str(tmp_path / "mon")
    venv = DummyVecEnv([functools.partial(make_env, d, i, mon) for i in range(N_ENVS)])
    venv.reset()
    for _ in range(30):
        venv.step(np.zeros(N_ENVS, dtype=np.int64))
    venv.close()
    assert sorted(os.listdir(mon)) == ["%d.monitor.csv" % i for i in range(N_ENVS)]
    report = check_episodes(d, mon)  # a directory of N.monitor.csv: one env each
    assert report.ok and report.mode == "env" and report.n_compared >= 3 * N_ENVS, str(report)
    one = check_episodes(d, os.path.join(mon, "1.monitor.csv"))  # the file name gives the env
    assert one.ok and one.envs == [1], str(one)
    assert check_episodes(d, os.path.join(mon, "1.monitor.csv"), match="multiset").ok
    assert main(["episodes", d, os.path.join(mon, "2.monitor.csv")]) == 0
    # a Monitor file under another name: --env says which env it is
    shutil.copy(os.path.join(mon, "2.monitor.csv"), str(tmp_path / "monitor.csv"))
    assert main(["episodes", d, str(tmp_path / "monitor.csv"), "--env", "2"]) == 0
    assert main(["episodes", d, str(tmp_path / "monitor.csv"), "--env", "0"]) == 1


# ---------------------------------------------------------------- logs given as arrays, counts, wording

def _one_env_dir(tmp_path):
    R, T = S.KIND_RESET, S.KIND_STEP
    events = [(R, 0, False, False), (T, -1.0, False, False), (T, -2.5, True, False),
              (R, 0, False, False), (T, -4.0, False, True),
              (R, 0, False, False), (T, 3.0, False, False), (T, 0.25, True, False)]
    d = tmp_path / "led"
    d.mkdir()
    write_ledger(str(d / "env-0.npz"), {0: events})
    write_ledger(str(d / "env-1.npz"), {1: events[:5]})
    return str(d)


def test_arrays_rows_dict_and_episode_log(tmp_path):
    d = _one_env_dir(tmp_path)
    rows = [(0, -3.5, 2), (1, -3.5, 2), (0, -4.0, 1), (1, -4.0, 1), (0, 3.25, 2)]
    assert check_episodes(d, rows)
    assert check_episodes(d, np.array(rows))
    env, r, l_arr = zip(*rows)
    assert check_episodes(d, {"env": env, "r": r, "l": l_arr})
    assert check_episodes(d, EpisodeLog.from_arrays(env, r, l_arr))
    # no env index, and the two streams hold different numbers of steps: matched as a multiset
    no_env = check_episodes(d, {"r": r, "l": l_arr})
    assert no_env.ok and no_env.mode == "multiset", str(no_env)
    assert "cannot be derived" in str(no_env)
    assert check_episodes(d, {"r": r, "l": l_arr}, match="order").mode == "order"


def test_wording_of_each_kind_of_difference(tmp_path):
    d = _one_env_dir(tmp_path)
    r = check_episodes(d, [(0, -3.5, 2), (1, -3.5, 2), (0, -4.0, 1), (1, -4.5, 1)])
    assert str(r).splitlines() == [
        "env 0: the log has 2 episodes, the env recorded 3 completed ones: the env recorded 1 more, from episode 2 "
        "on; the 2 both have agree",
        "env 1, episode 1: logged return -4.5 over 1 steps, env recorded return -4 over 1 steps",
        "2 of 2 envs differ; 1 of 4 compared episodes differ"]
    r = check_episodes(d, [(0, -3.5, 2), (1, -3.5, 2), (0, -4.0, 1), (1, -4.0, 1), (0, 3.25, 2), (0, 1, 1),
                           (4, 1.0, 3)])
    assert str(r).splitlines()[:2] == [
        "env 0: the log has 4 episodes, the env recorded 3 completed ones: the log has 1 more; the 3 both have agree",
        "env 4: the log has 1 episodes of this env, but no env ledger records it"]
    r = check_episodes(d, {"r": [-3.5, -3.5, -4.0, -4.0, 3.25, 9.0], "l": [2, 2, 1, 1, 2, 7]}, match="order")
    assert str(r).splitlines()[0] == ("the log has 1 more episodes than the envs recorded, from its episode 5 on "
                                      "(logged return 9 over 7 steps)")
    r = check_episodes(d, {"r": [-3.5, -3.5, -4.0, -4.0, 3.3], "l": [2, 2, 1, 1, 2]}, match="multiset")
    assert str(r).splitlines()[:3] == [
        "env 0, episode 2: env recorded return 3.25 over 2 steps; no logged episode matches it",
        "log episode 4: logged return 3.3 over 2 steps matches no episode the envs recorded",
        "1 of 5 recorded episodes and 1 of 5 logged episodes are unmatched"]
    data = json.loads(r.to_json())
    assert data["ok"] is False and data["mode"] == "multiset"
    assert data["differences"][0]["recorded"] == {"return": 3.25, "length": 2}


def test_close_digits_are_printed_apart(tmp_path):
    d = _one_env_dir(tmp_path)
    r = check_episodes(d, [(0, -3.5, 2), (0, -4.0, 1), (0, 3.2500100001, 2)], rtol=0, atol=1e-9)
    assert "logged return 3.25001 over 2 steps, env recorded return 3.25 over 2 steps" in str(r)


def test_tolerance_is_documented_value(tmp_path):
    d = _one_env_dir(tmp_path)
    # episode 2 of env 0: sum of |reward| 3.25: tolerance 3.25 * 1e-5 + 1e-5 = 4.25e-5
    assert check_episodes(d, [(0, -3.5, 2), (0, -4.0, 1), (0, 3.25 + 4.1e-5, 2), (1, -3.5, 2), (1, -4, 1)])
    assert not check_episodes(d, [(0, -3.5, 2), (0, -4.0, 1), (0, 3.25 + 4.4e-5, 2), (1, -3.5, 2), (1, -4, 1)])
    assert check_episodes(d, [(0, -3.5, 2), (0, -4.0, 1), (0, 3.25 + 4.4e-5, 2), (1, -3.5, 2), (1, -4, 1)],
                          rtol=2e-5)


# ---------------------------------------------------------------- refusals

def test_refusals_exit_2_with_one_line(tmp_path, capsys):
    d = str(tmp_path)
    log = run_gym(d, AutoresetMode.NEXT_STEP, steps=12, trainer_ledger=True)
    garbage = tmp_path / "garbage.csv"
    garbage.write_text("hello,world\n1,2\n")
    badrow = tmp_path / "bad.csv"
    badrow.write_text('#{"t_start": 0}\nr,l,t\n-1.5,3,0.1\n-2.0,x,0.2\n')
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00\x01" * 10)
    cases = [
        ([str(tmp_path / "missing"), log], "no such file"),
        ([d, str(tmp_path / "missing.npz")], "no such file"),
        ([os.path.join(d, "trainer.npz"), log], "a trainer-side ledger"),
        ([log, log], "not a ledger"),
        ([d, os.path.join(d, "trainer.npz")], "a stepledger ledger (trainer side), not an episode log"),
        ([d, str(garbage)], "not an episode log"),
        ([d, str(badrow)], "line 4 is not a row of the episode log"),
        ([d, str(binary)], "not an episode log"),
        ([d, d], "no N.monitor.csv files"),
    ]
    for args, message in cases:
        capsys.readouterr()
        assert main(["episodes", *args]) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (args, err)
        with pytest.raises(LedgerError):
            check_episodes(*args)


def test_log_without_env_index_given_per_env_match_is_refused(tmp_path):
    d = _one_env_dir(tmp_path)
    with pytest.raises(LedgerError, match="no env index"):
        check_episodes(d, {"r": [1.0], "l": [1]}, match="env")
    with pytest.raises(ValueError):
        check_episodes(d, {"r": [1.0], "l": [1]}, match="sideways")


# ---------------------------------------------------------------- the real bug: Gymnasium 1.3.0

GYM13_VENV = os.environ.get("STEPLEDGER_GYM13_VENV") or os.path.join(
    tempfile.gettempdir(), "stepledger-gym13-venv-py%d%d" % sys.version_info[:2])
REPO = os.path.dirname(os.path.dirname(os.path.abspath(stepledger.__file__)))

_GYM_SCRIPT = textwrap.dedent('''
    import functools, sys
    import gymnasium as gym
    import numpy as np
    from gymnasium.vector import AutoresetMode, SyncVectorEnv
    from gymnasium.wrappers.vector import RecordEpisodeStatistics
    from stepledger import LedgerEnv
    from stepledger.episodes import EpisodeLogTap

    def make(directory, i):
        return LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=5 + i), directory, index=i)

    directory = sys.argv[1]
    envs = SyncVectorEnv([functools.partial(make, directory, i) for i in range(3)],
                         autoreset_mode=AutoresetMode.SAME_STEP)
    envs = EpisodeLogTap(RecordEpisodeStatistics(envs), directory + "/episodes.npz")
    envs.reset(seed=0)
    envs.action_space.seed(0)
    for _ in range(30):
        envs.step(envs.action_space.sample())
    envs.close()
    print(gym.__version__)
''')


@pytest.fixture(scope="session")
def gym13_python():
    """A Python with gymnasium==1.3.0, in a venv cached at GYM13_VENV (built once, under a file lock)."""
    return cached_venv(GYM13_VENV, "stepledger-gym13-ready", "gymnasium==1.3.0", [["gymnasium==1.3.0", "numpy"]],
                       lambda python: imported_version(python, "gymnasium, numpy", "gymnasium"), "1.3.0")


def _run_script(python, directory):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_") and k != "PYTHONPATH"}
    # this checkout's stepledger, its pure-Python core: nothing to build for the other venv
    env.update(PYTHONPATH=REPO, STEPLEDGER_PUREPYTHON="1")
    script = os.path.join(directory, "run_gym.py")
    with open(script, "w") as f:
        f.write(_GYM_SCRIPT)
    out = subprocess.run([python, script, directory], capture_output=True, text=True, timeout=120, env=env,
                         cwd=directory)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_gymnasium_1_3_same_step_bug_is_caught_at_each_envs_second_episode(tmp_path, gym13_python):
    d = str(tmp_path / "gym13")
    os.makedirs(d)
    assert _run_script(gym13_python, d) == "1.3.0"
    report = check_episodes(d, os.path.join(d, "episodes.npz"))
    assert not report
    assert [(x.env, x.what, x.episode) for x in report.differences] == [(e, "episode", 1) for e in range(3)], \
        str(report)
    for diff in report.differences:
        ret, length = recorded_of(d, diff.env, 1)
        assert diff.recorded == (ret, length)
        # the bug: the episode's first reward and first step left out
        assert diff.logged[1] == length - 1
        assert diff.logged[0] == pytest.approx(ret - first_reward(d, diff.env, 1), abs=1e-4)
    assert main(["episodes", d, os.path.join(d, "episodes.npz")]) == 1


def test_gymnasium_1_4_same_script_passes(tmp_path):
    d = str(tmp_path / "gym14")
    os.makedirs(d)
    assert _run_script(sys.executable, d) == gym.__version__
    assert tuple(int(x) for x in gym.__version__.split(".")[:2]) >= (1, 4)
    report = check_episodes(d, os.path.join(d, "episodes.npz"))
    assert report.ok and report.n_compared >= 9, str(report)
