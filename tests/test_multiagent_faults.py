"""The multi-agent fault kit (stepledger.faults.FaultyParallelEnv, outside LedgerParallelEnv) and its detection
matrix under SuperSuit's two vector env forms, in-process and with num_cpus=2 (issue 19): every fault is caught and
located at its env copy, agent, episode, step and field; the streams it never touched compare clean."""

import functools
import os

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
pytest.importorskip("stable_baselines3")
ss = pytest.importorskip("supersuit")
simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")

from gymnasium import spaces  # noqa: E402
from pettingzoo import ParallelEnv  # noqa: E402
from pettingzoo.utils import BaseParallelWrapper  # noqa: E402

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


class LeavesApart(ParallelEnv):
    """agent_1 terminates after 2 steps while agent_0 and agent_2 go on until they terminate after 5."""
    metadata = {"name": "leaves_apart_v0"}
    render_mode = None

    def __init__(self):
        self.possible_agents = list(AGENTS)
        self._space = spaces.Box(-10.0, 10.0, (2,), np.float32)

    def observation_space(self, agent):
        return self._space

    def action_space(self, agent):
        return spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def _obs(self, agent):
        return np.array([self.possible_agents.index(agent) + 1, self.t], np.float32)

    def step(self, actions):
        self.t += 1
        live = list(self.agents)
        terms = {a: a == "agent_1" and self.t == 2 or self.t == 5 for a in live}
        truncs = {a: False for a in live}
        self.agents = [a for a in live if not (terms[a] or truncs[a])]
        return ({a: self._obs(a) for a in live}, {a: 1.0 + float(actions[a]) for a in live}, terms, truncs,
                {a: {} for a in live})


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


def test_reward_drop_leaves_the_reward_out():
    env = FaultyParallelEnv(LedgerParallelEnv(spread(), "unused", index=3), "reward:drop", agent="agent_0", at=1,
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
