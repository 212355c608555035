"""Tianshou: both ledgers on real vector envs (Dummy, Subproc, Shmem) and a real Collector.

Each test runs a real ``LedgerCollector`` (Tianshou's ``Collector``) over real Tianshou vector envs, whose
workers build ``LedgerEnv`` through ``ledger_env_fns``; policies are Tianshou's ``RandomActionPolicy``.
"""

import os
import signal
import subprocess
import sys
import types

import numpy as np
import pytest

pytest.importorskip("tianshou")

from tianshou.data import CachedReplayBuffer, ReplayBuffer, VectorReplayBuffer  # noqa: E402

from stepledger import compare, read  # noqa: E402
from stepledger.tianshou import LedgerCollector, LedgerEnvFn, ledger_env_fns  # noqa: E402
from stepledger.tianshou.check import check, check_collector  # noqa: E402
from stepledger.tianshou.faults import VECTOR_FAULTS, FaultyVectorEnv  # noqa: E402

import ts_envs  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
VECTORS = ("dummy", "subproc", "shmem")


def _events(path):
    with read(path) as led:
        return {i: len(s) for i, s in led.streams.items()}


def _by_env(report):
    return {d.env: d for d in report.differences}


@pytest.mark.parametrize("vector", VECTORS)
def test_clean_runs_of_each_vector_env_compare_clean_event_for_event(tmp_path, vector):
    d = str(tmp_path)
    venv = ts_envs.vector_env(vector, ledger_env_fns(ts_envs.pendulum, 3, d))
    collector = ts_envs.random_collector(venv, d)
    collector.reset()
    collector.collect(n_step=90)                 # 30 vector steps: every env ends an episode at step 25
    collector.collect(n_episode=4)               # ends with Tianshou's reset of every env
    collector.collect(n_step=30, random=True)    # sampled from the action space, mapped back
    collector.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok and not report.notes, str(report)
    env_events, trainer_events = _events(d), _events(os.path.join(d, "trainer.npz"))
    assert env_events == trainer_events and min(env_events.values()) > 60
    with read(os.path.join(d, "env-0.npz")) as led:
        pid = led.meta["pid"]
    assert (pid == os.getpid()) == (vector == "dummy")  # the env ledgers are written in the workers


def test_shmem_spaces_probe_in_the_main_process_records_nothing_and_does_not_clash(tmp_path):
    """ShmemVectorEnv calls each env_fn() in the main process for the observation space, then closes it: that
    LedgerEnv of the same index records nothing, writes nothing, and the worker's ledger is the only one. (The
    workers' ledgers make their mapped parts when they are built: those are the only files before a step.)"""
    from stepledger.format import schema as S
    from stepledger.format.mapped import read_map
    from stepledger.recording import spiller
    d = str(tmp_path)
    before = set(spiller.OPEN)
    venv = ts_envs.vector_env("shmem", ledger_env_fns(ts_envs.pendulum, 2, d))
    collector = ts_envs.random_collector(venv, d)
    def probes_maps():
        """The mapped parts of this process's ledgers: the probe's, which Tianshou drops without close(): it is
        empty, read by no compare (its process runs), and removed at exit."""
        maps = {f: read_map(os.path.join(d, f)) for f in os.listdir(d) if S.MAP_INFIX in f}
        return [m for m in maps.values() if m is not None and m.meta.get(S.META_PID) == os.getpid()]

    assert [f for f in os.listdir(d) if S.MAP_INFIX not in f] == []
    assert all(m.n_events() == 0 for m in probes_maps())
    probes = [r for k, r in spiller.OPEN.items() if k not in before and r.pid == os.getpid() and r.side == "env"]
    assert not any(r.n_events() for r in probes)
    collector.reset()
    collector.collect(n_step=40)
    collector.close()
    assert sorted(f for f in os.listdir(d) if S.MAP_INFIX not in f) == ["env-0.npz", "env-1.npz", "trainer.npz"]
    assert len(probes_maps()) == len([f for f in os.listdir(d) if S.MAP_INFIX in f])  # the workers' are removed
    assert all(m.n_events() == 0 for m in probes_maps())
    assert compare(d, os.path.join(d, "trainer.npz")).ok


def test_map_action_is_recorded_as_the_action_the_env_received_not_a_false_alarm(tmp_path):
    """RandomActionPolicy samples Pendulum's [-2, 2] and its map_action clips to [-1, 1]: the buffer keeps the
    policy's act, the env receives the clipped one. The ledger compares what the env received: clean."""
    d = str(tmp_path)
    venv = ts_envs.vector_env("dummy", ledger_env_fns(ts_envs.pendulum, 2, d))
    collector = ts_envs.random_collector(venv, d)
    collector.reset()
    collector.collect(n_step=60)
    act = collector.buffer[np.arange(len(collector.buffer))].act
    collector.close()
    assert np.abs(act).max() > 1.0  # the buffer's act was changed on its way to the env
    assert compare(d, os.path.join(d, "trainer.npz")).ok


def test_a_rebuilt_obs_next_is_on_the_checked_side(tmp_path):
    """ReplayBuffer(ignore_obs_next=True) rebuilds obs_next from the next index: at an episode's last step it is
    the observation before it. The trainer side reads the buffer back, so that shows at each env's last step."""
    d = str(tmp_path)
    venv = ts_envs.vector_env("subproc", ledger_env_fns(lambda: ts_envs.pendulum(10), 2, d))
    collector = ts_envs.random_collector(venv, d, buffer=VectorReplayBuffer(400, 2, ignore_obs_next=True))
    collector.reset()
    collector.collect(n_step=40)  # two episodes of 10 steps each
    collector.close()
    by_env = _by_env(compare(d, os.path.join(d, "trainer.npz")))
    assert sorted(by_env) == [0, 1]
    for diff in by_env.values():
        assert (diff.episode, diff.step, tuple(diff.fields)) == (0, 10, ("obs",))


def test_a_users_on_step_hook_that_changes_the_batch_is_on_the_checked_side(tmp_path):
    d = str(tmp_path)
    calls = []

    def hook(action_batch, rollout_batch):
        calls.append(1)
        if len(calls) == 7:
            rollout_batch.rew[1] = 0.0  # env 1, episode 0, step 7

    venv = ts_envs.vector_env("dummy", ledger_env_fns(ts_envs.pendulum, 2, d))
    collector = ts_envs.random_collector(venv, d, on_step_hook=hook)
    collector.reset()
    collector.collect(n_step=30)
    collector.close()
    by_env = _by_env(compare(d, os.path.join(d, "trainer.npz")))
    assert sorted(by_env) == [1]
    assert (by_env[1].episode, by_env[1].step, tuple(by_env[1].fields)) == (0, 7, ("reward",))


@pytest.mark.parametrize("vector", VECTORS)
def test_issue_1281_dict_observations_in_shmem_vector_env_reach_the_buffer_as_obs_next(tmp_path, vector):
    """Tianshou issue 1281, on tianshou 2.0.1: with ShmemVectorEnv and a Dict observation, the buffer's obs of a
    transition equals its obs_next. ShmemVectorEnv hands out views into its shared memory for each key, the
    Collector keeps them (a shallow copy of the Batch) as the next step's obs, and the next step overwrites them.
    stepledger locates it at each env's first reset; Dummy and Subproc are clean."""
    d = str(tmp_path)
    venv = ts_envs.vector_env(vector, ledger_env_fns(ts_envs.DictCounter, 2, d))
    collector = ts_envs.random_collector(venv, d)
    collector.reset()
    collector.collect(n_step=24)
    batch = collector.buffer[np.arange(5)]  # env 0's first episode
    collector.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    if vector != "shmem":
        assert report.ok, str(report)
        assert batch.obs.a[:, 0].tolist() == [0, 1, 2, 3, 4]
        return
    assert batch.obs.a[:, 0].tolist() == batch.obs_next.a[:, 0].tolist() == [1, 2, 3, 4, 5]
    by_env = _by_env(report)
    assert sorted(by_env) == [0, 1]
    for diff in by_env.values():
        assert (diff.episode, diff.step, tuple(diff.fields)) == (0, 0, ("obs",))


def test_issue_1272_frame_stack_in_shmem_vector_env_what_was_tried(tmp_path, monkeypatch):
    """Tianshou issue 1272 (FrameStack inside ShmemVectorEnv stops updating), tried on tianshou 2.0.1:

    - Tianshou's own ``FrameStack`` (tianshou.env.atari.atari_wrapper) cannot be built with numpy 2.4: it
      gives ``np.floating`` as a Box dtype and ``np.dtype`` refuses it. (Its module imports cv2 for other
      wrappers; FrameStack does not use it, so an empty module stands in for the missing opencv.)
    - gymnasium's ``FrameStackObservation`` inside ShmemVectorEnv keeps updating: the buffer's stacked
      frames shift by one each step, and the ledgers compare clean.
    """
    monkeypatch.setitem(sys.modules, "cv2", sys.modules.get("cv2") or types.ModuleType("cv2"))
    from tianshou.env.atari.atari_wrapper import FrameStack
    with pytest.raises(TypeError, match="dtype"):
        FrameStack(ts_envs.BoxCounter(), 4)
    d = str(tmp_path)
    venv = ts_envs.vector_env("shmem", ledger_env_fns(ts_envs.StackedCounter(), 2, d))
    collector = ts_envs.random_collector(venv, d)
    collector.reset()
    collector.collect(n_step=20)
    frames = collector.buffer[np.arange(4)].obs[:, :, 0].tolist()
    collector.close()
    assert frames == [[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 2], [0, 1, 2, 3]]
    assert compare(d, os.path.join(d, "trainer.npz")).ok


def _cartpole(index):
    import gymnasium as gym
    env = gym.make("CartPole-v1", max_episode_steps=25)
    # seeded before its LedgerEnv wraps it (so not recorded): the episodes, and so whether the rollout meets a
    # time limit for truncated:as-term, are the same every run (the check seeds the actions)
    env.reset(seed=10 + index)
    return env


# CartPole's values survive these: its actions are 0 and 1, its rewards 1.0 (the Shmem check below has them)
SURVIVE_ON_CARTPOLE = {"action:f16", "action:clip", "reward:f16"}


def test_every_env_side_fault_in_the_workers_of_a_subproc_vector_env_is_located():
    report = check_collector(_cartpole, vector="subproc", place="worker", num_envs=3, steps=80)
    assert report.ok, str(report)
    assert {r.fault for r in report.results if not r.exercised} == SURVIVE_ON_CARTPOLE, str(report)
    assert all(r.located for r in report.results if r.exercised)


def test_every_trainer_side_fault_between_the_vector_env_and_the_collector_is_located():
    report = check_collector(_cartpole, vector="dummy", place="vector", num_envs=3, steps=80)
    assert report.ok, str(report)
    assert [r.fault for r in report.results] == list(VECTOR_FAULTS)
    # every reward is 1.0: a swap changes none (the command-line test has it on Pendulum)
    assert {r.fault for r in report.results if not r.exercised} == SURVIVE_ON_CARTPOLE | {"reward:swap"}, str(report)


def test_check_for_the_command_line_on_a_shmem_vector_env():
    faults = ["obs:f16", "action:f16", "action:clip", "reward:f16", "final-obs:zero", "truncated:as-term",
              "step:fill"]
    report = check("Pendulum-v1", num_envs=2, steps=30, max_episode_steps=12, tianshou_vector="shmem", faults=faults)
    assert report.ok, str(report)
    assert [r.located for r in report.results] == [True] * len(faults), str(report)


def test_stepledger_check_trainer_tianshou_on_the_command_line(capsys):
    from stepledger.cli.main import main
    code = main(["check", "Pendulum-v1", "--trainer", "tianshou", "--tianshou-vector", "dummy", "--tianshou-place",
                 "vector", "--num-envs", "2", "--steps", "30", "--max-episode-steps", "12",
                 "--faults", "reward:swap,final-obs:swap,truncated:drop"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "3 of 3 exercised faults caught and located; the boundary is checked" in out, out


def test_faulty_vector_env_keeps_the_vector_env_interface(tmp_path):
    d = str(tmp_path)
    venv = ts_envs.vector_env("dummy", ledger_env_fns(ts_envs.pendulum, 2, d))
    faulty = FaultyVectorEnv(venv, "reward:swap", at=3, target=1)
    assert len(faulty) == 2 and faulty.env_num == 2 and faulty.action_space == venv.action_space
    collector = ts_envs.random_collector(faulty, d)
    collector.reset()
    collector.collect(n_step=20)
    collector.close()
    diff = _by_env(compare(d, os.path.join(d, "trainer.npz")))[1]
    assert (1, diff.episode, diff.step, tuple(diff.fields)) == (faulty.first["env"], 0, 4, ("reward",))


def test_bad_input_is_one_line_naming_what_is_wrong(tmp_path):
    d = str(tmp_path)
    venv = ts_envs.vector_env("dummy", ledger_env_fns(ts_envs.pendulum, 2, d))
    try:
        with pytest.raises(ValueError, match=r"^LedgerCollector: CachedReplayBuffer changes or moves"):
            ts_envs.random_collector(venv, d, buffer=CachedReplayBuffer(ReplayBuffer(100), 2, 50))
        with pytest.raises(ValueError, match=r"^LedgerCollector: a buffer with stack_num=4"):
            ts_envs.random_collector(venv, d, buffer=VectorReplayBuffer(100, 2, stack_num=4))
    finally:
        venv.close()
    with pytest.raises(ValueError, match=r"^ledger_env_fns: num_envs must be a positive int, got 0"):
        ledger_env_fns(ts_envs.pendulum, 0, d)
    with pytest.raises(ValueError, match=r"^LedgerEnvFn: index must be"):
        LedgerEnvFn(ts_envs.pendulum, d, -1)
    with pytest.raises(ValueError, match=r"^check_collector: vector must be one of dummy, subproc, shmem"):
        check_collector(_cartpole, vector="ray")
    with pytest.raises(TypeError, match=r"^stepledger.tianshou.check: unknown option\(s\) autoreset"):
        check("CartPole-v1", autoreset="same")


def test_one_reward_per_agent_stops_the_trainer_ledger_with_a_warning_never_the_training(tmp_path):
    """A ledger records one reward a step; Tianshou's multi-agent envs give one per agent. The collector goes on."""
    d = str(tmp_path)
    venv = ts_envs.vector_env("dummy", ledger_env_fns(ts_envs.TwoAgentCounter, 2, d))
    collector = ts_envs.random_collector(venv, d)
    collector.reset()
    with pytest.warns(RuntimeWarning, match=r"^LedgerCollector: could not record the buffer's transitions \("):
        collector.collect(n_step=12)
    assert collector.collect(n_step=12).n_collected_steps == 12 and len(collector.buffer) == 24
    collector.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert not report.differences and report.notes, str(report)  # the trainer ledger was cut short: a note


def test_a_buffer_too_small_for_one_collect_ends_the_trainer_ledger_with_the_fix_never_the_training(tmp_path):
    d = str(tmp_path)
    venv = ts_envs.vector_env("dummy", ledger_env_fns(ts_envs.pendulum, 2, d))
    collector = ts_envs.random_collector(venv, d, buffer=VectorReplayBuffer(20, 2))
    collector.reset()
    collector.collect(n_step=8)
    with pytest.warns(RuntimeWarning, match=r"^LedgerCollector: env 0 added 15 transitions in one collect\(\) but its "
                                            r"buffer holds 10, so it overwrote some .* give each env's buffer room"):
        collector.collect(n_step=30)
    collector.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert not report.differences and report.notes, str(report)


# ---------------------------------------------------------------- runs that end badly (docs/ENDINGS.md)

def _start(vector, ending, directory):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p))
    code = "import ts_harness as H; H.main(%r, %r, %r)" % (vector, ending, directory)
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _compare(directory):
    """compare's report and the exit code ``stepledger compare`` gives it."""
    report = compare(directory, os.path.join(directory, "trainer.npz"))
    return report, 0 if report.ok else 1


def _ready(proc):
    line = proc.stdout.readline()
    assert line.startswith("ready"), proc.stderr.read()[-3000:]
    return [int(p) for p in line.split()[1:]]


def test_ctrl_c_to_the_process_group_loses_no_ledger(tmp_path):
    d = str(tmp_path)
    proc = _start("shmem", "wait", d)
    try:
        _ready(proc)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "KeyboardInterrupt" in proc.stderr.read()
    report, code = _compare(d)
    assert code == 0 and not report.differences, str(report)
    assert report.notes, str(report)  # the trainer ledger was written at exit, not closed: said in a note
    assert sorted(f for f in os.listdir(d) if f.endswith(".npz")) == ["env-0.npz", "env-1.npz", "trainer.npz"]


def test_a_killed_worker_leaves_its_ledger_up_to_its_last_spill_and_no_difference(tmp_path):
    d = str(tmp_path)
    proc = _start("subproc", "wait", d)
    try:
        pids = _ready(proc)
        os.kill(pids[1], signal.SIGKILL)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0  # the collector's pipe to the dead worker broke
    report, code = _compare(d)
    assert code == 0 and not report.differences, str(report)
    assert "env 1: records end at different points" in str(report), str(report)
