"""Live mode per agent (issue 19): LedgerParallelEnv(live=True) under SuperSuit's SB3 and Gymnasium forms, a
fault on one agent raised at its copy, agent, episode and step, settings refused at the first token, and the
(env copy, agent) map of each vector slot checked from the tokens and from the ledgers."""

import os

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
ss = pytest.importorskip("supersuit")
simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")

from gymnasium import spaces  # noqa: E402
from pettingzoo.utils import BaseParallelWrapper  # noqa: E402

from parallel_envs import TogetherEnv  # noqa: E402
from stepledger import TrainerLedger, compare
from stepledger.format import schema as S  # noqa: E402
from stepledger.errors import SettingsError  # noqa: E402
from stepledger.recording.live import BoundaryFault  # noqa: E402
from stepledger.pettingzoo import (LedgerParallelEnv, LedgerSuperSuitVecEnv, index_supersuit_copies,  # noqa: E402
                                   slot_map)
from stepledger.sb3 import LedgerVecEnv  # noqa: E402

AGENTS = ["agent_0", "agent_1", "agent_2"]


class OneAgentFault(BaseParallelWrapper):
    """Between LedgerParallelEnv and SuperSuit: changes ``field`` of one agent of one env copy at one step
    (its episode and step as the env counts them)."""

    def __init__(self, env, copy, agent, episode, step, field):
        super().__init__(env)
        self.at, self.field = (copy, agent, episode, step), field
        self.episode, self.t = -1, 0

    def reset(self, seed=None, options=None):
        self.episode, self.t = self.episode + 1, 0
        return self.env.reset(seed=seed, options=options)

    def step(self, actions):
        obs, rewards, terms, truncs, infos = self.env.step(actions)
        self.t += 1
        copy, agent, episode, step = self.at
        if (self.env.index, self.episode, self.t) == (copy, episode, step):
            if self.field == "reward":
                rewards = dict(rewards, **{agent: rewards[agent] + 1.0})
            else:
                obs = dict(obs, **{agent: obs[agent] + np.float32(0.25)})
        return obs, rewards, terms, truncs, infos


def sb3_form(d, par_env, copies=2, **trainer):
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(par_env), copies, num_cpus=0,
                                 base_class="stable_baselines3")
    index_supersuit_copies(venv)
    return LedgerVecEnv(venv, os.path.join(d, "trainer.npz"), live=True, **trainer)


def gymnasium_form(d, par_env, copies=2, **trainer):
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(par_env), copies, num_cpus=0,
                                 base_class="gymnasium")
    return LedgerSuperSuitVecEnv(venv, os.path.join(d, "trainer.npz"), live=True, **trainer)


def drive(venv, steps, seed=0):
    """Random actions; returns the infos of every step (SB3's 4-tuple or Gymnasium's 5-tuple)."""
    rng = np.random.default_rng(seed)
    if isinstance(venv, LedgerVecEnv):
        venv.reset()
    else:
        venv.reset(seed=seed)
    seen = []
    for _ in range(steps):
        seen.append(venv.step(rng.integers(0, 3, venv.num_envs))[-1])
    return seen


@pytest.mark.parametrize("form", ["sb3", "gymnasium"])
def test_clean_live_run_across_episode_ends(tmp_path, form):
    """Episodes of 3, 4 and 5 steps: every autoreset merges the reset's info over the ending step's, and both
    tokens still reach the trainer side (nothing is raised), are taken out of the infos, and compare agrees."""
    d = str(tmp_path)
    make = sb3_form if form == "sb3" else gymnasium_form
    venv = make(d, LedgerParallelEnv(TogetherEnv(), d, live=True))
    for infos in drive(venv, 14):
        assert not any(key.startswith(S.TOKEN_KEY) for info in infos for key in info), infos
        assert all("terminal_observation" in info for info in infos) or not any(
            "terminal_observation" in info for info in infos)
    assert venv.live_faults == []
    assert venv.ledger._live.agents == AGENTS  # named by the env side's first tokens
    assert int(venv.ledger._rec.token_seen.sum()) == 6
    venv.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, report.lines()


def test_both_tokens_arrive_at_an_autoreset(tmp_path):
    """keep_tokens=True: the ending step's info carries the step's token and the reset's, each its own event."""
    from stepledger.recording.live import unpack_token
    d = str(tmp_path)
    venv = gymnasium_form(d, LedgerParallelEnv(TogetherEnv(), d, live=True), copies=1, keep_tokens=True)
    _, infos = venv.reset(seed=0)
    assert [unpack_token(i[S.RESET_TOKEN_KEY])[:2] for i in infos] == [(0, 0), (1, 0), (2, 0)]  # stream, counter
    assert all(S.SETTINGS_KEY in i for i in infos)
    for _ in range(3):
        infos = venv.step(np.zeros(3, dtype=np.int64))[-1]
    for k, info in enumerate(infos):  # episode 0 ended at step 3, and the copy was reset within that step
        step, reset = unpack_token(info[S.TOKEN_KEY]), unpack_token(info[S.RESET_TOKEN_KEY])
        assert (step[0], step[1], step[2], step[3], step[4]) == (k, 3, 0, 3, S.KIND_STEP)
        assert (reset[0], reset[1], reset[2], reset[3], reset[4]) == (k, 4, 1, 0, S.KIND_RESET)
    assert venv.live_faults == []
    venv.close()


@pytest.mark.parametrize("form", ["sb3", "gymnasium"])
@pytest.mark.parametrize("field, episode, step", [("reward", 0, 2), ("obs", 1, 4)])
def test_a_fault_on_one_agent_raises_at_its_copy_agent_and_step(tmp_path, form, field, episode, step):
    """One agent of one copy changed at one step (episode 1's step 4 is its ending step, whose info SuperSuit
    merges with the reset's): BoundaryFault names env copy 1, agent agent_2, that episode, step and field."""
    d = str(tmp_path)
    par_env = OneAgentFault(LedgerParallelEnv(TogetherEnv(), d, live=True), 1, "agent_2", episode, step, field)
    make = sb3_form if form == "sb3" else gymnasium_form
    venv = make(d, par_env)
    with pytest.raises(BoundaryFault) as caught:
        drive(venv, 12)
    fault = caught.value
    assert (fault.env, fault.copy, fault.agent, fault.episode, fault.step, fault.fields) == (
        5, 1, "agent_2", episode, step, (field,)), str(fault)
    line = "env 1, agent agent_2, episode %d, step %d: %s differs" % (episode, step, field)
    assert str(fault) == line + (" (env gave 0.5, trainer received 1.5)" if field == "reward" else ""), str(fault)
    assert len(venv.live_faults) == 1  # the other agents and the other copy are clean
    venv.close()


@pytest.mark.parametrize("form", ["sb3", "gymnasium"])
def test_worker_processes_a_fault_on_one_agent_and_nothing_else(tmp_path, form):
    """num_cpus=2: the tokens cross SuperSuit's pipes, and its reset's infos (each worker's compressed list,
    never laid out by slot) are laid out so that the first tokens and the settings are found; the one fault is
    named at its copy and agent, and no other slot has one."""
    d = str(tmp_path)
    par_env = OneAgentFault(LedgerParallelEnv(TogetherEnv(), d, live=True), 1, "agent_2", 1, 4, "reward")
    form_name = "stable_baselines3" if form == "sb3" else "gymnasium"
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(par_env), 4, num_cpus=2, base_class=form_name)
    index_supersuit_copies(venv)
    path = os.path.join(d, "trainer.npz")
    cls = LedgerVecEnv if form == "sb3" else LedgerSuperSuitVecEnv
    venv = cls(venv, path, live=True, on_fault="record")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no env's events arrive without tokens
        drive(venv, 12)
    try:
        assert venv.ledger._live.agents == AGENTS
        assert int(venv.ledger._rec.token_seen.sum()) == 12
        assert [(f.env, f.copy, f.agent, f.episode, f.step, f.fields) for f in venv.live_faults] == [
            (5, 1, "agent_2", 1, 4, ("reward",))], [str(f) for f in venv.live_faults]
    finally:
        venv.close()


@pytest.mark.parametrize("form", ["sb3", "gymnasium"])
def test_settings_that_differ_are_refused_at_the_first_token(tmp_path, form):
    d = str(tmp_path)
    make = sb3_form if form == "sb3" else gymnasium_form
    venv = make(d, LedgerParallelEnv(TogetherEnv(), d, reward_dtype=np.float64, live=True))
    with pytest.raises(SettingsError) as caught:
        drive(venv, 1)
    text = str(caught.value)
    assert "env 0, agent agent_0's LedgerParallelEnv(live=True) records with other settings than this ledger" in text
    assert 'different reward dtypes: env "float64", trainer "float32"' in text, text
    assert "\n" not in text
    venv.close()


# ------------------------------------------------------------------ the (env copy, agent) map of each slot

def test_slot_map_gives_streams_and_refuses_what_is_not_a_permutation():
    agent_major = [(c, a) for a in AGENTS for c in range(2)]  # slot j: agent j // 2 of copy j % 2
    assert slot_map(AGENTS, agent_major) == [0, 3, 1, 4, 2, 5]
    assert slot_map(AGENTS, [(i // 3, AGENTS[i % 3]) for i in range(6)]) == list(range(6))
    bad = [
        ([(0, "agent_0"), (0, "agent_0"), (0, "agent_2")], "slots 0 and 1 both carry env 0, agent agent_0"),
        ([(0, "agent_0"), (0, "agent_1"), (0, "agent_9")], "slot 2's agent 'agent_9' is not in possible_agents"),
        ([(0, "agent_0"), (0, "agent_1"), (1, "agent_2")], "no slot carries env 0, agent agent_2"),
        ([(0, "agent_0"), (0, "agent_1")], "2 slots are not a whole number of env copies of 3 agents"),
        ([(0, "agent_0"), (-1, "agent_1"), (0, "agent_2")], "slot 1's env copy -1 is not a non-negative integer"),
        ([(0, "agent_0"), 7, (0, "agent_2")], "give one (env copy, agent) pair per slot"),
    ]
    for slots, text in bad:
        with pytest.raises(ValueError) as caught:
            slot_map(AGENTS, slots)
        assert text in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
        assert str(caught.value).startswith("slot_map: slots=")


def test_trainer_side_refuses_streams_that_are_not_a_permutation(tmp_path):
    space = spaces.Box(-1, 1, (2,), np.float32)
    with pytest.raises(ValueError, match=r"streams=\[0, 0, 1\] is not a permutation of 0 .. 2"):
        TrainerLedger(str(tmp_path / "t.npz"), 3, space, spaces.Discrete(2), streams=[0, 0, 1])


class AgentMajor:
    """A vectoriser that orders its slots by agent, then copy (slot j: agent j // copies of copy j % copies),
    around SuperSuit's Gymnasium form; what a user's own vectoriser may do."""

    def __init__(self, venv, n_agents):
        self.venv, self.num_envs = venv, venv.num_envs
        self.observation_space, self.action_space = venv.observation_space, venv.action_space
        copies = venv.num_envs // n_agents
        self.order = np.array([(j % copies) * n_agents + j // copies for j in range(venv.num_envs)])
        self.inverse = np.argsort(self.order)

    def reset(self, seed=None, options=None):
        obs, infos = self.venv.reset(seed=seed, options=options)
        return obs[self.order], [infos[k] for k in self.order]

    def step(self, actions):
        obs, rewards, terms, truncs, infos = self.venv.step(np.asarray(actions)[self.inverse])
        o = self.order
        return obs[o], rewards[o], terms[o], truncs[o], [infos[k] for k in o]

    def close(self):
        self.venv.close()


def agent_major_run(d, live, streams=None, steps=8):
    env = LedgerParallelEnv(simple_spread_v3.parallel_env(N=3, max_cycles=5), d, live=live)
    inner = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 2, num_cpus=0, base_class="gymnasium")
    index_supersuit_copies(inner)
    venv = LedgerSuperSuitVecEnv(AgentMajor(inner, 3), os.path.join(d, "trainer.npz"), live=live,
                                 streams=streams)
    try:
        drive(venv, steps)
    finally:
        venv.close()
    return venv


def test_a_vectoriser_of_another_order_with_its_map_is_clean(tmp_path):
    d = str(tmp_path)
    streams = slot_map(AGENTS, [(c, a) for a in AGENTS for c in range(2)])
    venv = agent_major_run(d, True, streams)
    assert venv.live_faults == []
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, report.lines()


def test_live_tokens_name_the_slot_and_the_copy_and_agent_it_carries(tmp_path):
    """No map given: the first tokens name other (env copy, agent) pairs than SuperSuit's order, in one line."""
    d = str(tmp_path)
    with pytest.raises(BoundaryFault) as caught:
        agent_major_run(d, True)
    fault = caught.value
    assert (fault.env, fault.copy, fault.agent, fault.fields) == (1, 1, "agent_0", ("slot",))
    text = str(fault)
    assert text.startswith("the vector env's slots carry other (env copy, agent) pairs than the trainer side's "
                           "map says: slot 1 carries env 1, agent agent_0, not env 0, agent agent_1; slot 2 "
                           "carries env 0, agent agent_1, not env 0, agent agent_2; "), text
    assert text.endswith("give the trainer side its map: streams=stepledger.pettingzoo.slot_map(possible_agents, "
                         "slots)"), text
    assert "slot 0 " not in text and "slot 5 " not in text  # slots 0 and 5 are where SuperSuit has them


def test_compare_names_the_copy_and_agent_a_trainer_stream_holds(tmp_path):
    """Offline, with no map and no live check: one hint line says which (env copy, agent) each trainer stream
    really holds."""
    d = str(tmp_path)
    agent_major_run(d, False)
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert not report.ok
    hints = [line for line in report.lines() if line.startswith("hint: ") and "has the events of" in line]
    assert len(hints) == 1, report.lines()
    assert hints[0].startswith("hint: the trainer's env 0, agent agent_1 (stream 1) has the events of env 1, agent "
                               "agent_0; the trainer's env 0, agent agent_2 (stream 2) has the events of env 0, "
                               "agent agent_1; "), hints[0]
    assert "does the vector env order its slots as SuperSuit does" in hints[0]


def test_butterfly_cooperative_pong_runs_clean_live_across_time_limits(tmp_path):
    """A butterfly env (pygame-ce, in the [test] extra): cooperative_pong_v6's two paddles, 280x480x3 frames,
    two copies through SuperSuit's Gymnasium form over several time limits: the live check finds nothing and
    compare agrees."""
    pytest.importorskip("pygame", reason="pettingzoo's butterfly envs need pygame-ce (pip install pygame-ce)")
    import warnings
    from pettingzoo.butterfly import cooperative_pong_v6
    d = str(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pygame's and PettingZoo's own notices
        env = LedgerParallelEnv(cooperative_pong_v6.parallel_env(max_cycles=12), d, live=True)
        assert env.possible_agents == ["paddle_0", "paddle_1"]
        venv = gymnasium_form(d, env)
        ends = 0
        venv.reset(seed=0)
        rng = np.random.default_rng(0)
        for _ in range(30):
            _, _, terms, truncs, _ = venv.step(rng.integers(0, 3, venv.num_envs))
            ends += int(terms.sum() + truncs.sum())
        assert venv.live_faults == [] and venv.ledger._live.agents == ["paddle_0", "paddle_1"]
        venv.close()
    assert ends >= 8  # every slot went through at least two episode ends
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, report.lines()
    assert len(report.envs) == 4


class SwapFrom:
    """Around SuperSuit's Gymnasium form: from vector step ``at`` on, slots 1 and 2 trade everything they return
    (results mixed up on the way, after the first tokens came right)."""

    def __init__(self, venv, at):
        self.venv, self.at, self.t = venv, at, 0
        self.num_envs, self.observation_space, self.action_space = venv.num_envs, venv.observation_space, \
            venv.action_space

    def reset(self, seed=None, options=None):
        return self.venv.reset(seed=seed, options=options)

    def step(self, actions):
        out = self.venv.step(actions)
        self.t += 1
        if self.t < self.at:
            return out
        order = [0, 2, 1] + list(range(3, self.num_envs))
        obs, rewards, terms, truncs, infos = out
        return obs[order], rewards[order], terms[order], truncs[order], [infos[k] for k in order]

    def close(self):
        self.venv.close()


def test_streams_mixed_up_mid_run_are_named_by_copy_and_agent(tmp_path):
    d = str(tmp_path)
    inner = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(LedgerParallelEnv(TogetherEnv(), d, live=True)), 2,
                                  num_cpus=0, base_class="gymnasium")
    index_supersuit_copies(inner)
    venv = LedgerSuperSuitVecEnv(SwapFrom(inner, 2), os.path.join(d, "trainer.npz"), live=True)
    with pytest.raises(BoundaryFault) as caught:
        drive(venv, 4)
    fault = caught.value
    assert str(fault) == ("env 0, agent agent_1: received the live token of env 0, agent agent_2 (episode 0, step 2): "
                          "envs are mixed up on the way"), str(fault)
    assert (fault.env, fault.copy, fault.agent, fault.fields) == (1, 0, "agent_1", ("env",))
    venv.close()
