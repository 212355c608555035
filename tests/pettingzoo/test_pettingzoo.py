"""The multi-agent env side: LedgerParallelEnv around PettingZoo parallel envs, with SuperSuit's vector envs
and the SB3 trainer side (issue 19, first part)."""

import gc
import warnings
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
ss = pytest.importorskip("supersuit")
simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")


from pettingzoo.utils import BaseParallelWrapper  # noqa: E402

import stepledger  # noqa: E402
from parallel_envs import LeavingEnv, TwoLeaveApart  # noqa: E402
from side_venv import hiding  # noqa: E402
from stepledger import LedgerError, compare, read  # noqa: E402
from stepledger.format import schema as S  # noqa: E402
from stepledger.pettingzoo import PETTINGZOO_NEEDS, LedgerParallelEnv, agent_streams, index_supersuit_copies  # noqa: E402,E501
from stepledger.sb3 import LedgerVecEnv  # noqa: E402


def supersuit_run(d, max_cycles, steps, copies=2, continuous=False):
    env = LedgerParallelEnv(simple_spread_v3.parallel_env(N=3, max_cycles=max_cycles,
                                                          continuous_actions=continuous), d)
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), copies, num_cpus=0,
                                 base_class="stable_baselines3")
    assert index_supersuit_copies(venv) == copies
    venv = LedgerVecEnv(venv, os.path.join(d, "trainer.npz"))
    venv.reset()
    space = venv.action_space
    space.seed(0)
    for _ in range(steps):
        venv.step(np.array([space.sample() for _ in range(venv.num_envs)]))
    venv.close()
    return compare(d, os.path.join(d, "trainer.npz"))


def test_a_run_in_progress_is_told_by_its_copies_files(tmp_path):
    """The line on env ledgers still being written names each copy's file once (env-0.npz holds agents 0-2)."""
    d = str(tmp_path)
    env = LedgerParallelEnv(simple_spread_v3.parallel_env(N=3, max_cycles=10), d)
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 2, num_cpus=0, base_class="stable_baselines3")
    index_supersuit_copies(venv)
    venv = LedgerVecEnv(venv, os.path.join(d, "trainer.npz"))
    venv.reset()
    for _ in range(7):
        venv.step(np.zeros(6, np.int64))
    copies = [c for c in gc.get_objects() if isinstance(c, LedgerParallelEnv)]  # the pickled copies, in-process
    assert len(copies) >= 2
    for copy in copies:
        copy.flush()
    venv.ledger.flush()
    try:
        report = compare(d, os.path.join(d, "trainer.npz"))
        assert report.ok, str(report)
        assert "%s: env-0.npz, env-1.npz in progress" % d in report.notes, report.notes
    finally:
        venv.close()


@pytest.mark.parametrize("continuous", [False, True])
def test_supersuit_sb3_compares_clean_within_an_episode(tmp_path, continuous):
    report = supersuit_run(str(tmp_path), max_cycles=25, steps=12, continuous=continuous)
    assert report.ok, report.lines()
    assert len(report.envs) == 6  # 2 copies x 3 agents: one stream each
    for c in range(2):
        with read(str(tmp_path / ("env-%d.npz" % c))) as led:
            assert sorted(led.streams) == [3 * c, 3 * c + 1, 3 * c + 2]
            assert led.meta[S.META_POSSIBLE_AGENTS] == ["agent_0", "agent_1", "agent_2"]
            assert all(len(led.streams[s]) == 13 for s in led.streams)  # the reset and 12 steps


def test_supersuit_sb3_turns_every_truncation_into_a_termination(tmp_path):
    """SuperSuit's SB3 wrapper never sets TimeLimit.truncated (PettingZoo issue 1126): at the time limit
    (max_cycles=5) every agent's trainer stream has terminated where the env gave truncated."""
    report = supersuit_run(str(tmp_path), max_cycles=5, steps=12)
    assert sorted(d.env for d in report.differences) == list(range(6))
    for diff in report.differences:
        assert (diff.episode, diff.step, diff.fields) == (0, 5, ("terminated", "truncated")), report.lines()
    lines = report.lines()
    # the report names the env copy and the agent of each stream (stream 4 is copy 1's agent_1)
    assert lines[4].startswith("env 1, agent agent_1, episode 0, step 5: terminated, truncated differ "
                               "(terminated: env gave False, trainer received True; truncated: env gave True, "
                               "trainer received False)"), lines
    assert "agents that differ: agent_0 (env 0, 1); agent_1 (env 0, 1); agent_2 (env 0, 1)" in lines
    assert lines[-1].startswith("hint: truncation arrived as termination: "), lines
    as_json = report.to_dict()["differences"][4]
    assert (as_json["env"], as_json["env_copy"], as_json["agent"]) == (4, 1, "agent_1")


def test_streams_are_supersuits_vector_slots():
    assert agent_streams(2, ["a", "b", "c"]) == {"a": 6, "b": 7, "c": 8}


def test_agents_that_leave_and_join(tmp_path):
    env = LedgerParallelEnv(LeavingEnv(), str(tmp_path), index=1)
    env.reset()
    for _ in range(4):
        env.step({a: 1 for a in env.agents})
    env.close()
    with read(env.ledger_path) as led:
        kinds = {s: led.streams[s].columns["kind"].tolist() for s in led.streams}
        ends = {s: (led.streams[s].columns["terminated"].tolist(), led.streams[s].columns["truncated"].tolist())
                for s in led.streams}
    assert kinds[3] == [0, 1, 1, 1, 1]            # agent_0: reset, 4 steps, truncated at the last
    assert ends[3][1] == [False, False, False, False, True]
    assert kinds[4] == [0, 1, 1]                  # agent_1: reset, 2 steps, terminated, nothing after
    assert ends[4][0] == [False, False, True]
    assert kinds[5] == [0, 1, 1, 1]               # agent_2: joined with its first obs (a reset), then stepped


def test_an_env_copy_linked_to_a_run_carries_its_id_and_names_its_streams_agents(tmp_path):
    """AgentLedger.link (what stepledger.rllib's multi-agent env calls): the file carries the run's id; before an
    index there is no ledger to link, and nothing happens."""
    env = LedgerParallelEnv(LeavingEnv(), str(tmp_path))
    env.link("run-before-its-index")  # no ledger yet: nothing
    env.set_index(1)
    assert env.stream_agents == list(LeavingEnv().possible_agents)
    env.link("run-abc")
    env.reset()
    env.step({a: 1 for a in env.agents})
    env.close()
    with read(env.ledger_path) as led:
        assert led.meta[S.META_RUN] == "run-abc"
        assert sorted(led.streams) == sorted(agent_streams(1, env.stream_agents).values())


def test_no_index_is_refused_at_the_first_reset(tmp_path):
    env = LedgerParallelEnv(LeavingEnv(), str(tmp_path))
    with pytest.raises(LedgerError, match="no index: give index= or call set_index"):
        env.reset()
    env.set_index(0)
    env.set_index(0)  # the same again: nothing
    with pytest.raises(LedgerError, match="index 0 already; it cannot become 1"):
        env.set_index(1)
    env.close()


def test_agents_of_different_spaces_are_refused(tmp_path):
    from mpe2 import simple_adversary_v3
    with pytest.raises(LedgerError, match="have different observation spaces.*pad_observations_v0"):
        LedgerParallelEnv(simple_adversary_v3.parallel_env(), str(tmp_path), index=0)


def test_a_directory_that_looks_like_a_file_is_refused(tmp_path):
    with pytest.raises(LedgerError, match="looks like a ledger file"):
        LedgerParallelEnv(LeavingEnv(), str(tmp_path / "env-0.npz"), index=0)


def test_index_supersuit_copies_refuses_without_ledgers(tmp_path):
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(simple_spread_v3.parallel_env(N=2)), 2,
                                 num_cpus=0, base_class="stable_baselines3")
    with pytest.raises(LedgerError, match="env copy 0 has no LedgerParallelEnv"):
        index_supersuit_copies(venv)
    venv.close()


def black_death_run(d, par_env, steps, pad=None):
    env = (pad or ss.black_death_v3)(LedgerParallelEnv(par_env, d))
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 1, num_cpus=0,
                                 base_class="stable_baselines3")
    index_supersuit_copies(venv)
    venv = LedgerVecEnv(venv, os.path.join(d, "trainer.npz"))
    venv.reset()
    for _ in range(steps):
        venv.step(np.ones(venv.num_envs, dtype=np.int64))
    venv.close()
    return compare(d, os.path.join(d, "trainer.npz"))


def test_black_death_padding_is_one_finding_at_the_agent_that_left(tmp_path):
    """black_death_v3 never tells the trainer a dead agent is done: it gets its last step with both flags
    false, then zero observations (and the phantom step at the episode's end) until every agent is done."""
    report = black_death_run(str(tmp_path), TwoLeaveApart(), 6)
    by = report.by_env()
    assert (by[1].episode, by[1].step, by[1].fields, by[1].untold) == (0, 2, ("terminated",), ("terminated", 3))
    assert by[1].line() == (
        "env 0, agent agent_1, episode 0, step 2: terminated differs (env gave True, trainer received False); "
        "agent agent_1 left here (terminated) but the trainer was not told, and then received 3 steps the env "
        "never took (they are counted here, not as more differences; SuperSuit's black_death_v3 is one wrapper "
        "known to pad an agent that left)")
    # agent_0, truncated at step 4 as the episode ends: the trainer was not told, and got a phantom step
    assert (by[0].episode, by[0].step, by[0].untold) == (0, 4, ("truncated", 1))
    assert "received a step the env never took" in by[0].line()
    assert report.to_dict()["differences"][1]["steps_never_taken"] == 3


class KeepLeftAgents(BaseParallelWrapper):
    """A MAPPO-style padding wrapper of a user's own (not SuperSuit's): an agent that left stays in every step,
    with its last observation, reward 0 and both flags false, until every agent is done."""

    def reset(self, seed=None, options=None):
        obs, infos = self.env.reset(seed=seed, options=options)
        self.agents, self.last = list(self.env.possible_agents), dict(obs)
        return obs, infos

    def step(self, actions):
        obs, rewards, terms, truncs, infos = self.env.step({a: actions[a] for a in self.env.agents})
        self.last.update(obs)
        done = not self.env.agents
        out = ({a: self.last[a] for a in self.agents}, {a: rewards.get(a, 0.0) for a in self.agents},
               {a: done and terms.get(a, False) for a in self.agents},
               {a: done and truncs.get(a, True) for a in self.agents}, {a: infos.get(a, {}) for a in self.agents})
        if done:
            self.agents = []
        return out


def test_padding_by_another_wrapper_is_said_as_seen(tmp_path):
    """Issue 24: padding from a wrapper that is not black_death_v3 was reported as black_death_v3's doing. The
    line says what was seen, and names black_death_v3 as one known cause only."""
    report = black_death_run(str(tmp_path), TwoLeaveApart(), 6, pad=KeepLeftAgents)
    by = report.by_env()
    assert (by[1].episode, by[1].step, by[1].fields, by[1].untold) == (0, 2, ("terminated",), ("terminated", 2))
    assert by[1].line() == (
        "env 0, agent agent_1, episode 0, step 2: terminated differs (env gave True, trainer received False); "
        "agent agent_1 left here (terminated) but the trainer was not told, and then received 2 steps the env "
        "never took (they are counted here, not as more differences; SuperSuit's black_death_v3 is one wrapper "
        "known to pad an agent that left)")
    assert "black_death_v3 does this" not in str(report)


def test_black_death_in_live_mode_is_one_fault_per_agent(tmp_path):
    """Live, black_death_v3's padding is told once per agent, where it left, as compare tells it: the padded
    steps that follow (no token, then every later event shifted) are counted, not delivered as more faults."""
    d = str(tmp_path)
    env = ss.black_death_v3(LedgerParallelEnv(TwoLeaveApart(), d, live=True))
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 1, num_cpus=0, base_class="stable_baselines3")
    index_supersuit_copies(venv)
    venv = LedgerVecEnv(venv, os.path.join(d, "trainer.npz"), live=True, on_fault="record")
    venv.reset()
    for _ in range(14):  # three episodes
        venv.step(np.ones(venv.num_envs, dtype=np.int64))
    faults = [(f.agent, f.episode, f.step, f.fields) for f in venv.live_faults]
    later = venv.ledger.live_later
    venv.close()
    assert faults == [("agent_1", 0, 2, ("terminated",)), ("agent_0", 0, 4, ("truncated",))], faults
    assert later[1] > 10 and later[0] > 10, later  # what followed: steps never given, events shifted
    by = compare(d, os.path.join(d, "trainer.npz")).by_env()
    assert [(by[e].episode, by[e].step, by[e].fields) for e in (1, 0)] == [(0, 2, ("terminated",)),
                                                                          (0, 4, ("truncated",))]


def test_black_death_phantom_step_at_a_time_limit(tmp_path):
    """mpe2 simple_spread with max_cycles=3 under black_death_v3: the episode's end reaches the trainer one
    step late, on a step the env never took."""
    report = black_death_run(str(tmp_path), simple_spread_v3.parallel_env(N=2, max_cycles=3), 5)
    assert sorted(d.env for d in report.differences) == [0, 1]
    for d in report.differences:
        assert (d.episode, d.step, d.fields, d.untold) == (0, 3, ("truncated",), ("truncated", 1)), d.line()


def gymnasium_form_run(d, max_cycles, steps, copies=2, env=None):
    """simple_spread (or ``env``, LedgerParallelEnv in it, or SuperSuit's vector env of it) through SuperSuit's
    Gymnasium form, random actions."""
    from stepledger.pettingzoo import LedgerSuperSuitVecEnv
    env = env or LedgerParallelEnv(simple_spread_v3.parallel_env(N=3, max_cycles=max_cycles), d)
    venv = env if hasattr(env, "vec_envs") else ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), copies,
                                                                      num_cpus=0, base_class="gymnasium")
    venv = LedgerSuperSuitVecEnv(venv, os.path.join(d, "trainer.npz"))
    assert venv.num_envs == 3 * copies  # passed through
    venv.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        venv.step(rng.integers(0, 5, venv.num_envs))
    venv.close()
    return compare(d, os.path.join(d, "trainer.npz"))


def test_supersuit_gymnasium_form_compares_clean_across_time_limits(tmp_path):
    """SuperSuit's Gymnasium form keeps truncations apart: random actions over three time limits compare clean."""
    report = gymnasium_form_run(str(tmp_path), max_cycles=4, steps=14)
    assert report.ok, report.lines()
    with read(str(tmp_path / "env-1.npz")) as led:
        kinds = led.streams[4].columns["kind"].tolist()
    assert kinds.count(0) == 4  # the first reset and three autoresets


def test_supersuit_gymnasium_form_black_death_padding_is_found(tmp_path):
    from stepledger.pettingzoo import LedgerSuperSuitVecEnv
    d = str(tmp_path)
    env = ss.black_death_v3(LedgerParallelEnv(TwoLeaveApart(), d))
    venv = LedgerSuperSuitVecEnv(ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 1, num_cpus=0,
                                                       base_class="gymnasium"), os.path.join(d, "trainer.npz"))
    venv.reset(seed=0)
    for _ in range(6):
        venv.step(np.ones(2, dtype=np.int64))
    venv.close()
    by = compare(d, os.path.join(d, "trainer.npz")).by_env()
    assert (by[1].episode, by[1].step, by[1].untold) == (0, 2, ("terminated", 3)), by[1].line()


class TogetherEnv(TwoLeaveApart):
    """Both agents terminate together, after 3, 4 or 5 steps: episodes that end by termination only."""
    metadata = {"name": "together_v0"}

    def reset(self, seed=None, options=None):
        self.episode = getattr(self, "episode", -1) + 1
        return super().reset(seed=seed, options=options)

    def step(self, actions):
        self.t += 1
        live = list(self.agents)
        done = self.t >= 3 + self.episode % 3
        obs = {a: self._obs(a) for a in live}
        self.agents = [] if done else live
        return (obs, {a: float(actions[a]) / 3 for a in live}, {a: done for a in live}, {a: False for a in live},
                {a: {} for a in live})


def test_ppo_through_supersuit_sb3_compares_clean_when_episodes_terminate(tmp_path):
    from stable_baselines3 import PPO
    d = str(tmp_path)
    env = LedgerParallelEnv(TogetherEnv(), d)
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 2, num_cpus=0,
                                 base_class="stable_baselines3")
    index_supersuit_copies(venv)
    venv = LedgerVecEnv(venv, os.path.join(d, "trainer.npz"))
    # no seed=: SB3 would call venv.seed(), which SuperSuit's ConcatVecEnv does not have
    PPO("MlpPolicy", venv, n_steps=16, batch_size=32, n_epochs=1, device="cpu").learn(64)
    venv.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, report.lines()
    with read(os.path.join(d, "env-1.npz")) as led:
        assert len(led.streams[3]) > 20 and led.streams[3].columns["terminated"].sum() >= 4


def test_the_count_line_counts_agent_streams(tmp_path):
    """A multi-agent env ledger's streams are agents of env copies, and the count line says so."""
    faulty = supersuit_run(str(tmp_path / "sb3"), max_cycles=5, steps=12)  # every truncation a termination
    assert "6 of 6 agent streams differ" in faulty.lines(), faulty.lines()
    assert repr(faulty) == "<Report ok=False: 6 of 6 agent streams differ>"
    clean = gymnasium_form_run(str(tmp_path / "gymnasium"), max_cycles=4, steps=14)
    assert str(clean).splitlines()[0] == "0 of 6 agent streams differ", str(clean)
    assert not [line for line in faulty.lines() + clean.lines() if "envs differ" in line]


def wrapped_spread_run(d, wrap, inside):
    """simple_spread with a SuperSuit wrapper ``wrap`` around LedgerParallelEnv (between the two ledgers) or,
    ``inside``, around the raw parallel env within it; LedgerSuperSuitVecEnv indexes the copies through it."""
    par_env = simple_spread_v3.parallel_env(N=3, max_cycles=25)
    env = LedgerParallelEnv(wrap(par_env), d) if inside else wrap(LedgerParallelEnv(par_env, d))
    return gymnasium_form_run(d, 25, 6, env=env)


@pytest.mark.parametrize("field,wrap", [
    ("reward", lambda env: ss.clip_reward_v0(env, -0.5, 0.5)),
    ("obs", lambda env: ss.observation_lambda_v0(env, lambda obs, space: obs * 2))])
def test_a_supersuit_wrapper_between_the_ledgers_is_named_for_agent_streams(tmp_path, field, wrap):
    """A SuperSuit wrapper that changes values, around LedgerParallelEnv, makes every agent stream differ from
    its first events: the hint counts agent streams and names the multi-agent placement, not LedgerEnv's; that
    placement (the wrapper inside LedgerParallelEnv) compares clean."""
    report = wrapped_spread_run(str(tmp_path / "between"), wrap, inside=False)
    assert len(report.differences) == 6 and all(field in d.fields for d in report.differences), report.lines()
    hint = [h for h in report.hints if "from their first events" in h]
    kind = {"reward": "rewards", "obs": "observations"}[field]
    assert len(hint) == 1 and hint[0].startswith(
        "hint: all 6 agent streams differ in %s from their first events: something between LedgerParallelEnv and "
        "the trainer-side ledger changes %s from the first events on: a wrapper that changes them on purpose "
        "(SuperSuit's " % (field, kind)), report.hints
    # the wrapper sits in the env's process, out of the trainer side's sight: none is called deliberate, and
    # the advice to move one says what the move stops checking
    assert hint[0].endswith("and so does a fault in anything else between them; only if the change is intended, "
                            "move that wrapper out: put LedgerParallelEnv around the SuperSuit wrappers that change "
                            "values on purpose (LedgerParallelEnv(normalize_obs_v0(par_env), directory)), and the "
                            "trainer-side ledger directly around SuperSuit's vector env; what a wrapper moved out "
                            "does is then no longer checked (a fault in it would no longer show)"), hint
    assert ("put LedgerParallelEnv around the SuperSuit wrappers that change values on purpose "
            "(LedgerParallelEnv(normalize_obs_v0(par_env), directory))") in hint[0]
    assert ("clip_reward_v0" if field == "reward" else "observation_lambda_v0") in hint[0]
    assert "LedgerEnv " not in hint[0] and "envs differ" not in hint[0]
    clean = wrapped_spread_run(str(tmp_path / "inside"), wrap, inside=True)
    assert clean.ok, clean.lines()


class TruncateAt(BaseParallelWrapper):
    """A time limit on a parallel env: every agent truncated at the ``limit``-th step of an episode."""

    def __init__(self, env, limit):
        super().__init__(env)
        self.limit, self.t = limit, 0

    def reset(self, seed=None, options=None):
        self.t = 0
        return self.env.reset(seed=seed, options=options)

    def step(self, actions):
        obs, rewards, terms, truncs, infos = self.env.step(actions)
        self.t += 1
        return obs, rewards, terms, {a: truncs[a] or self.t >= self.limit for a in truncs}, infos


def test_a_time_limit_between_the_ledgers_is_named_for_agent_streams(tmp_path):
    """A wrapper that ends episodes around LedgerParallelEnv: only truncated differs, and the hint names
    LedgerParallelEnv's placement, not LedgerEnv's and TimeLimit's; the same wrapper inside it compares clean."""
    par_env = simple_spread_v3.parallel_env(N=3, max_cycles=25)
    d = str(tmp_path / "between")
    report = gymnasium_form_run(d, 25, 8, env=TruncateAt(LedgerParallelEnv(par_env, d), 3))
    assert len(report.differences) == 6 and all(d.fields == ("truncated",) for d in report.differences)
    assert report.hints == ["hint: only truncated differs, and the trainer received True where the env gave False: "
                            "a wrapper that ends episodes (a time limit) between LedgerParallelEnv and the "
                            "trainer-side ledger does that; put LedgerParallelEnv around it "
                            "(LedgerParallelEnv(time_limit(par_env), directory)): its episode ends are then the "
                            "env's, and only their way to the trainer is checked"], report.hints
    d = str(tmp_path / "inside")
    clean = gymnasium_form_run(d, 25, 8, env=LedgerParallelEnv(TruncateAt(par_env, 3), d))
    assert clean.ok, clean.lines()


@pytest.mark.parametrize("indices,hint", [
    ((1, 0), "env-0.npz matches the trainer's env copy 1 and env-1.npz its env copy 0"),
    ((0, 0), None)])
def test_env_copies_given_the_wrong_index_are_named_as_copies(tmp_path, indices, hint):
    """Env copies whose LedgerParallelEnv got another copy's index (swapped, or one index twice): every agent of
    an env file matches the same agent of another copy, and the hint names the files and copies and asks about
    the copies' indices, not about the vector env's slot order; trainer slots no env file holds name their agent."""
    d = str(tmp_path)
    env = LedgerParallelEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25), d)
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 2, num_cpus=0, base_class="gymnasium")
    for copy, index in zip(venv.vec_envs, indices):
        copy.par_env.set_index(index)  # by hand, wrongly (index_supersuit_copies gives copy c index c)
    report = gymnasium_form_run(d, 25, 4, env=venv)
    if hint is not None:
        assert report.hints[-1] == ("hint: %s: is each LedgerParallelEnv's index its env copy's position in the "
                                    "vector env (index_supersuit_copies(venv) gives copy c index c, in SuperSuit's "
                                    "worker processes too)?" % hint), report.hints
    if indices == (0, 0):
        # the second copy given index 0 records beside the first (env-0.dup-*.npz, since copies of a recorded env
        # never write into each other's file): named as a second recording of index 0, not as an evaluation env
        dup = [n for n in os.listdir(d) if n.startswith("env-0.dup-")]
        assert len(dup) == 1, os.listdir(d)
        assert ("%s and env-0.npz both recorded env 0 at the same time: two LedgerEnvs were given index=0"
                % dup[0]) in str(report), str(report)
        assert [d.line() for d in report.differences if d.what == "one_side"] == [
            "env 1, agent agent_%d: recorded only on the trainer side (5 events); the env ledger has no stream for it"
            % k for k in range(3)]


def test_a_space_changing_wrapper_between_the_ledgers_is_named_for_agent_streams(tmp_path):
    """SuperSuit's frame_stack_v1 around LedgerParallelEnv: the two sides recorded different observation spaces,
    and the refusal names SuperSuit's wrappers and LedgerParallelEnv's placement, not LedgerEnv's; inside it the
    run compares clean."""
    from stepledger import SettingsError
    par_env = simple_spread_v3.parallel_env(N=3, max_cycles=25)
    d = str(tmp_path / "between")
    with pytest.raises(SettingsError) as caught:
        gymnasium_form_run(d, 25, 3, env=ss.frame_stack_v1(LedgerParallelEnv(par_env, d), 2))
    text = str(caught.value)
    assert text.startswith("the two sides recorded different observation spaces: env "), text
    assert text.endswith("; a wrapper that changes the space (SuperSuit's frame_stack_v1, agent_indicator_v0, "
                         "flatten_v0, ... around LedgerParallelEnv, or VecFrameStack on the vector env) probably "
                         "sits between LedgerParallelEnv and the trainer-side ledger: put LedgerParallelEnv around "
                         "the SuperSuit wrappers that change values on purpose (LedgerParallelEnv(normalize_obs_v0("
                         "par_env), directory)), and the trainer-side ledger directly around SuperSuit's vector "
                         "env; what a wrapper moved out does is then no longer checked (a fault in it would no longer "
                         "show)"), text
    d = str(tmp_path / "inside")
    assert gymnasium_form_run(d, 25, 3, env=LedgerParallelEnv(ss.frame_stack_v1(par_env, 2), d)).ok


KILLED_SCRIPT = r"""
import gc, os, signal, sys
import numpy as np, supersuit as ss
from mpe2 import simple_spread_v3
from stepledger.pettingzoo import LedgerParallelEnv, LedgerSuperSuitVecEnv
d = sys.argv[1]
env = LedgerParallelEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25), d)
venv = LedgerSuperSuitVecEnv(ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 2, num_cpus=0,
                                                   base_class="gymnasium"), os.path.join(d, "trainer.npz"))
venv.reset(seed=0)
for t in range(6):
    if t == 4:  # the env ledgers' last spill: a reset and 4 steps
        for copy in [c for c in gc.get_objects() if isinstance(c, LedgerParallelEnv)]:
            copy.flush()
    venv.step(np.zeros(6, np.int64))
venv.ledger.close()
os.kill(os.getpid(), signal.SIGKILL)  # the env ledgers are never written: their spill segments are what is left
"""


def test_records_that_end_apart_name_the_agent(tmp_path):
    """A process killed after its trainer ledger closed and its env ledgers last spilled 2 steps earlier: the
    notes name each agent stream by its env copy and agent, not as an env. Recorded without a mapped part
    (STEPLEDGER_MAPPED_BYTES=0, as ledgers at a URL are), so that the env side loses what it had not spilled."""
    import subprocess
    import sys
    d = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", KILLED_SCRIPT, d], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, STEPLEDGER_MAPPED_BYTES="0"))
    assert proc.returncode == -9, proc.stderr[-3000:]
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, str(report)
    ends = [n for n in report.notes if "records end at different points" in n]
    assert ends == ["env %d, agent agent_%d: records end at different points (the env side stopped 2 events before "
                    "the other's end; the env ledger: not closed (its process is gone)); the 5 events both sides "
                    "have agree" % (s // 3, s % 3) for s in range(6)], report.notes


# ---------------------------------------------------------------- an older PettingZoo, or none (issue 24)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(stepledger.__file__)))


def _import_pettingzoo_module(python, prelude=""):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_") and k != "PYTHONPATH"}
    env.update(PYTHONPATH=REPO, STEPLEDGER_PUREPYTHON="1")  # this checkout, its pure-Python core
    code = prelude + "from stepledger.pettingzoo import LedgerParallelEnv\n"  # the folder imports; its first name says
    return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_an_older_pettingzoo_is_named_with_the_version_needed(pz122_python):
    # pettingzoo 1.22 spells the base class BaseParallelWraper: the import used to say PettingZoo is not installed
    out = _import_pettingzoo_module(pz122_python)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        "ImportError: stepledger.pettingzoo needs PettingZoo %s or newer, and pettingzoo 1.22.3 is installed: pip "
        "install -U \"pettingzoo>=%s\" (or pip install \"plugrl-stepledger[pettingzoo]\")"
        % (PETTINGZOO_NEEDS, PETTINGZOO_NEEDS)), out.stderr


def test_no_pettingzoo_is_said_so(tmp_path):
    out = _import_pettingzoo_module(sys.executable, hiding("pettingzoo") + "import importlib.metadata as m\n"
                                    "m.version = lambda name: (_ for _ in ()).throw(m.PackageNotFoundError(name))\n")
    assert out.stderr.strip().splitlines()[-1] == (
        "ImportError: stepledger.pettingzoo needs PettingZoo %s or newer, and it is not installed: pip install "
        "\"plugrl-stepledger[pettingzoo]\" (or pip install \"pettingzoo>=%s\")" % (PETTINGZOO_NEEDS, PETTINGZOO_NEEDS))


def test_the_version_needed_is_the_extras():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["pettingzoo"]
    assert "pettingzoo>=%s" % PETTINGZOO_NEEDS in extra


class _HalfObs:
    """A user's own wrapper around SuperSuit's vector env (``.venv``): it rounds every observation to float16."""

    def __init__(self, venv):
        self.venv = venv

    def __getattr__(self, name):
        if name == "venv":
            raise AttributeError(name)
        return getattr(self.venv, name)

    def reset(self, **kw):
        obs, infos = self.venv.reset(**kw)
        return obs.astype(np.float16).astype(obs.dtype), infos

    def step(self, actions):
        obs, rewards, terms, truncs, infos = self.venv.step(actions)
        return obs.astype(np.float16).astype(obs.dtype), rewards, terms, truncs, infos


def test_a_users_wrapper_inside_the_supersuit_ledger_is_warned_of_and_named_by_the_hint(tmp_path):
    from stepledger.pettingzoo import LedgerSuperSuitVecEnv
    d = str(tmp_path)
    env = LedgerParallelEnv(simple_spread_v3.parallel_env(N=3, max_cycles=5), d)
    venv = _HalfObs(ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 1, num_cpus=0,
                                          base_class="gymnasium"))
    with pytest.warns(UserWarning, match=r"LedgerSuperSuitVecEnv: _HalfObs sits between this ledger and the vector "
                                         r"env, on the checked side"):
        led = LedgerSuperSuitVecEnv(venv, os.path.join(d, "trainer.npz"))
    led.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(4):
        led.step(rng.integers(0, 5, led.num_envs))
    led.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert not report.ok
    assert any("_HalfObs" in h and "checked side" in h for h in report.hints), report.hints
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # check_wrappers=False silences it
        LedgerSuperSuitVecEnv(venv, os.path.join(str(tmp_path / "quiet"), "trainer.npz"), check_wrappers=False).close()
