"""Turn-based (AEC) PettingZoo envs: LedgerAECEnv on the env side, a hand-written agent_iter loop (TurnLedger)
on the trainer side, on PettingZoo's classic games (issue 26, first part)."""

import os

import numpy as np
import pytest

pytest.importorskip("pettingzoo")

from pettingzoo import AECEnv  # noqa: E402
from pettingzoo.classic import connect_four_v3, tictactoe_v3  # noqa: E402
from gymnasium import spaces  # noqa: E402

from stepledger import LedgerError, compare, read  # noqa: E402
from stepledger.format import schema as S  # noqa: E402
from stepledger.pettingzoo import LedgerAECEnv, TurnLedger  # noqa: E402
from aec_games import play, run  # noqa: E402

GAMES = {"tictactoe": tictactoe_v3, "connect_four": connect_four_v3}


def holdem():
    return pytest.importorskip("pettingzoo.classic.texas_holdem_v4", reason="texas_holdem_v4 needs rlcard")


def rewards_of(stream):
    """A float32 ledger's rewards, as numbers."""
    return stream.columns["h_rew"].astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("game", sorted(GAMES))
def test_a_classic_game_compares_clean_turn_by_turn(tmp_path, game):
    report, taken, agents = run(str(tmp_path), GAMES[game].env, games=4)
    assert report.ok, str(report)
    assert str(report).splitlines()[-1] == "0 of 2 agent streams differ"
    with read(str(tmp_path / "env-0.npz")) as led:
        assert led.meta[S.META_POSSIBLE_AGENTS] == agents
        for k, agent in enumerate(agents):
            cols = led.streams[k].columns
            # each game: a reset at the agent's first turn, one step per action it took; the None step records nothing
            assert len(cols["kind"]) == sum(1 + t[agent] for t in taken)
            assert (cols["kind"] == S.KIND_RESET).sum() == len(taken)
            last = np.flatnonzero(cols["kind"] == S.KIND_RESET)[1:] - 1
            assert cols["terminated"][np.append(last, len(cols["kind"]) - 1)].all()  # every game ends every agent
            assert cols["terminated"].sum() == len(taken)


def test_texas_holdem_compares_clean(tmp_path):
    report, _, _ = run(str(tmp_path), holdem().env, games=6)
    assert report.ok, str(report)


def test_rewards_earned_during_the_opponents_move_are_the_earners(tmp_path):
    """Tic-tac-toe's loser is given -1 by the winner's move: its last step (closed at its None turn) holds it."""
    d = str(tmp_path)
    report, taken, agents = run(d, tictactoe_v3.env, games=6)
    assert report.ok, str(report)
    with read(os.path.join(d, "env-0.npz")) as led:
        finals = {a: rewards_of(led.streams[k])[led.streams[k].columns["terminated"]] for k, a in enumerate(agents)}
    sums = finals[agents[0]] + finals[agents[1]]
    assert set(np.round(sums, 6).tolist()) == {0.0}  # zero-sum at every game's end, each final reward in its stream
    assert (finals[agents[0]] != 0).any()  # some game was won, so the loser's -1 came during the winner's move


def test_a_reward_dropped_during_the_opponents_move_is_caught_and_located(tmp_path):
    """The class of Tianshou issue 399: the reward an agent earned while its opponent moved does not reach it."""
    hit = {}

    def drop(agent, values):
        if (values[2] or values[3]) and values[1] < 0 and not hit:  # the loser's -1, given at its None turn
            hit.update(agent=agent)
            values[1] = 0.0

    report, taken, agents = run(str(tmp_path), tictactoe_v3.env, games=6, on_turn=drop)
    assert hit
    k = agents.index(hit["agent"])
    d = report.differences[0]
    assert (d.env, d.fields) == (k, ("reward",)), str(report)
    assert str(report).splitlines()[0] == (
        "env 0, agent %s, episode %d, step %d: reward differs (env gave -1.0, trainer received 0.0)"
        % (hit["agent"], d.episode, d.step))


def test_two_env_copies_are_streams_of_their_own(tmp_path):
    d = str(tmp_path)
    envs = [LedgerAECEnv(connect_four_v3.env(), d, index=c) for c in range(2)]
    agents = envs[0].possible_agents
    turns = TurnLedger(os.path.join(d, "trainer.npz"), agents, envs[0].observation_space(agents[0]),
                       envs[0].action_space(agents[0]), copies=2)
    rng = np.random.default_rng(1)
    for env in envs:
        env.reset(seed=3)
    iters = [iter(env.agent_iter()) for env in envs]
    live = [True, True]
    changed = False
    while any(live):  # the two copies' turns interleaved
        for c, (env, it) in enumerate(zip(envs, iters)):
            agent = next(it, None) if live[c] else None
            if agent is None:
                live[c] = False
                continue
            obs, reward, term, trunc, _ = env.last()
            if c == 1 and agent == agents[1] and not changed and not (term or trunc):
                obs = dict(obs, observation=obs["observation"] * 0)  # copy 1's player_1 gets a zeroed board once
                changed = True
            turns.observed(agent, obs, reward, term, trunc, copy=c)
            action = None if term or trunc else int(rng.choice(np.flatnonzero(obs["action_mask"])))
            turns.acted(agent, action, copy=c)
            env.step(action)
    for env in envs:
        env.close()
    turns.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert [(x.env, x.fields) for x in report.differences] == [(3, ("obs",))], str(report)
    assert str(report).splitlines()[0].startswith("env 1, agent player_1, episode 0, step ")
    assert "1 of 4 agent streams differ" in str(report).splitlines()


def test_a_game_abandoned_midway_starts_anew(tmp_path):
    """A trainer that resets before the game ended (after it was given the turn of the agent it stops at): the
    open steps are dropped on both sides, each agent starts again with a reset at its first turn."""
    d = str(tmp_path)
    env = LedgerAECEnv(tictactoe_v3.env(), d, index=0)
    agents = env.possible_agents
    turns = TurnLedger(os.path.join(d, "trainer.npz"), agents, env.observation_space(agents[0]),
                       env.action_space(agents[0]))
    for game, moves in enumerate((3, 100)):
        env.reset(seed=game)
        turns.new_game()
        for n, agent in enumerate(env.agent_iter()):
            obs, reward, term, trunc, _ = env.last()
            turns.observed(agent, obs, reward, term, trunc)
            if n == moves:
                break
            action = None if term or trunc else int(np.flatnonzero(obs["action_mask"])[0])
            turns.acted(agent, action)
            env.step(action)
    env.close()
    turns.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert report.ok, str(report)
    with read(os.path.join(d, "env-0.npz")) as led:
        assert led.streams[0].columns["kind"].tolist()[:3] == [S.KIND_RESET, S.KIND_STEP, S.KIND_RESET]


class JoinLeave(AECEnv):
    """A real AEC env whose agents come and go: ``scout`` joins at the second cycle and leaves after two
    turns, while ``a`` and ``b`` play on; b is given reward 1 by each of a's moves."""

    metadata = {"name": "join_leave_v0", "is_parallelizable": False}

    def __init__(self, cycles=4):
        super().__init__()
        self.possible_agents = ["a", "b", "scout"]
        self.cycles = cycles
        self._space = spaces.Box(0, 100, (1,), np.float32)
        self._act = spaces.Discrete(3)

    def observation_space(self, agent):
        return self._space

    def action_space(self, agent):
        return self._act

    def observe(self, agent):
        return np.array([self.t * 10 + self.possible_agents.index(agent)], np.float32)

    def reset(self, seed=None, options=None):
        self.agents = ["a", "b"]
        self.t, self.scout_turns = 0, 0
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = "a"

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self.rewards = {a: 0.0 for a in self.agents}
        if agent == "a":
            self.rewards["b"] = 1.0
        if agent == "scout":
            self.scout_turns += 1
            if self.scout_turns == 2:
                self.terminations["scout"] = True
        order = [a for a in self.agents]
        nxt = order[(order.index(agent) + 1) % len(order)]
        if nxt == order[0]:
            self.t += 1
            if self.t == 1 and "scout" not in self.agents:
                self.agents.append("scout")
                for d, v in ((self.rewards, 0.0), (self._cumulative_rewards, 0.0), (self.terminations, False),
                             (self.truncations, False), (self.infos, {})):
                    d["scout"] = v
            if self.t >= self.cycles:
                self.truncations = {a: True for a in self.agents}
        self.agent_selection = nxt
        self._accumulate_rewards()
        self._deads_step_first()


def test_agents_that_join_and_leave(tmp_path):
    d = str(tmp_path)
    report, taken, agents = run(d, JoinLeave, games=2)
    assert report.ok, str(report)
    with read(os.path.join(d, "env-0.npz")) as led:
        scout = led.streams[2].columns
        assert scout["kind"].tolist() == [S.KIND_RESET, S.KIND_STEP, S.KIND_STEP] * 2  # joined, two turns, left
        assert scout["terminated"].tolist() == [False, False, True] * 2
        b = led.streams[1]
        steps = (b.columns["kind"] == S.KIND_STEP) & ~b.columns["truncated"]  # the time limit came before a moved
        assert set(rewards_of(b)[steps].tolist()) == {1.0}  # a's moves gave b its reward
        assert b.columns["truncated"].sum() == 2


def test_no_index_is_one_line(tmp_path):
    env = LedgerAECEnv(tictactoe_v3.env(), str(tmp_path))
    with pytest.raises(LedgerError, match=r"^LedgerAECEnv: no index: give index= or call set_index\(i\)"):
        env.reset()
    with pytest.raises(LedgerError, match="^LedgerAECEnv: directory .* looks like a ledger file"):
        LedgerAECEnv(tictactoe_v3.env(), str(tmp_path / "x.npz"))


# ---------------------------------------------------------------- aec_to_parallel into the parallel-API trainer sides

@pytest.mark.parametrize("form,num_cpus", [("gymnasium", 0), ("sb3", 0), ("gymnasium", 2)])
def test_aec_to_parallel_into_supersuit_compares_clean(tmp_path, form, num_cpus):
    """mpe2's turn-based simple_spread through aec_to_parallel and SuperSuit's vector envs: each agent's turns
    are its parallel steps (aec_to_parallel hands every agent's observation out at a cycle's end, where the
    turn-based ledger closes its step), over several time limits."""
    ss = pytest.importorskip("supersuit")
    simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")
    from pettingzoo.utils.conversions import aec_to_parallel
    from stepledger.pettingzoo import LedgerSuperSuitVecEnv, index_supersuit_copies
    from stepledger.sb3 import LedgerVecEnv
    d = str(tmp_path)
    env = aec_to_parallel(LedgerAECEnv(simple_spread_v3.env(N=3, max_cycles=10, continuous_actions=True), d))
    venv = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 2, num_cpus=num_cpus,
                                 base_class="gymnasium" if form == "gymnasium" else "stable_baselines3")
    trainer = os.path.join(d, "trainer.npz")
    if form == "gymnasium":
        venv = LedgerSuperSuitVecEnv(venv, trainer)
        venv.reset(seed=0)
    else:
        index_supersuit_copies(venv)
        venv = LedgerVecEnv(venv, trainer)
        venv.reset()
    space = venv.action_space
    space.seed(0)
    for _ in range(25):
        venv.step(np.stack([space.sample() for _ in range(venv.num_envs)]))
    venv.close()
    report = compare(d, trainer)
    if form == "sb3":  # SuperSuit's SB3 form tells each time limit as a termination (PettingZoo issue 1126)
        assert {x.fields for x in report.differences} == {("terminated", "truncated")}, str(report)
        assert len(report.differences) == 6
    else:
        assert report.ok, str(report)
    with read(os.path.join(d, "env-1.npz")) as led:
        assert all((led.streams[s].columns["kind"] == S.KIND_RESET).sum() == 3 for s in (3, 4, 5))


# ---------------------------------------------------------------- hints name the class of the env-side ledger

def test_hints_name_ledger_aec_env_where_it_recorded(tmp_path):
    """A wrong index and a trainer side of another space, with a turn-based env ledger: the hints name
    LedgerAECEnv (the meta's recorded_by), not LedgerParallelEnv."""
    d = str(tmp_path / "index")
    os.makedirs(d)
    report, _, _ = run(d, tictactoe_v3.env, games=2, index=1)  # the trainer's only env copy is copy 0
    with read(os.path.join(d, "env-1.npz")) as led:
        assert led.meta[S.META_RECORDED_BY] == "LedgerAECEnv"
    assert report.hints == ["hint: env-1.npz matches the trainer's env copy 0: is each LedgerAECEnv's index its env copy's position in the vector env "
                            "(index_supersuit_copies(venv) gives copy c index c, in SuperSuit's worker processes "
                            "too)?"], report.hints
    d = str(tmp_path / "space")
    os.makedirs(d)
    env = LedgerAECEnv(tictactoe_v3.env(), d, index=0)
    agents = env.possible_agents
    board = env.observation_space(agents[0])["observation"]  # the board alone: not the space the env side records
    turns = TurnLedger(os.path.join(d, "trainer.npz"), agents, board, env.action_space(agents[0]))
    env.reset(seed=0)
    obs, reward, term, trunc, _ = env.last()
    turns.observed(env.agent_selection, obs["observation"], reward, term, trunc)  # a trainer that drops the mask
    env.close()
    turns.close()
    with pytest.raises(LedgerError) as refused:
        compare(d, os.path.join(d, "trainer.npz"))
    text = str(refused.value)
    assert text.startswith("the two sides recorded different observation spaces: ") and (
        "around LedgerAECEnv, or VecFrameStack on the vector env) probably sits between LedgerAECEnv and the "
        "trainer-side ledger: put LedgerAECEnv around the SuperSuit wrappers that change values on purpose "
        "(LedgerAECEnv(normalize_obs_v0(aec_env), directory)), and the trainer-side ledger where the trainer is "
        "handed the turns (TurnLedger in an agent_iter loop, or directly around the vector env after "
        "aec_to_parallel)") in text and "LedgerParallelEnv" not in text, text


def test_a_reward_wrapper_after_ledger_aec_env_is_named_in_the_hint(tmp_path):
    """SuperSuit's clip_reward_v0 between LedgerAECEnv and the trainer side (through aec_to_parallel into
    SuperSuit's vector env) changes every agent's reward from the first step: the hint names LedgerAECEnv."""
    ss = pytest.importorskip("supersuit")
    simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")
    from pettingzoo.utils.conversions import aec_to_parallel
    from stepledger.pettingzoo import LedgerSuperSuitVecEnv
    d = str(tmp_path)
    env = aec_to_parallel(ss.clip_reward_v0(LedgerAECEnv(simple_spread_v3.env(N=2, max_cycles=5), d),
                                            lower_bound=-0.01, upper_bound=0.01))
    venv = LedgerSuperSuitVecEnv(ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 1, num_cpus=0,
                                                       base_class="gymnasium"), os.path.join(d, "trainer.npz"))
    venv.reset(seed=0)
    space = venv.action_space
    space.seed(0)
    for _ in range(3):
        venv.step(np.stack([space.sample() for _ in range(venv.num_envs)]))
    venv.close()
    report = compare(d, os.path.join(d, "trainer.npz"))
    assert {(x.env, x.fields) for x in report.differences} == {(0, ("reward",)), (1, ("reward",))}, str(report)
    assert report.hints[0].startswith(
        "hint: all 2 agent streams differ in reward from their first events: something between LedgerAECEnv and "
        "the trainer-side ledger changes rewards from the first events on: a wrapper that changes them on purpose "
        "(SuperSuit's clip_reward_v0 or reward_lambda_v0 around LedgerAECEnv, "), report.hints
    assert "LedgerParallelEnv" not in report.hints[0], report.hints
