"""OpenSpiel games as turn-based envs (issue 26): Shimmy's OpenSpielCompatibilityV0 (a PettingZoo AEC env over
open_spiel's pyspiel) recorded by LedgerAECEnv on the env side and TurnLedger in the hand-written agent_iter
loop on the trainer side. tic_tac_toe (turn-taking), leduc_poker (chance nodes: the deal, drawn by Shimmy from
the reset's seed) and goofspiel (simultaneous moves, which Shimmy takes one agent a turn) compare clean, and the
turn-based fault kit's faults on them are caught and located, RLlib PR 31156's class (reward:ender, found in
OpenSpiel games) among them."""

import functools

import pytest

try:
    import pyspiel  # noqa: F401
    from shimmy import OpenSpielCompatibilityV0
except Exception as exc:  # ImportError, or an open_spiel wheel that does not load here
    pytest.skip("OpenSpiel games need open_spiel and shimmy (pip install open_spiel==2.0.2 shimmy==2.0.1, the "
                "test extra): %s: %s" % (type(exc).__name__, exc), allow_module_level=True)

from stepledger.faults.check import clean_steps, is_located  # noqa: E402
from stepledger.faults.engine import TURN_FAULTS  # noqa: E402
from stepledger.pettingzoo.check import check_turns, turn_rollout  # noqa: E402
from stepledger.report.read import read  # noqa: E402

GAMES = ("tic_tac_toe", "leduc_poker", "goofspiel")
AGENTS = ["player_0", "player_1"]
# OpenSpiel refuses an illegal action (pyspiel.SpielError): the faults that send the env another action than the
# trainer's cannot run on it
REFUSED = ("action:zero", "action:stale")


def game(name):
    return functools.partial(OpenSpielCompatibilityV0, game_name=name)


@pytest.mark.parametrize("name", GAMES)
def test_openspiel_game_compares_clean(tmp_path, name):
    report, injected = turn_rollout(game(name), 6, str(tmp_path))
    assert injected is None and report.ok, str(report)
    with read(str(tmp_path / "env-0.npz")) as env_side, read(str(tmp_path / "trainer.npz")) as trainer_side:
        assert env_side.meta["possible_agents"] == AGENTS
        for k in range(len(AGENTS)):
            env_kinds = list(env_side.streams[k].columns["kind"])
            assert env_kinds == list(trainer_side.streams[k].columns["kind"])
            assert env_kinds.count(0) == 6 and env_kinds.count(1) >= 6, env_kinds  # 6 games, a step or more each
    term, trunc = clean_steps(str(tmp_path), 0, 1)
    assert (term | trunc).sum() == 6  # each of player_1's games ended, and the ledger says so


@pytest.mark.parametrize("name", ["leduc_poker", "goofspiel"])  # tic-tac-toe's is PettingZoo's (test_aec_faults.py)
def test_check_turns_on_an_openspiel_game(name):
    out = check_turns(game(name), games=6, faults=[f for f in TURN_FAULTS if f not in REFUSED])
    last = str(out).splitlines()[-1]
    n = int(last.split()[0])
    assert n >= 6 and last == "%d of %d exercised faults caught and located; the boundary is checked" % (n, n), \
        str(out)


@pytest.mark.parametrize("name, fault, agent", [
    ("tic_tac_toe", "reward:ender", "player_0"),  # RLlib PR 31156's class: the winner's last reward becomes 0
    ("leduc_poker", "reward:others", "player_1"),  # Tianshou issue 399's class: what the other's move gave, dropped
    ("goofspiel", "final-obs:zero", "player_0"),
])
def test_openspiel_fault_is_caught_and_located(tmp_path, name, fault, agent):
    report, injected = turn_rollout(game(name), 6, str(tmp_path), fault, agent, at=0)
    assert injected is not None, "%s found no opportunity on %s" % (fault, name)
    k = AGENTS.index(agent)
    diff = report.by_env().get(k)
    assert is_located(diff, injected), "%s hit at %s, compare said: %s" % (fault, injected, report)
    assert diff.line().startswith("env 0, agent %s, episode %d, step %d: %s differs" % (
        agent, injected["episode"], injected["step"], injected["field"])), diff.line()
    assert set(report.by_env()) == {k}, str(report)  # the other agent's stream is clean
