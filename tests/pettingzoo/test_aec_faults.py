"""The multi-agent fault kit on turn-based envs (issue 26): FaultyAECEnv between LedgerAECEnv and the
hand-written agent_iter loop, each of TURN_FAULTS on one agent of tic-tac-toe and connect four, caught and
located at its agent, episode, step and field; check_turns, the check over all of them."""

import tempfile

import pytest

pytest.importorskip("pettingzoo")

from pettingzoo.classic import connect_four_v3, tictactoe_v3  # noqa: E402

from stepledger.faults.check import is_located  # noqa: E402
from stepledger.faults.engine import TURN_FAULTS  # noqa: E402
from stepledger.pettingzoo import FaultyAECEnv, LedgerAECEnv  # noqa: E402
from stepledger.pettingzoo.check import check_turns, turn_rollout  # noqa: E402

GAMES = {"tictactoe": tictactoe_v3, "connect_four": connect_four_v3}
# classic games' values are integral and their actions Discrete, and no game ends in a time limit: these faults
# find no value they would change
NO_OPPORTUNITY = {"obs:f16", "action:f16", "reward:f16", "final-obs:f16", "action:clip", "truncated:as-term"}


@pytest.mark.parametrize("game", sorted(GAMES))
@pytest.mark.parametrize("fault", TURN_FAULTS)
def test_turn_fault_is_caught_and_located(tmp_path, game, fault):
    agents = GAMES[game].env().possible_agents
    for agent in agents:  # each agent of the game: the first and the second mover
        d = str(tmp_path / agent)
        report, injected = turn_rollout(GAMES[game].env, 8, d, fault, agent, at=2)
        if fault in NO_OPPORTUNITY:
            assert injected is None and report.ok, str(report)
            continue
        assert injected is not None, "%s found no opportunity on %s" % (fault, agent)
        k = agents.index(agent)
        diff = report.by_env().get(k)
        assert is_located(diff, injected), "%s hit at %s, compare said: %s" % (fault, injected, report)
        assert diff.line().startswith("env 0, agent %s, episode %d, step %d: " % (
            agent, injected["episode"], injected["step"])), diff.line()
        assert set(report.by_env()) == {k}, str(report)  # the other agent's stream is clean


def test_check_turns_on_tictactoe():
    out = check_turns(tictactoe_v3.env, games=8)
    text = str(out)
    assert text.splitlines()[0] == "clean run: no difference"
    assert text.splitlines()[-1] == "%d of %d exercised faults caught and located; the boundary is checked" % (
        len(TURN_FAULTS) - len(NO_OPPORTUNITY), len(TURN_FAULTS) - len(NO_OPPORTUNITY)), text
    assert ("reward:others          caught and located  (injected at env 0, agent player_2, episode "
            in text), text


def test_a_leaving_agents_none_step_is_taken_by_the_injector():
    """agent:no-last: the injector steps the leaving agent with None itself, so the trainer never gets its
    last turn; the env side recorded it (LedgerAECEnv records the turn at the injector's last())."""
    d = tempfile.mkdtemp()
    report, injected = turn_rollout(tictactoe_v3.env, 4, d, "agent:no-last", "player_1", at=0)
    line = report.by_env()[0].line()
    assert injected["field"] == "kind" and "kind differs (env gave step, trainer received reset)" in line, line


def test_unknown_fault_and_agent_are_one_line(tmp_path):
    env = LedgerAECEnv(tictactoe_v3.env(), str(tmp_path), index=0)
    with pytest.raises(ValueError, match="^FaultyAECEnv: unknown or unsupported fault 'step:fill'"):
        FaultyAECEnv(env, "step:fill")
    with pytest.raises(ValueError, match="^FaultyAECEnv: agent 'nobody' is not one of possible_agents"):
        FaultyAECEnv(env, "reward:zero", agent="nobody")


def test_stepledger_check_on_a_turn_based_env():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "stepledger", "check", "pettingzoo.classic.connect_four_v3",
                          "--trainer", "supersuit", "--steps", "8"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().splitlines()[-1] == "12 of 12 exercised faults caught and located; the boundary is checked"
    bad = subprocess.run([sys.executable, "-m", "stepledger", "check", "json", "--trainer", "supersuit", "--api",
                          "aec"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "cannot make turn-based env 'json': it has no env()" in bad.stderr, bad.stderr
