"""stepledger.rllib on multi-agent runs, on a real local Ray cluster (``ray.init(num_cpus=2)``): short PPO runs
of tests/rllib_ma_envs.py's envs (agents acting together, in turn, leaving and joining; RLlib's PettingZoo
wrappers over PettingZoo's rps_v2), each in a subprocess (tests/rllib_harness.py) with a timeout.

Run in the RLlib venv (tests/rllib/test_rllib_venv.py), as tests/rllib/test_rllib.py is. The CI set is four
runs in test_rllib.py's Ray session (tests/rllib/conftest.py); ``STEPLEDGER_RLLIB_LONG=1`` adds the longer set
(RLlib's turn-based PettingZooEnv, the runner placement, a recreated runner with evaluation runners, a run ended
by ray.shutdown() alone) in a Ray session of its own, and check_rllib's multi-agent matrix in another.
"""

import testpaths  # noqa: F401  (where the suite and the repository are)
import glob
import os
import re

import pytest

pytest.importorskip("ray.rllib", reason="Ray RLlib is not installed here: tests/rllib/test_rllib_venv.py runs these "
                                        "tests in a venv of their own")

from stepledger import compare, read, wording  # noqa: E402
from stepledger.format import schema as S  # noqa: E402
from rllib.test_rllib import env_indices, linked_by_run, noted_gone, run, trainer_files  # noqa: E402

LONG = os.environ.get("STEPLEDGER_RLLIB_LONG") == "1"

# (env, agent, fault): connector faults, each recording where it struck; agent k of env e is stream e * 2 + k
FAULTS = [{"env": 0, "agent": "agent_1", "fault": "obs:f16", "place": "connector", "at": 5},
          {"env": 3, "agent": "agent_0", "fault": "reward:f16", "place": "connector", "at": 5}]

CI = {
    # agents in turn, a module each: a waiting agent's rewards add up into its next step
    "turns-own": {"env": "ma-turns", "modules": "own"},
    # leaving (with and without a last observation) and joining, one shared module, two learners
    "coming-going-2-learners": {"env": "ma-coming-going", "modules": "shared", "learners": 2},
    # RLlib's ParallelPettingZooEnv over PettingZoo's rps_v2 (simultaneous moves; max_cycles ends it)
    "rps-parallel": {"env": "ma-rps-parallel", "modules": "own"},
    # one agent's obs and another's reward changed in the connector pipeline, each on its own env
    "faults": {"env": "ma-together", "modules": "shared", "iterations": 1, "faults": FAULTS},
}
LONGER = {
    # Table I's RLlib row on RLlib's own path: OpenSpiel's tic_tac_toe through RLlib's OpenSpielEnv, the reward of
    # the player whose move ended the game made 0 in the connector pipeline on its way to the learner (the class
    # of RLlib PR 31156), and the same game clean. Both with batch_mode="complete_episodes" and one env per
    # runner, where RLlib 2.60 loses nothing on the way, so that the clean control is clean in every run: no
    # sample is cut (MultiAgentEnvRunner cuts only when it samples timesteps), so no player's step can span a
    # cut (RLlib's default truncate_episodes loses such steps, MultiAgentEpisode.cut, PR 44677: the control was
    # not clean in about half the runs there), and each sample() ends at the step where its one env's game ends,
    # so that no game is under way when the next sample() resets the env (with two envs a runner drops the other
    # env's game then: the "openspiel-complete" runs below; docs/FINDINGS.md)
    "openspiel-31156": {"env": "ma-openspiel", "modules": "own", "iterations": 1, "batch_mode": "complete_episodes",
                        "envs": 1, "faults": [
                            {"env": 1, "agent": 0, "fault": "reward:ender", "place": "connector", "at": 5}]},
    "openspiel": {"env": "ma-openspiel", "modules": "own", "iterations": 1, "batch_mode": "complete_episodes",
                  "envs": 1},
    # complete_episodes with two envs a runner: RLlib drops the game under way on one env when the other's ends
    # the sample, and compare names the events that never reached a learner; on the learners and on the runners
    "openspiel-complete": {"env": "ma-openspiel", "modules": "own", "iterations": 1,
                           "batch_mode": "complete_episodes"},
    "openspiel-complete-runner": {"env": "ma-openspiel", "modules": "own", "iterations": 1,
                                  "batch_mode": "complete_episodes", "placement": "runner"},
    # complete_episodes on games of one length, stepped together: both envs' episodes end at one step, none is
    # dropped; every sample() reseeds the envs with the same seeds
    "turns-complete": {"env": "ma-turns", "modules": "own", "iterations": 1, "batch_mode": "complete_episodes"},
    # RLlib's PettingZooEnv over rps_v2's AEC env: the players move in turn (max_cycles truncates every game,
    # which reaches the learner as a termination, as with rps-parallel)
    "rps-turns": {"env": "ma-rps-turns", "modules": "shared"},
    # the trainer side on each env runner (on_sample_end)
    "runner": {"env": "ma-turns", "modules": "shared", "placement": "runner"},
    # evaluation runners; runner 2 killed and recreated by RLlib
    "recreate": {"env": "ma-together", "modules": "shared", "iterations": 1, "evaluation": 1, "recreate": 2,
                 "flush_interval": 0.2},
    # last: ray.shutdown() alone
    "shutdown": {"env": "ma-turns", "modules": "shared", "end": "shutdown", "flush_interval": 0.2},
}
CLEAN = ["turns-own", "coming-going-2-learners"] + (["runner"] if LONG else [])


def _specs(table, base):
    """Copies of ``table``'s specs, their paths (and the faults' records) under ``base`` (a pathlib.Path)."""
    specs = {}
    for name, spec in table.items():
        spec = dict(dict(runners=2, envs=2, batch=200), **spec, path=str(base / name))
        spec.setdefault("iterations", 2)
        if "faults" in spec:
            spec["faults"] = [dict(f, record=str(base / ("fault-%d.json" % k))) for k, f in enumerate(spec["faults"])]
        specs[name] = spec
    return specs


def ci_specs(base):
    """The CI set, which runs in tests/rllib/conftest.py's shared Ray session with test_rllib.py's runs."""
    return _specs(CI, base)


@pytest.fixture(scope="module")
def runs(shared_runs, tmp_path_factory):
    runs = dict(shared_runs["multi"])
    if LONG:  # the longer set in a Ray session of its own (its last run ends by ray.shutdown() alone)
        specs = _specs(LONGER, tmp_path_factory.mktemp("ma-long"))
        outs = run(list(specs.values()), timeout=1500)
        runs.update((name, (spec, out)) for (name, spec), out in zip(specs.items(), outs))
    return runs


def agent_steps(path, files):
    steps = 0
    for f in files:
        with read(os.path.join(path, f)) as ledger:
            steps += sum(int((s.columns["kind"][:] == 1).sum()) for s in ledger.streams.values())
    return steps


@pytest.mark.parametrize("name", CLEAN)
def test_a_clean_multi_agent_run_has_a_stream_per_agent_of_each_sub_env_and_compares_clean(runs, name, monkeypatch):
    spec, out = runs[name]
    d = spec["path"]
    assert env_indices(d) == [0, 1, 2, 3]
    n = 3 if spec["env"] == "ma-coming-going" else 2
    with read(d) as ledger:
        assert sorted(ledger.streams) == list(range(4 * n))  # agent k of env e: stream e * n + k
        agents = {tuple(s.meta[S.META_POSSIBLE_AGENTS]) for s in ledger.streams.values()}
    assert len(agents) == 1 and len(next(iter(agents))) == n, agents
    report = linked_by_run(d, d, monkeypatch)
    assert report.ok, str(report)
    assert sorted(report.envs) == list(range(4 * n))
    files = trainer_files(d)
    assert report.trainer_files == files
    if spec.get("learners") == 2:
        assert files == ["trainer-learner-0.npz", "trainer-learner-1.npz"]
    elif spec.get("placement") == "runner":
        assert files == ["trainer-runner-0.npz", "trainer-runner-2.npz"]
    else:
        assert files == ["trainer.npz"]
    env_files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, "env-*.npz")))
    assert agent_steps(d, files) == agent_steps(d, env_files) > 0  # every agent step the env took, once
    if spec["env"] in ("ma-turns", "ma-rps-turns"):  # one agent acts an env step
        assert agent_steps(d, env_files) >= out["env_steps"] - 4 * n


def test_agents_that_leave_and_join_have_their_streams_end_and_start_where_they_did(runs):
    spec, _ = runs["coming-going-2-learners"]
    with read(spec["path"]) as ledger:
        s = ledger.streams[0 * 3 + 2]  # env 0's agent_2 joins at step 2: its first event is a reset
        kinds = s.columns["kind"][:]
        assert kinds[0] == 0
        s1 = ledger.streams[0 * 3 + 1]  # agent_1 leaves at step 3 (terminated): 3 steps, then the next reset
        k1 = list(s1.columns["kind"][:])
        assert k1[:5] == [0, 1, 1, 1, 0], k1


@pytest.mark.parametrize("name", ["rps-parallel"] + (["rps-turns"] if LONG else []))
def test_rllib_tells_the_trainer_a_time_limit_of_every_agent_is_a_termination_and_compare_names_it(runs, name):
    # ParallelPettingZooEnv (and, in the long set, PettingZooEnv, turn-based) at rps_v2's max_cycles: every agent
    # truncated. RLlib's MultiAgentEpisode (Ray 2.60) declares an episode whose agents are all done terminated,
    # and the learner gets terminated=True, truncated=False: no bootstrap at the time limit (docs/FINDINGS.md).
    # compare names each agent there.
    spec, _ = runs[name]
    d = spec["path"]
    report = compare(d, d)
    assert not report.ok
    assert sorted(report.envs) == list(range(8))
    text = str(report)
    assert "truncation arrived as termination" in text, text
    lines = [ln for ln in text.splitlines() if ln.startswith("env ")]
    assert len(lines) == 8, text
    for line in lines:
        assert "step 10: terminated, truncated differ (terminated: env gave False, trainer received True; " \
               "truncated: env gave True, trainer received False)" in line and ", agent player_" in line, line


def test_each_agents_injected_fault_is_located_at_its_recorded_env_agent_episode_step_and_field(runs):
    from stepledger.check import is_located
    from stepledger.faults import read_record
    spec, _ = runs["faults"]
    report = compare(spec["path"], spec["path"])
    streams = [f["env"] * 2 + int(f["agent"][-1]) for f in spec["faults"]]
    assert [x.env for x in report.differences] == streams, str(report)  # those two agents' streams, no other
    for fault, stream in zip(spec["faults"], streams):
        injected = read_record(fault["record"])
        assert injected is not None and injected["env"] == stream and injected["fault"] == fault["fault"], injected
        assert is_located(report.by_env()[stream], injected), (str(report), injected)
    text = str(report)
    assert "env 0, agent agent_1, episode" in text and "env 3, agent agent_0, episode" in text, text


# Table I's RLlib row on OpenSpiel: the long set (see LONGER)
if LONG:
    def test_rllib_31156_the_enders_reward_made_0_on_its_way_to_the_learner_is_caught_and_located(runs):
        """OpenSpiel's tic_tac_toe through RLlib's OpenSpielEnv (players 0 and 1 in turn, the winner's reward 1 at the
        move that ends the game): player 0's reward at a game it ended by winning reaches the learner as 0. compare
        names env 1's player 0, the episode and step where the injector struck, and the reward, and nothing else."""
        from stepledger.check import is_located
        from stepledger.faults import read_record
        spec, _ = runs["openspiel-31156"]
        report = compare(spec["path"], spec["path"])
        injected = read_record(spec["faults"][0]["record"])
        assert injected is not None and injected["env"] == 1 * 2 + 0 and injected["fault"] == "reward:ender", injected
        assert [d.env for d in report.differences] == [2], str(report)
        assert report.differences[0].fields == ("reward",), str(report)
        assert is_located(report.by_env()[2], injected), (str(report), injected)
        text = str(report)
        # the ender's reward: 1 for a win, and -0.1 more where OpenSpielEnv replaced an illegal move of its
        assert re.search(r"^env 1, agent 0, episode %d, step %d: reward differs \(env gave (?!0\.0,)[-0-9.]+, trainer "
                         r"received 0\.0\)$" % (injected["episode"], injected["step"]), text, re.M), text


    def test_rllib_31156_clean_control_the_same_game_compares_clean(runs):
        spec, _ = runs["openspiel"]
        with read(spec["path"]) as ledger:
            assert sorted(ledger.streams) == list(range(4))  # 2 envs (one a runner) x 2 players
        report = compare(spec["path"], spec["path"])
        assert report.ok and sorted(report.envs) == list(range(4)), str(report)
        assert agent_steps(spec["path"], ["trainer.npz"]) > 100  # every player's step of every game, once

    @pytest.mark.parametrize("name", ["openspiel-complete", "openspiel-complete-runner"])
    def test_rllib_complete_episodes_drops_the_game_under_way_on_another_env_and_compare_names_its_events(runs,
                                                                                                          name):
        # docs/FINDINGS.md: with batch_mode="complete_episodes" RLlib 2.60's sample() samples num_envs episodes and
        # resets every env of the runner first, which deletes the episodes under way (EnvRunner.
        # _reset_envs_and_episodes): a game that another env's end left unfinished never reaches a learner. The
        # trainer side records where its events stand in each env stream (the runner counts what it dropped), so
        # that every event the trainer has is the env's at its place, and compare names each run of events in
        # none as having never reached a learner, the differences they make following them
        spec, _ = runs[name]
        d = spec["path"]
        placed, gaps, tails = _placed(d)
        assert placed > 0
        assert gaps, "no game was dropped in this run"
        report = compare(d, d)
        assert not report.ok
        text = str(report)
        with read(d) as ledger:
            kinds = {i: s.columns["kind"][:] for i, s in ledger.streams.items()}
            names = {i: wording.stream_name(i, s.meta[S.META_POSSIBLE_AGENTS]) for i, s in ledger.streams.items()}
        for stream, runs_of in gaps.items():
            for first, last in runs_of:
                # the dropped events are a game from its reset on, and the env was reset again after them
                assert kinds[stream][first] == 0 and kinds[stream][last + 1] == 0, (stream, first, last)
                # named as every line names a stream: env e, agent a
                assert re.search(r"^%s: its events %d to %d are in no trainer file \(.*\): they never reached a "
                                 r"learner$" % (re.escape(names[stream]), first, last), text, re.M), (stream, text)
        for diff in report.differences:
            if diff.env in gaps:
                assert diff.event >= gaps[diff.env][0][0], (str(report), gaps)
            else:  # a game under way at the run's end (RLlib would drop it at the next sample())
                assert diff.what == "length" and diff.env in tails, (str(report), tails)
        assert set(gaps) <= {diff.env for diff in report.differences}, str(report)

    def test_rllib_complete_episodes_reseeds_every_env_alike_at_each_sample(runs):
        # docs/FINDINGS.md: sample() in complete_episodes sets _needs_initial_reset again, so each call resets
        # the envs with the runner's seed: ma-turns, whose randomness comes from its seed, plays one game over and
        # over on each env (compared clean: both sides agree). With truncate_episodes (turns-own) it does not
        spec, _ = runs["turns-complete"]
        report = compare(spec["path"], spec["path"])
        assert report.ok and sorted(report.envs) == list(range(8)), str(report)
        for name, alike in (("turns-complete", True), ("turns-own", False)):
            with read(runs[name][0]["path"]) as ledger:
                for s in ledger.streams.values():
                    episode, obs = s.columns["episode"][:], s.columns["h_obs"][:]
                    games = {tuple(obs[episode == k].tolist()) for k in sorted(set(episode.tolist()))}
                    assert len(set(episode.tolist())) > 2 and (len(games) == 1) == alike, (name, s.index, games)


def _placed(d):
    """Where each trainer file's events stand in their env streams (their fragments): checks that each is the env's
    event at its place (every recorded field) and returns (events placed, {stream: [(first, last), ...] runs of
    env events that no trainer file holds, before the last one placed}, {stream: first event of those after it}).
    """
    from stepledger.report.read import fragments_of
    cols = ("kind", "h_obs", "h_act", "h_rew", "terminated", "truncated")
    held, placed = {}, 0
    with read(d) as envs:
        for path in sorted(glob.glob(os.path.join(d, "trainer*.npz"))):
            with read(path) as trainer:
                for idx, t in trainer.streams.items():
                    n = len(t.columns["kind"][:])
                    if not n:  # kept for the indices of recreated runners, or another runner's env
                        continue
                    e = envs.streams[idx]
                    pairs = fragments_of(os.path.basename(path), t) or [(0, 0)]
                    for k, (offset, row) in enumerate(pairs):
                        stop = pairs[k + 1][1] if k + 1 < len(pairs) else n
                        for c in cols:
                            a, b = e.columns[c][offset:offset + stop - row], t.columns[c][row:stop]
                            assert len(a) == len(b) and (a == b).all(), (path, idx, c, offset, row)
                        held.setdefault(idx, set()).update(range(offset, offset + stop - row))
                        placed += stop - row
        gaps, tails = {}, {}
        for idx, e in envs.streams.items():
            have = held.get(idx, set())
            end = max(have) + 1 if have else 0
            if end < len(e.columns["kind"][:]):
                tails[idx] = end
            missing = [i for i in range(end) if i not in have]
            for i in missing:
                runs_of = gaps.setdefault(idx, [])
                if runs_of and runs_of[-1][1] == i - 1:
                    runs_of[-1] = (runs_of[-1][0], i)
                else:
                    runs_of.append((i, i))
    return placed, gaps, tails


@pytest.mark.parametrize("name", ["turns-own", "coming-going-2-learners", "rps-parallel"])
def test_rllibs_own_episode_metrics_agree_with_the_env_ledgers_on_ray_2_60(runs, name):
    # what RLlib logged of each episode that ended (its return, each agent's return and steps, each module's
    # return), against the episodes the agents' streams recorded. The shared module of coming-going's run is
    # the case of Ray issue 59860 (one agent's return logged as the module's), fixed by 2.60: clean here;
    # tests/rllib/test_rllib_59860.py has it caught on 2.53.0.
    from stepledger.rllib.episodes import check_rllib_episodes
    spec, _ = runs[name]
    report = check_rllib_episodes(spec["path"])
    assert report.n_compared > 0 and report.ok, str(report)
    assert glob.glob(os.path.join(spec["path"], "rllib-episodes-*.jsonl"))


@pytest.mark.parametrize("setting", ["live", "wrapper fault"])
def test_what_a_multi_agent_env_cannot_have_yet_is_refused_in_one_line(tmp_path, setting):
    # instrument(live=True) and inject(place="wrapper") are single-agent so far: building the env says so
    import rllib_ma_envs
    from stepledger.errors import SettingsError
    from stepledger.rllib.instrument import LedgeredEnvCreator
    creator = LedgeredEnvCreator(rllib_ma_envs.Together, str(tmp_path), live=setting == "live")
    if setting == "wrapper fault":
        creator.fault = {"fault": "obs:f16", "at": 5, "env_index": 0, "record": None}
    with pytest.raises(SettingsError) as caught:
        creator({})
    message = str(caught.value)
    assert "\n" not in message and message.endswith("single-agent only so far; this env is a MultiAgentEnv"), message
    assert message.startswith("stepledger.rllib.instrument: live=True" if setting == "live" else
                              "stepledger.rllib.inject: place='wrapper'"), message
    assert not list(tmp_path.iterdir())  # nothing recorded


# the longer set: defined only with STEPLEDGER_RLLIB_LONG=1 (the RLlib venv run passes with nothing skipped)
if LONG:
    def test_multi_agent_evaluation_runners_record_nothing_and_a_recreated_runner_gets_new_indices(runs):
        spec, out = runs["recreate"]
        d = spec["path"]
        assert out["runner_pids_after"]["2"] != out["runner_pids"]["2"], out
        assert env_indices(d) == [0, 1, 4, 5]
        report = compare(d, os.path.join(d, "trainer.npz"))
        assert sorted(report.envs) == list(range(12))
        assert report.ok, str(report)
        assert noted_gone(report.notes, "env-2.npz") and noted_gone(report.notes, "env-3.npz"), report.notes


    def test_a_multi_agent_run_stopped_by_shutdown_alone_compares_clean_up_to_the_last_flush(runs):
        spec, _ = runs["shutdown"]
        d = spec["path"]
        with read(d) as ledger:
            assert sorted(ledger.streams) == list(range(8))
            states = {s.meta.get("state") for s in ledger.streams.values()}
        assert states <= {S.STATE_SIGNAL, S.STATE_OPEN}, states
        report = compare(d, os.path.join(d, "trainer.npz"))
        assert report.ok, str(report)

    def test_check_rllib_runs_the_multi_agent_matrix_on_one_agent_of_a_registered_multi_agent_env(tmp_path):
        # what `stepledger check ENV_ID --trainer rllib --agent A --place connector` runs, on an env registered with
        # Ray in the same process (the CLI's own process has none registered but Gymnasium's)
        import subprocess
        import sys
        code = ("import json, ray, rllib_ma_envs, stepledger.rllib\n"
                "ray.init(address='local', num_cpus=2, include_dashboard=False, log_to_driver=False)\n"
                "rllib_ma_envs.register()\n"
                "r = stepledger.rllib.check_rllib('ma-together', faults=['obs:f16', 'reward:zero'], runners=1, envs=2, "
                "agent='agent_1', place='connector', directory=%r)\n"
                "print('REPORT', json.dumps(str(r)))\nray.shutdown()\n" % str(tmp_path / "check"))
        environ = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (testpaths.ROOT, testpaths.TESTS_DIR,
                                                                            os.environ.get("PYTHONPATH")) if p))
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=environ,
                              cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        import json
        import re
        out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")][-1][7:])
        assert "clean run: no difference" in out, out
        for fault in ("obs:f16", "reward:zero"):  # env 1's agent_1: stream 1 * 2 + 1
            assert re.search(r"%s\s+caught and located" % fault, out), out


def _move(episode, t, steps=7):
    """Env step ``t`` of a game of players 0 and 1 in turn into a real RLlib MultiAgentEpisode: player t % 2
    moves, the other observes; the last of ``steps`` ends the game with no observation."""
    import numpy as np
    last = t == steps - 1
    episode.add_env_step(observations={} if last else {1 - t % 2: np.full(1, t + 1.0, np.float32)},
                         actions={t % 2: t}, rewards={0: 0.0, 1: 0.0}, infos={},
                         terminateds={0: last, 1: last, "__all__": last},
                         truncateds={0: False, 1: False, "__all__": False})


def _turns(cut_before):
    """The game of ``_move`` up to env step ``cut_before``, cut there as the multi-agent env runner cuts a
    sample (``cut`` with its default lookback of 1, then the returned chunk's agent episodes of no step pruned).
    Returns (the chunk returned, the chunk going on)."""
    import gymnasium as gym
    import numpy as np
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
    space = gym.spaces.Dict({0: gym.spaces.Box(-1, 1, (1,)), 1: gym.spaces.Box(-1, 1, (1,))})
    ep = MultiAgentEpisode(observation_space=space, action_space=gym.spaces.Dict({0: gym.spaces.Discrete(9),
                                                                                  1: gym.spaces.Discrete(9)}))
    ep.add_env_reset(observations={0: np.zeros(1, np.float32)}, infos={})
    for t in range(cut_before):
        _move(ep, t)
    going_on = ep.cut(len_lookback_buffer=1)
    MultiAgentEnvRunner._prune_zero_len_sa_episodes(ep)
    return ep, going_on


@pytest.mark.parametrize("cut_before", [1, 2, 3])
def test_the_last_resets_of_a_turn_based_episode_cut_between_turns_are_each_agents_first_observation(cut_before):
    # a run that ends right after a sample cut between two players' turns: the chunk returned holds no agent
    # episode of no step (RLlib prunes them), so each player whose first observation came with no step since
    # has its reset in no chunk; pending_resets names each of them once, with its agent's stream (env 3, agents
    # 0 and 1: streams 6 and 7), whether the env stepped since the episode began or not
    from types import SimpleNamespace
    from stepledger.rllib.instrument import TAG, pending_resets
    returned, going_on = _turns(cut_before)
    going_on.custom_data[TAG] = 3
    runner = SimpleNamespace(config=SimpleNamespace(in_evaluation=False), _stepledger_agents=[0, 1],
                             _ongoing_episodes=[going_on])
    pending = sorted((stream, sa.agent_id) for stream, sa in pending_resets(runner))
    # before the cut: player 0's reset, and from step 1 on player 1's (its first observation came at step 0)
    assert pending == {1: [(6, 0), (7, 1)], 2: [(7, 1)], 3: []}[cut_before], pending
    assert all(sa.agent_id not in returned.agent_episodes for _, sa in pending_resets(runner))
    runner.config.in_evaluation = True  # an evaluation runner's episodes reach no learner
    assert pending_resets(runner) == []


def test_rllib_loses_the_last_steps_of_players_waiting_for_their_turn_where_a_sample_cut_falls():
    # docs/FINDINGS.md: RLlib 2.60's MultiAgentEpisode.cut, as its multi-agent env runner cuts a sample, drops
    # players' steps where the cut falls between turns (PR 44677 names it): cut before the game's last move (step
    # 6), neither player's last step (the game's outcome) is in any chunk; cut before step 5 (player 1 to move,
    # player 0 waiting), player 1's last step is not. A game of 7 moves gives player 0 four steps, player 1 three.
    for cut_before, lost in ((6, {0: 1, 1: 1}), (5, {0: 0, 1: 1}), (4, {0: 0, 1: 0})):
        returned, going_on = _turns(cut_before)
        for t in range(cut_before, 7):  # the rest of the game, into the chunk going on
            _move(going_on, t)
        steps = {a: sum(len(c.agent_episodes[a]) for c in (returned, going_on) if a in c.agent_episodes)
                 for a in (0, 1)}
        assert steps == {0: 4 - lost[0], 1: 3 - lost[1]}, (cut_before, steps)


def test_the_games_a_runner_drops_are_counted_onto_the_next_game_of_their_env_it_returns():
    # what _count_dropped makes of a runner's sample() calls in complete_episodes (two envs, real RLlib
    # MultiAgentEpisodes, the runner's callbacks called as RLlib calls them): call 1 returns env 0's game and
    # leaves env 1's under way (player 0's reset and 3 steps, player 1's reset and 2 steps); call 2 resets both envs
    # (RLlib deletes the game under way) and returns a game of each: env 1's carries what was dropped before it, by
    # stream (env 1 of agents 0 and 1: streams 2 and 3), and the driver places its events past them
    from types import SimpleNamespace
    import gymnasium as gym
    import numpy as np
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
    from stepledger.rllib.instrument import (DROPPED, TAG, EpisodePositions, _count_dropped, _tag_episode,
                                             pending_dropped)
    space = gym.spaces.Dict({0: gym.spaces.Box(-1, 1, (1,)), 1: gym.spaces.Box(-1, 1, (1,))})
    acts = gym.spaces.Dict({0: gym.spaces.Discrete(9), 1: gym.spaces.Discrete(9)})
    runner = SimpleNamespace(config=SimpleNamespace(in_evaluation=False), _stepledger_agents=[0, 1],
                             _stepledger_base=0, _ongoing_episodes=[None, None])

    def new(i, moves=None):  # moves None: created, not reset yet (RLlib resets it with the env, later)
        ep = MultiAgentEpisode(observation_space=space, action_space=acts)
        runner._ongoing_episodes[i] = ep
        _tag_episode(runner, ep, i)
        if moves is not None:
            ep.add_env_reset(observations={0: np.zeros(1, np.float32)}, infos={})
        for t in range(moves or 0):
            _move(ep, t)
        return ep

    game = new(0, 7)  # sample() 1: env 0's game ends it, env 1's is under way
    going = new(1, 5)
    after = new(0)  # RLlib's next episode of env 0, created at the game's end (reset at the next step)
    runner._ongoing_episodes = [after, going]
    _count_dropped(runner, [game])
    assert DROPPED not in game.custom_data and pending_dropped(runner) == {}  # env 1's game may still go on
    a, b = new(0, 7), new(1, 7)  # sample() 2: both envs reset first, then a game each
    runner._ongoing_episodes = [new(0), new(1)]
    _count_dropped(runner, [a, b])
    assert DROPPED not in a.custom_data, a.custom_data  # `after`, never reset: env 0 lost nothing
    assert b.custom_data[DROPPED] == {2: 1 + 2, 3: 1 + 2}, b.custom_data  # each player's reset and steps
    assert pending_dropped(runner) == {}
    positions = EpisodePositions([0, 1])
    placed = positions.of([game, a, b])
    assert placed[b.agent_episodes[0].id_] == (2, 3) and placed[b.agent_episodes[1].id_] == (3, 3), placed
    assert placed[a.agent_episodes[0].id_] == (0, 5)  # after env 0's first game: player 0's reset and 4 steps
    # a game just reset at the end of a sample() of timesteps, which cut() continues and RLlib does not return
    # (no env step yet): not dropped, the chunk going on brings its reset
    c = new(1, 0)
    runner._ongoing_episodes = [runner._ongoing_episodes[0], c.cut(len_lookback_buffer=1)]
    _count_dropped(runner, [])
    assert pending_dropped(runner) == {}
    assert runner._stepledger_carry[1] is runner._ongoing_episodes[1] and TAG in runner._ongoing_episodes[1].custom_data
    # one reset and dropped with no step: its reset (player 0's first observation) is the event that never came
    runner._ongoing_episodes = [runner._ongoing_episodes[0], new(1)]
    _count_dropped(runner, [])
    assert pending_dropped(runner) == {2: 1}
