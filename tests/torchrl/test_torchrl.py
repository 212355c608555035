"""TorchRL: both ledgers on real batched envs (SerialEnv, ParallelEnv) and real collectors.

Each test runs a real TorchRL collector (``Collector``, ``MultiSyncCollector``, ``MultiAsyncCollector``, no
policy: random actions from the action spec) over real batched envs whose workers build ``LedgerEnv`` through
``ledger_env_fns``, and reads its batches through ``LedgerCollector``.
"""

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("torchrl")

import torch  # noqa: E402

from stepledger import compare, read  # noqa: E402
from stepledger.core import WITHHELD_DIGEST  # noqa: E402
from stepledger.faults.check import is_located  # noqa: E402
from stepledger.faults.engine import read_record  # noqa: E402
from stepledger.torchrl import INDEX_KEY, LedgerCollector, LedgerEnvFn, ledger_env_fns  # noqa: E402
from stepledger.torchrl.faults import inject_in_worker  # noqa: E402

import trl_envs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _events(path):
    with read(path) as led:
        return {i: len(s) for i, s in led.streams.items()}


def _withheld(path):
    with read(path) as led:
        return {i: int(np.count_nonzero(s.columns["h_obs"] == WITHHELD_DIGEST)) for i, s in led.streams.items()}


@pytest.mark.parametrize("kind,vector", [("single", "serial"), ("single", "parallel"), ("multisync", "serial")])
def test_clean_runs_compare_clean_event_for_event(tmp_path, kind, vector):
    d = str(tmp_path)
    trainer = trl_envs.run(kind, vector, d, frames=40, total=200)
    report = compare(d, trainer)
    assert report.ok, str(report)
    envs = 2 if kind == "single" else 4
    assert _events(d) == _events(trainer) and len(_events(d)) == envs
    # 25-step episodes end on the last step of the last batch: the reset after it is the collector's, and no
    # batch brings its observation; it is recorded as withheld, and said so
    assert all(n == 1 for n in _withheld(trainer).values())
    assert any("withheld by the library" in n for n in report.notes)
    with read(os.path.join(d, "env-0.npz")) as led:
        # the env ledgers are written where the envs run: ParallelEnv's workers, a multi-process collector's
        assert (led.meta["pid"] == os.getpid()) == (vector == "serial" and kind == "single")


@pytest.mark.parametrize("kind", ["single", "multisync"])
def test_reset_at_each_iter_compares_clean_and_still_locates_a_fault(tmp_path, kind):
    """reset_at_each_iter=True: the collector resets every env before each batch (and once in its constructor),
    cutting episodes short; the resets no batch brings are recorded as withheld, every batch's first observation
    as a reset. A clean run compares clean (it reported an obs difference at every env's first event before),
    and a float16 observation in the worker is still located."""
    d = str(tmp_path / "clean")
    trainer = trl_envs.run(kind, "serial", d, frames=40, total=120, reset_at_each_iter=True)
    report = compare(d, trainer)
    assert report.ok, str(report)
    assert _events(d) == _events(trainer)
    # per env: the constructor's reset, then 3 batches of 20 steps (10 for a worker's env, of 2 workers), each
    # starting with a reset; 25-step episodes never end within one batch
    steps = 20 if kind == "single" else 10
    with read(trainer) as led:
        for s in led.streams.values():
            kinds = s.columns["kind"][:]
            assert int((kinds == 0).sum()) == 4 and int((kinds == 1).sum()) == 3 * steps, kinds
    assert all(n == 1 for n in _withheld(trainer).values()), _withheld(trainer)

    d = str(tmp_path / "fault")
    record = str(tmp_path / "fault.json")
    make = trl_envs.Make()
    fns = ledger_env_fns(make, 2, d, wrap=inject_in_worker("obs:f16", at=25, target=1, record=record))
    c = LedgerCollector(trl_envs.collector("single", trl_envs.batched("serial", fns), 40, 120,
                                           reset_at_each_iter=True), d + "/trainer.npz", fns)
    list(c)
    c.shutdown()
    report = compare(d, c.ledger_path)
    assert not report.ok and sorted(report.by_env()) == [1], str(report)
    assert is_located(report.by_env()[1], read_record(record)), str(report)


def test_multi_async_collector_runs_a_batch_ahead_and_compare_says_the_trainer_stopped_early(tmp_path):
    """MultiAsyncCollector's workers collect the next batch while the trainer reads one: at shutdown the batch
    in flight never reaches the trainer. Both sides agree as far as the trainer went."""
    d = str(tmp_path)
    report = compare(d, trl_envs.run("multiasync", "serial", d, frames=40, total=160))
    assert not report.ok
    for diff in report.differences:
        assert diff.what == "length" and diff.trainer_events < diff.env_events, diff.line()
        assert "the trainer stream stops early" in diff.line()


def test_each_row_carries_its_env_index_and_the_batch_is_time_last(tmp_path):
    d = str(tmp_path)
    fns = ledger_env_fns(trl_envs.Make(), 3, d)
    c = LedgerCollector(trl_envs.collector("single", trl_envs.batched("serial", fns), 30, 30), d + "/trainer.npz", fns)
    batch = next(iter(c))
    assert tuple(batch.shape) == (3, 10)
    assert batch.get(INDEX_KEY)[..., 0].tolist() == [[i] * 10 for i in range(3)]
    c.shutdown()
    assert compare(d, c.ledger_path).ok


class _OwnStack:
    """A factory of one's own: GymWrapper(LedgerEnv(...)) with LedgerIndex as a transform, not LedgerEnvFn."""

    def __init__(self, directory, index):
        self.directory, self.index = directory, index

    def __call__(self):
        from torchrl.envs import GymWrapper, TransformedEnv

        from stepledger import LedgerEnv
        from stepledger.torchrl import LedgerIndex
        return TransformedEnv(GymWrapper(LedgerEnv(trl_envs.Make()(), self.directory, index=self.index)),
                              LedgerIndex(self.index))


@pytest.mark.parametrize("stack", ["ledger_env_fns", "LedgerIndex"])
def test_the_index_is_in_every_reset_and_step_from_the_wrapper_or_the_transform(tmp_path, stack):
    """ledger_env_fns's envs are LedgerGymWrapper (the index put by the wrapper itself: the transform's
    machinery cost 1.21x a ParallelEnv's throughput); LedgerIndex still does it for a stack of one's own."""
    from stepledger.torchrl import LedgerGymWrapper
    d = str(tmp_path)
    fns = ledger_env_fns(trl_envs.Make(), 2, d) if stack == "ledger_env_fns" else [_OwnStack(d, i) for i in range(2)]
    env = fns[0]()
    assert isinstance(env, LedgerGymWrapper) == (stack == "ledger_env_fns")
    assert env.observation_spec[INDEX_KEY].dtype == torch.int64
    assert env.reset().get(INDEX_KEY).tolist() == [0]
    assert env.rand_step().get(("next",) + INDEX_KEY).tolist() == [0]
    env.close()
    spaces = {} if stack == "ledger_env_fns" else dict(zip(("observation_space", "action_space"), (
        lambda e: (e.observation_space, e.action_space))(trl_envs.Make()())), num_envs=2)
    c = LedgerCollector(trl_envs.collector("single", trl_envs.batched("parallel", fns), 20, 60), d + "/trainer.npz",
                        fns if stack == "ledger_env_fns" else None, **spaces)
    batches = list(c)
    assert all(b.get(INDEX_KEY)[..., 0].tolist() == [[0] * 10, [1] * 10] for b in batches)
    assert all(b.get(("next",) + INDEX_KEY)[..., 0].tolist() == [[0] * 10, [1] * 10] for b in batches)
    c.shutdown()
    report = compare(d, c.ledger_path)
    assert report.ok and report.envs == [0, 1], str(report)


def test_compact_obs_withholds_every_final_observation_and_compares_clean(tmp_path):
    """compact_obs=True drops ("next", "observation"): a step's obs is the next root obs, and an ending step's
    final observation is withheld."""
    d = str(tmp_path)
    trainer = trl_envs.run("single", "serial", d, frames=30, total=150, make=trl_envs.Make(limit=7),
                           compact_obs=True)
    report = compare(d, trainer)
    assert report.ok, str(report)
    assert _events(d) == _events(trainer)
    held = _withheld(trainer)
    with read(trainer) as led:
        ends = {i: int(np.count_nonzero(s.columns["terminated"] | s.columns["truncated"])) for i, s in led.streams.items()}
    # every ending step, and the reset or step no batch brought at the end
    assert all(held[i] >= ends[i] >= 10 for i in held), (held, ends)


def _nan_final(batch):
    """What TorchRL's AutoResetTransform does: the ending step's ("next", "observation") filled with NaN."""
    done = batch.get(("next", "done"))
    obs = batch.get(("next", "observation")).clone()
    obs[done.expand_as(obs)] = float("nan")
    batch.set(("next", "observation"), obs)
    return batch


def test_a_nan_filled_final_observation_is_withheld_not_a_corrupted_one(tmp_path):
    d = str(tmp_path)
    trainer = trl_envs.run("single", "serial", d, frames=20, total=60, make=trl_envs.Make(limit=7),
                           postproc=_nan_final)
    report = compare(d, trainer)
    assert report.ok, str(report)
    assert sum(_withheld(trainer).values()) >= 8


def test_a_nan_observation_mid_episode_is_a_difference(tmp_path):
    def nan_mid(batch):
        obs = batch.get(("next", "observation")).clone()
        obs[:, 3] = float("nan")
        batch.set(("next", "observation"), obs)
        return batch
    d = str(tmp_path)
    report = compare(d, trl_envs.run("single", "serial", d, frames=20, total=40, postproc=nan_mid))
    for i, diff in report.by_env().items():
        assert (diff.episode, diff.step, diff.fields) == (0, 4, ("obs",)), diff.line()


def test_a_fault_in_a_parallel_env_worker_is_located(tmp_path):
    d = str(tmp_path)
    wrap = inject_in_worker("obs:f16", at=5, target=1, record=os.path.join(d, "fault.json"))
    fns = ledger_env_fns(trl_envs.Make(), 2, d, pass_index=True, wrap=wrap)
    c = LedgerCollector(trl_envs.collector("single", trl_envs.batched("parallel", fns), 20, 60), d + "/trainer.npz",
                        fns)
    for _ in c:
        pass
    c.shutdown()
    report = compare(d, c.ledger_path)
    diff, first = report.by_env()[1], read_record(os.path.join(d, "fault.json"))
    assert is_located(diff, first) and diff.fields == ("obs",), (first, diff.line())
    assert 0 not in report.by_env()


def test_torchrl_rounds_a_float64_reward_to_its_float32_reward_spec(tmp_path):
    """A real cast of torchrl 0.14.1: GymWrapper's reward spec is float32, and the spec's encode rounds the
    env's float64 reward; with float64 ledgers on both sides it is a reward difference at the first step."""
    d = str(tmp_path)
    fns = ledger_env_fns(trl_envs.Make(), 2, d, reward_dtype=np.float64)
    c = LedgerCollector(trl_envs.collector("single", trl_envs.batched("serial", fns), 20, 20), d + "/trainer.npz",
                        fns, reward_dtype=np.float64)
    batch = next(iter(c))
    assert batch.get(("next", "reward")).dtype == torch.float32
    c.shutdown()
    report = compare(d, c.ledger_path)
    for diff in report.differences:
        assert diff.fields == ("reward",) and (diff.episode, diff.step) == (0, 1), diff.line()
    assert len(report.differences) == 2


@pytest.mark.parametrize("vector", ["serial", "parallel"])
def test_set_seed_seeds_beneath_the_ledger_as_torchrl_seeds_without_it(tmp_path, vector):
    """TorchRL's env.set_seed resets each env with its seed (GymWrapper's reset(seed=...)), a reset whose
    observation no batch brings; LedgerGymWrapper makes that reset beneath the ledger: the run compares clean and
    its values are those of a run without ledgers seeded the same way."""
    from torchrl.envs import GymWrapper

    def collect(env, fns=None):
        env.set_seed(3)
        torch.manual_seed(0)
        c = trl_envs.collector("single", env, 20, 60)
        if fns is not None:
            c = LedgerCollector(c, os.path.join(fns[0].directory, "trainer.npz"), fns)
        seen = [b.get(("next", "observation")).clone() for b in c]
        c.shutdown()
        return seen, (c.ledger_path if fns is not None else None)

    fns = ledger_env_fns(trl_envs.Make(), 2, str(tmp_path / "a"))
    seen, trainer = collect(trl_envs.batched(vector, fns), fns)
    assert compare(fns[0].directory, trainer).ok
    plain, _ = collect(trl_envs.batched(vector, [lambda: GymWrapper(trl_envs.Make()())] * 2))
    assert len(seen) == 3 and all(torch.equal(a, b) for a, b in zip(seen, plain))


@pytest.mark.parametrize("wrapper", ["GymWrapper", "LedgerGymWrapper"])
def test_set_seed_through_a_plain_gymwrapper_is_a_reset_in_the_ledger(tmp_path, wrapper):
    """Around LedgerEnv, TorchRL's own GymWrapper seeds by a reset through the ledger (one the trainer never
    gets: docs/FINDINGS.md); LedgerGymWrapper seeds beneath it."""
    from torchrl.envs import GymWrapper

    from stepledger import LedgerEnv
    from stepledger.torchrl import LedgerGymWrapper, ledger_inside

    inner = LedgerEnv(trl_envs.Make()(), str(tmp_path), index=0)
    assert ledger_inside(inner) is inner and ledger_inside(inner.env) is None
    env = GymWrapper(inner) if wrapper == "GymWrapper" else LedgerGymWrapper(inner, 0)
    env.set_seed(0)
    env.rollout(3)
    env.close()
    with read(str(tmp_path)) as ledger:
        kinds = ledger.streams[0].columns["kind"][:]
    assert int((kinds == 0).sum()) == (2 if wrapper == "GymWrapper" else 1)
    assert int((kinds == 1).sum()) == 3


def test_bad_arguments_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="index must be"):
        LedgerEnvFn(trl_envs.Make(), str(tmp_path), -1)
    with pytest.raises(ValueError, match="num_envs"):
        ledger_env_fns(trl_envs.Make(), 0, str(tmp_path))
    fns = ledger_env_fns(trl_envs.Make(), 2, str(tmp_path))
    coll = trl_envs.collector("single", trl_envs.batched("serial", fns), 20, 20, split_trajs=True)
    try:
        with pytest.raises(ValueError, match="split_trajs"):
            LedgerCollector(coll, str(tmp_path / "trainer.npz"), fns)
        with pytest.raises(ValueError, match="env_fns"):
            LedgerCollector(coll, str(tmp_path / "trainer.npz"))
    finally:
        coll.shutdown()
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    coll = trl_envs.collector("single", trl_envs.batched("serial", fns), 20, 20,
                              replay_buffer=ReplayBuffer(storage=LazyTensorStorage(100)))
    try:  # the batches go into the buffer, and the collector hands out None
        with pytest.raises(ValueError, match=r"^LedgerCollector: this collector writes its batches into its "
                                             r"replay_buffer and hands out none"):
            LedgerCollector(coll, str(tmp_path / "trainer.npz"), fns)
    finally:
        coll.shutdown()
    for kind in ("single", "multisync"):  # the collector's own time limit: every cut would read as a difference
        env = trl_envs.batched("serial", fns) if kind == "single" else [trl_envs.batched("serial", fns)] * 2
        coll = trl_envs.collector(kind, env, 20, 20, max_frames_per_traj=10)
        try:
            with pytest.raises(ValueError, match=r"^LedgerCollector: max_frames_per_traj=10 ends episodes in the "
                                                 r"collector.*max_episode_steps=10"):
                LedgerCollector(coll, str(tmp_path / "trainer.npz"), fns)
        finally:
            coll.shutdown()


def test_stepledger_check_trainer_torchrl_runs_the_fault_matrix(tmp_path):
    out = subprocess.run([sys.executable, "-m", "stepledger", "check", "Pendulum-v1", "--trainer", "torchrl",
                          "--torchrl-vector", "serial", "--num-envs", "2", "--steps", "60",
                          "--faults", "obs:f16,final-obs:zero,reward:stale"],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 of 3 exercised faults caught and located" in out.stdout, out.stdout


@pytest.mark.parametrize("vector,how", [("serial", "ctrl-c"), ("parallel", "ctrl-c"), ("parallel", "kill-worker")])
def test_an_interrupted_run_ends_as_docs_endings_says(tmp_path, vector, how):
    """Ctrl-C to the process group, or SIGKILL to a ParallelEnv worker, in the middle of collecting: every ledger
    is on disk (a killed worker's as its spill), nothing is a difference, and the notes say how each ended."""
    import signal
    d = str(tmp_path)
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen([sys.executable, "-c", "import trl_harness as H; H.main(%r, 'wait', %r)" % (vector, d)],
                            cwd=here, stdout=subprocess.PIPE, text=True, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, here])))
    try:
        ready = proc.stdout.readline().split()
        assert ready and ready[0] == "ready", ready
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(int(ready[1]), signal.SIGKILL)
        assert proc.wait(timeout=120) != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert not report.differences, str(report)
    assert sorted(report.envs) == [0, 1]
    assert any("exited without close()" in n for n in report.notes), report.notes
    if how == "kill-worker":  # the killed worker's events, read from its mapped part (docs/ENDINGS.md)
        assert any("its process died, and every event it recorded is read" in n for n in report.notes), report.notes


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_frame_skip_outside_the_ledger_is_refused_and_repeat_action_inside_it_gives_the_same_values(tmp_path,
                                                                                                     env_id):
    """GymWrapper's frame_skip repeats the action outside LedgerEnv: the env ledger would hold k steps for each
    step a batch brings (TorchRL's own test_collector_env_reset builds GymEnv(..., frame_skip=4)). Gymnasium's
    RepeatAction does the same inside it: the same rollout, value for value (CartPole's episodes end within a
    repeat)."""
    if not hasattr(gym.wrappers, "RepeatAction"):
        pytest.skip("gymnasium %s has no RepeatAction (1.3 and later)" % gym.__version__)
    from torchrl.envs import GymWrapper

    from stepledger import LedgerEnv
    from stepledger.torchrl import LedgerGymWrapper

    make = trl_envs.Make(env_id, limit=30)
    with pytest.raises(ValueError, match=r"^LedgerGymWrapper: frame_skip=4 repeats each action 4 times outside.*"
                                         r"RepeatAction\(env, num_repeats=4\)"):
        LedgerGymWrapper(LedgerEnv(make(), str(tmp_path / "refused"), index=0), 0, frame_skip=4)

    def rollout(env):
        env.set_seed(1)
        torch.manual_seed(0)
        out = env.rollout(40, break_when_any_done=False)
        env.close()
        return out

    theirs = rollout(GymWrapper(make(), frame_skip=4))
    d = str(tmp_path / "ledger")
    ours = rollout(LedgerGymWrapper(LedgerEnv(gym.wrappers.RepeatAction(make(), num_repeats=4), d, index=0), 0))
    for key in ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "terminated"),
                ("next", "truncated")):
        assert torch.equal(theirs.get(key), ours.get(key)), key
    if env_id == "CartPole-v1":  # episodes end within a repeat: the early stop is exercised
        assert bool(theirs.get(("next", "done")).any())


def test_stepledger_check_trainer_torchrl_place_batched_runs_the_trainer_side_faults(tmp_path):
    out = subprocess.run([sys.executable, "-m", "stepledger", "check", "Pendulum-v1", "--trainer", "torchrl",
                          "--torchrl-vector", "serial", "--torchrl-place", "batched", "--num-envs", "2",
                          "--steps", "60", "--faults", "reward:zero,obs:swap"],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 of 2 exercised faults caught and located" in out.stdout, out.stdout
