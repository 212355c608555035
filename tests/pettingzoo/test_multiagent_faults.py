"""The multi-agent fault kit (stepledger.faults.FaultyParallelEnv, outside LedgerParallelEnv) and its detection
matrix under SuperSuit's two vector env forms, in-process and with num_cpus=2 (issue 19): every fault is caught and
located at its env copy, agent, episode, step and field; the streams it never touched compare clean."""

import functools
import os
import re

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
pytest.importorskip("stable_baselines3")
ss = pytest.importorskip("supersuit")
simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")

from pettingzoo.utils import BaseParallelWrapper  # noqa: E402

from parallel_envs import LeavesApart  # noqa: E402
from stepledger import read  # noqa: E402
from stepledger.check import SB3_FORM_BLIND, is_located, supersuit_rollout  # noqa: E402
from stepledger.faults import AGENT_FAULTS, MULTIAGENT_FAULTS, FaultEngine, FaultyParallelEnv  # noqa: E402
from stepledger.pettingzoo import LedgerParallelEnv  # noqa: E402

COPIES, AGENTS, STEPS = 2, ("agent_0", "agent_1", "agent_2"), 12
FORMS = [("gymnasium", 0), ("gymnasium", 2), ("sb3", 0), ("sb3", 2)]


class TerminatingSpread(BaseParallelWrapper):
    """mpe2 simple_spread whose time limit is a termination: SuperSuit's SB3 form tells every end as a
    termination, so only on such an env does its clean run compare clean."""

    def step(self, actions):
        obs, rewards, terms, truncs, infos = self.env.step(actions)
        return obs, rewards, {a: terms[a] or truncs[a] for a in terms}, {a: False for a in truncs}, infos


def spread(max_cycles=4, continuous=False, terminating=False):
    env = simple_spread_v3.parallel_env(N=3, max_cycles=max_cycles, continuous_actions=continuous)
    return TerminatingSpread(env) if terminating else env


def env_for(fault, form):
    if fault == "agent:pad":
        return LeavesApart
    return functools.partial(spread, 4, fault in ("action:f16", "action:clip"),
                             form == "sb3" or fault == "terminated:as-trunc")


MATRIX = [(form, cpus, fault) for form, cpus in FORMS for fault in MULTIAGENT_FAULTS
          if not (form == "sb3" and fault in SB3_FORM_BLIND)]


@pytest.mark.parametrize("form,cpus", FORMS)
def test_clean_control_and_every_copys_ledger(tmp_path, form, cpus):
    """With num_cpus=2 the env ledgers are written in SuperSuit's workers, by their exit handlers (SuperSuit's
    close() never reaches the envs): each copy's is there, with its copy's streams, and compares clean."""
    report, injected = supersuit_rollout(functools.partial(spread, 4, False, form == "sb3"), form, COPIES, cpus,
                                         STEPS, str(tmp_path))
    assert report.ok, str(report)
    assert len(report.envs) == COPIES * len(AGENTS) and not injected
    for c in range(COPIES):
        with read(str(tmp_path / ("env-%d.npz" % c))) as led:
            assert sorted(led.streams) == [3 * c, 3 * c + 1, 3 * c + 2]
            assert all(len(led.streams[s]) == STEPS + STEPS // 4 + 1 for s in led.streams)  # 12 steps, 4 resets


@pytest.mark.parametrize("form,cpus,fault", MATRIX)
def test_fault_is_caught_and_located(tmp_path, form, cpus, fault):
    # agent:pad needs an agent that leaves while the others go on, which SuperSuit vectorises only while every
    # such leave is padded (test_an_agent_that_leaves_apart_needs_padding): there it takes every opportunity
    dose = "all" if fault == "agent:pad" else "one"
    report, injected = supersuit_rollout(env_for(fault, form), form, COPIES, cpus, STEPS, str(tmp_path), fault,
                                         target=1, agent="agent_1", at=2, dose=dose)
    assert injected, "the fault was never injected: no opportunity in this rollout"
    if dose == "one":
        assert list(injected) == [4]  # env copy 1's agent_1: SuperSuit's vector slot 1 * 3 + 1
    by = report.by_env()
    for stream, first in injected.items():
        assert (first["env"], first["agent"]) == (stream // 3, AGENTS[stream % 3])
        d = by.get(stream)
        assert d is not None, "stream %d was hit (%s) but compare found no difference:\n%s" % (stream, first, report)
        assert is_located(d, first), "stream %d hit at %s, compare said: %s" % (stream, first, d.line())
        assert d.line().startswith("env %d, agent %s, episode %d, step %d: " % (
            first["env"], first["agent"], first["episode"], first["step"])), d.line()
    for stream in set(range(COPIES * len(AGENTS))) - set(injected):  # the streams it never touched compare clean
        assert stream not in by, by[stream].line()


@pytest.mark.parametrize("fault", SB3_FORM_BLIND)
def test_sb3_form_cannot_show_a_fault_that_trades_termination_and_truncation(tmp_path, fault):
    """SuperSuit's SB3 wrapper tells every end as a termination (dones, no TimeLimit.truncated): a fault that
    trades the two reaches it and is erased there, and the trainer receives what it receives on a clean run."""
    terminating = fault == "terminated:as-trunc"
    report, injected = supersuit_rollout(functools.partial(spread, 4, False, terminating), "sb3", COPIES, 0, STEPS,
                                         str(tmp_path), fault, target=1, agent="agent_1", at=2)
    assert list(injected) == [4]  # it was injected
    by = report.by_env()
    if terminating:
        assert report.ok, str(report)  # erased: nothing to see
    else:  # every stream, the faulty one too, shows SuperSuit's own truncation-as-termination at the time limit
        assert sorted(by) == list(range(6)) and {(d.episode, d.step) for d in by.values()} == {(0, 4)}


def test_an_agent_that_leaves_apart_needs_padding(tmp_path):
    """Without black_death_v3 (or agent:pad), SuperSuit's vectorisation refuses an agent that leaves before the
    others: agent:pad has its opportunity only where SuperSuit would otherwise fail."""
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(LeavesApart()), 1, num_cpus=0,
                                 base_class="gymnasium")
    venv.reset()
    venv.step(np.zeros(3, dtype=np.int64))
    with pytest.raises(AssertionError, match="varying numbers of active agents unless black_death"):
        venv.step(np.zeros(3, dtype=np.int64))  # agent_1 leaves at step 2
    venv.close()


def test_pad_reports_the_untold_end_and_the_padded_steps(tmp_path):
    report, injected = supersuit_rollout(LeavesApart, "gymnasium", 1, 0, 5, str(tmp_path), "agent:pad",
                                         agent="agent_1", at=0)
    assert injected[1]["fields"] == ["terminated"] and (injected[1]["episode"], injected[1]["step"]) == (0, 2)
    d = report.by_env()[1]
    assert d.untold == ("terminated", 3), d.line()  # steps 3, 4 and 5 of the others: padded, never taken


def test_final_obs_reset_is_the_obs_the_agent_is_reset_with(tmp_path):
    """final-obs:reset makes the reset that follows an end at the end itself (as SuperSuit would next, with no
    seed) and gives the agent its reset obs as its final obs; the env ledger records one reset, as clean."""
    d = str(tmp_path)
    env = FaultyParallelEnv(LedgerParallelEnv(spread(3), d, index=0), "final-obs:reset", agent="agent_2", at=0)
    env.reset(seed=1)
    for _ in range(2):
        env.step({a: 0 for a in env.agents})
    obs, _, _, truncs, _ = env.step({a: 0 for a in env.agents})
    assert all(truncs.values())
    reset_obs, _ = env.reset()
    np.testing.assert_array_equal(obs["agent_2"], reset_obs["agent_2"])
    assert not np.array_equal(obs["agent_1"], reset_obs["agent_1"])
    assert env.first == {"env": 0, "episode": 0, "step": 3, "fault": "final-obs:reset", "field": "obs",
                         "agent": "agent_2", "stream": 2}
    env.close()
    with read(os.path.join(d, "env-0.npz")) as led:
        assert led.streams[2].columns["kind"].tolist() == [0, 1, 1, 1, 0]


def test_reward_drop_leaves_the_reward_out(tmp_path):
    env = FaultyParallelEnv(LedgerParallelEnv(spread(), str(tmp_path), index=3), "reward:drop", agent="agent_0", at=1,
                            target=3)
    env.reset(seed=0)
    _, rewards, _, _, _ = env.step({a: 1 for a in env.agents})
    assert sorted(rewards) == list(AGENTS)
    _, rewards, _, _, _ = env.step({a: 1 for a in env.agents})
    assert sorted(rewards) == ["agent_1", "agent_2"]
    assert (env.first["env"], env.first["agent"], env.first["stream"], env.first["step"]) == (3, "agent_0", 9, 2)


def test_engine_agent_faults_replace_the_whole_event():
    engine = FaultEngine("agent:swap", target=0, at=0, target_agent="b", allowed=MULTIAGENT_FAULTS)
    engine.where.agents = ["a", "b"]
    engine.reset(0, np.zeros(2), agent="b")
    mine, theirs = (np.ones(2), 1.0, False, False), (np.full(2, 2.0), 1.0, False, False)
    out = engine.step(0, *mine, other=theirs, agent="b")
    assert out is not mine and np.array_equal(out[0], theirs[0])
    assert engine.first == {"env": 0, "episode": 0, "step": 1, "fault": "agent:swap", "field": "obs", "agent": "b",
                            "stream": 1, "fields": ["obs"]}
    assert set(AGENT_FAULTS) <= set(MULTIAGENT_FAULTS)
    assert not {"step:fill", "truncated:drop", "terminated:drop"} & set(MULTIAGENT_FAULTS)


# ---------------------------------------------------------------- stepledger check on a parallel env

def _check(capsys, *args):
    from stepledger.cli.main import main
    code = main(["check", "mpe2.simple_spread_v3", "--trainer", "supersuit", "--num-envs", "2"] + list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_check_a_parallel_env_catches_and_locates_each_fault(capsys):
    code, out, _ = _check(capsys, "--steps", "10", "--max-episode-steps", "10", "--agent", "agent_1",
                          "--faults", "reward:drop,final-obs:reset,agent:swap")
    assert code == 0, out
    assert "final-obs:reset        caught and located  (injected at env 1, agent agent_1, episode 0, step 10)" in out
    assert out.rstrip().endswith("3 of 3 exercised faults caught and located; the boundary is checked")


def test_check_a_parallel_env_says_how_many_steps_it_needs(capsys):
    code, out, _ = _check(capsys, "--steps", "8", "--max-episode-steps", "10", "--faults", "obs:zero,final-obs:zero")
    assert code == 1
    assert ("final-obs:zero         not exercised (the rollout is too short: no episode of env 1, agent agent_2 "
            "ended in its 8 steps, and its time limit is 10)") in out
    assert "it needs at least 10 (--steps 10)" in out
    code, out, _ = _check(capsys, "--steps", "10", "--max-episode-steps", "10", "--faults", "obs:zero,final-obs:zero")
    assert code == 0, out  # as many as it said


def test_check_a_parallel_env_under_sb3_form_lists_what_it_cannot_show(capsys):
    """On simple_spread (episodes end by time limit) the SB3 form's clean run differs: SuperSuit's finding."""
    code, out, _ = _check(capsys, "--steps", "6", "--max-episode-steps", "5", "--form", "sb3", "--faults",
                          "obs:zero,terminated:as-trunc")
    assert code == 1
    assert out.startswith("clean run: DIFFERS\n") and "hint: truncation arrived as termination" in out
    assert "terminated:as-trunc    not exercised (SuperSuit's SB3 wrapper tells the trainer every end as a " in out


@pytest.mark.parametrize("args,message", [
    (["mpe2.no_such_env_v0"], "cannot make parallel env 'mpe2.no_such_env_v0': No module named 'mpe2.no_such_env_v0'"),
    (["gymnasium"], "cannot make parallel env 'gymnasium': it has no parallel_env()"),
    (["mpe2.simple_spread_v3", "--agent", "agent_7"], "agent 'agent_7' is not one of possible_agents"),
    (["mpe2.simple_spread_v3", "--faults", "step:fill"], "--faults: unknown or unsupported fault 'step:fill'"),
    (["mpe2.simple_spread_v3", "--num-cpus", "-1"], "num_cpus must be an int of at least 0, got -1"),
])
def test_check_a_parallel_env_refuses_bad_input_in_one_line(capsys, args, message):
    from stepledger.cli.main import main
    code = main(["check"] + args[:1] + ["--trainer", "supersuit"] + args[1:])
    out, err = capsys.readouterr()
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------- env ledgers in SuperSuit's worker processes

def test_index_reaches_each_worker_with_uneven_copies(tmp_path):
    """3 copies on 2 workers (2 and 1): each worker numbers its copies from the first vector slot it was given."""
    from stepledger import compare
    from stepledger.pettingzoo import index_supersuit_copies
    from stepledger.sb3 import LedgerVecEnv
    d = str(tmp_path)
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(LedgerParallelEnv(spread(5, terminating=True), d)),
                                 3, num_cpus=2, base_class="stable_baselines3")
    try:  # a vector env of SuperSuit's workers left open would hang the test process at exit
        assert index_supersuit_copies(venv) == 2  # worker processes
        venv = LedgerVecEnv(venv, os.path.join(d, "trainer.npz"))
        venv.reset()
        for _ in range(7):
            venv.step(np.zeros(9, dtype=np.int64))
    finally:
        venv.close()
    for c in range(3):
        with read(os.path.join(d, "env-%d.npz" % c)) as led:
            assert sorted(led.streams) == [3 * c, 3 * c + 1, 3 * c + 2]
    assert compare(d, os.path.join(d, "trainer.npz")).ok


def test_a_worker_copy_without_its_index_is_refused_at_reset(tmp_path):
    """SuperSuit's SB3 form gives no copy its index: without index_supersuit_copies the first reset fails in the
    workers, and the error reaches the trainer's process."""
    from stepledger import LedgerError
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(LedgerParallelEnv(spread(), str(tmp_path))), 2,
                                 num_cpus=2, base_class="stable_baselines3")
    try:
        with pytest.raises(LedgerError, match="no index: give index= or call set_index"):
            venv.reset()
    finally:
        venv.close()


def test_indexing_workers_without_ledgers(tmp_path):
    from stepledger import LedgerError
    from stepledger.pettingzoo import LedgerSuperSuitVecEnv, index_supersuit_copies

    def bare():
        return ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(spread()), 2, num_cpus=2, base_class="gymnasium")
    venv = bare()
    try:
        with pytest.raises(LedgerError, match="holds no LedgerParallelEnv"):
            index_supersuit_copies(venv)
    finally:
        venv.close()
    venv = bare()
    try:
        venv = LedgerSuperSuitVecEnv(venv, str(tmp_path / "trainer.npz"))  # nothing to index: it goes on
        venv.reset(seed=0)
        venv.step(np.zeros(6, dtype=np.int64))
    finally:
        venv.close()
    with pytest.raises(LedgerError, match="is not one of SuperSuit's vector envs"):
        index_supersuit_copies(object())


SCRIPT = r"""
import multiprocessing.util, os, sys, time
import numpy as np, supersuit as ss
from mpe2 import simple_spread_v3
from pettingzoo.utils import BaseParallelWrapper
from stepledger.pettingzoo import LedgerParallelEnv, LedgerSuperSuitVecEnv

class SlowExit(BaseParallelWrapper):  # its worker's exit takes 5 s before the ledgers are written
    def reset(self, seed=None, options=None):
        multiprocessing.util.Finalize(None, time.sleep, args=(5,), exitpriority=200)
        return self.env.reset(seed=seed, options=options)

d, ending = sys.argv[1], sys.argv[2]
env = LedgerParallelEnv(simple_spread_v3.parallel_env(N=3, max_cycles=4), d, flush_interval=1.0)
env = SlowExit(env) if ending == "slow-exit" else env
venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 2, num_cpus=2, base_class="gymnasium")
venv = LedgerSuperSuitVecEnv(venv, os.path.join(d, "trainer.npz"), flush_interval=0.2)
venv.reset(seed=0)
for t in range(20):
    venv.step(np.zeros(6, dtype=np.int64))
    time.sleep(0.03)
time.sleep(1.1)
for t in range(4):  # the first of these spills every env's events (its interval is past), the last 3 stay in memory
    venv.step(np.zeros(6, dtype=np.int64))  # unless an idle spill comes before the kill
print("ready", *[p.pid for p in venv.venv.procs], flush=True)
if ending == "slow-exit":
    venv.venv.graceful_shutdown_timeout = 0  # SuperSuit's default is 10 s: killed at once, before any idle spill
    venv.close()
    print("closed", flush=True)
"""


def _script(tmp_path, ending):
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path), ending], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)


def _gone(pids, timeout):
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(os.path.exists("/proc/%d" % p) and open("/proc/%d/stat" % p).read().split()[2] != "Z"
                   for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_a_script_that_ends_without_close_hangs_and_its_ledgers_survive(tmp_path):
    """With num_cpus > 1, a script that ends without venv.close() never exits: multiprocessing joins SuperSuit's
    workers (not daemonic) at exit, and they wait on their pipes. The trainer ledger is written at exit before
    that wait; the env ledgers when the workers end: a SIGTERM to the trainer's process closes its pipe ends,
    and each worker leaves through its exit handler, writing its copies' ledgers."""
    import signal
    import subprocess
    import time

    from stepledger import compare
    from ending_harness import reap
    proc = _script(tmp_path, "no-close")
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready"), proc.stderr.read()[-3000:]
        pids = [int(p) for p in line.split()[1:]]
        deadline = time.monotonic() + 60
        while not (tmp_path / "trainer.npz").exists():  # written at exit, however busy the machine
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
            time.sleep(0.05)
        time.sleep(1)
        assert proc.poll() is None  # and then it hangs
        assert not (tmp_path / "env-0.npz").exists()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        assert _gone(pids, 60)
    except subprocess.TimeoutExpired:
        pytest.fail("the script did not end on SIGTERM")
    finally:
        reap(proc)
    report = compare(str(tmp_path), str(tmp_path / "trainer.npz"))
    assert report.ok, str(report)
    assert len(report.envs) == 6


def test_supersuit_close_kills_a_worker_still_writing(tmp_path):
    """What no mechanism catches: SuperSuit's close() SIGKILLs every worker still alive graceful_shutdown_timeout
    seconds (10 by default) after it sent ("close", None). A worker whose exit takes longer (here a 5 s exit
    handler of the env's, and a timeout of 0; in real runs a large final write or an upload at exit) never writes
    its final files: its copies' ledgers are read from their spill segments and then their mapped part, which
    holds what had not been spilled yet (issue 30: before it, compare said how many events each copy lost)."""
    import subprocess

    from stepledger import compare
    from ending_harness import reap
    proc = _script(tmp_path, "slow-exit")
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the script did not end")
    finally:
        reap(proc)
    assert "closed" in out, err[-3000:]
    assert not (tmp_path / "env-0.npz").exists() and not (tmp_path / "env-1.npz").exists()
    assert (tmp_path / "env-0.npz.spill").is_dir()  # what the periodic spills wrote before the kill
    report = compare(str(tmp_path), str(tmp_path / "trainer.npz"))
    assert report.ok, str(report)  # what both sides have agrees: a run that ended badly, not a boundary fault
    text = str(report)
    assert "records end at different points" not in text, text  # no copy lost an event
    assert len(text.splitlines()) == 2, text
    assert re.fullmatch(r"\S+: env-0\.npz, env-1\.npz its process died, and every event it recorded is read \(\d+ "
                        r"from its mapped part\)", text.splitlines()[-1]), text


START_SCRIPT = r"""
import multiprocessing, os, sys
import numpy as np, supersuit as ss
from mpe2 import simple_spread_v3
from stepledger.pettingzoo import LedgerParallelEnv, LedgerSuperSuitVecEnv
if __name__ == "__main__":
    multiprocessing.set_start_method(sys.argv[2])
    d = sys.argv[1]
    env = LedgerParallelEnv(simple_spread_v3.parallel_env(max_cycles=4), d)
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 3, num_cpus=2, base_class="gymnasium")
    try:
        venv = LedgerSuperSuitVecEnv(venv, os.path.join(d, "trainer.npz"))
        venv.reset(seed=0)
        for _ in range(6):
            venv.step(np.zeros(9, dtype=np.int64))
    finally:
        venv.close()
"""


def test_workers_started_without_fork_index_their_own_copies(tmp_path, method="forkserver"):
    """A worker started by forkserver (Python 3.14's default on Linux; spawn alike) first loads the env the copies
    are made from, with SuperSuit's constructor: its copies are the ones loaded after it, and get 0, 1 and 2."""
    import subprocess
    import sys

    from stepledger import compare
    script = tmp_path / "run.py"
    script.write_text(START_SCRIPT)
    d = tmp_path / "ledger"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script), str(d), method], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for c in range(3):
        with read(str(d / ("env-%d.npz" % c))) as led:
            assert sorted(led.streams) == [3 * c, 3 * c + 1, 3 * c + 2]
    assert compare(str(d), str(d / "trainer.npz")).ok
