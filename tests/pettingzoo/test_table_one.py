"""The paper's Table I as tests (issue 26): each row that is a boundary fault, caught and located by compare, on
the real library where the affected version installs and as an injected fault of the same class where it does
not, each with a clean control. Tianshou issue 399 is real on tianshou 2.0.1 and lives in
tests/tianshou/test_tianshou_multiagent.py; SuperSuit's two faults stepledger already reported stay where they
were (black_death_v3's padding: tests/pettingzoo/test_pettingzoo.py and test_multiagent_faults.py; truncation
as termination in SuperSuit's SB3 form: test_pettingzoo.py)."""

import functools
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

pytest.importorskip("pettingzoo")

from pettingzoo.classic import connect_four_v3, tictactoe_v3  # noqa: E402

import stepledger  # noqa: E402
from aec_games import run  # noqa: E402
from side_venv import cached_venv, imported_version  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.abspath(stepledger.__file__)))
SS390_VENV = os.environ.get("STEPLEDGER_SS390_VENV") or os.path.join(
    tempfile.gettempdir(), "stepledger-ss390-venv-py%d%d" % sys.version_info[:2])


def script(python, name, d, *args):
    """Run tests/pettingzoo/NAME with ``python`` on this checkout (its pure-Python core in a side venv); its
    output lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_") and k != "PYTHONPATH"}
    env.update(PYTHONPATH=REPO, PYTHONWARNINGS="ignore")
    if python != sys.executable:
        env["STEPLEDGER_PUREPYTHON"] = "1"
    out = subprocess.run([python, os.path.join(HERE, name), d, *args], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()


# ---------------------------------------------------------------- RLlib pull request 31156 (injected)

def zero_the_enders_reward(state, agent, values):
    """The class of RLlib PR 31156: the agent whose move ended the game gets reward 0 on its way to the trainer,
    in place of what the env gave it (an agent with no last observation got 0)."""
    obs, reward, term, trunc = values
    if not (term or trunc):
        state["mover"] = agent  # it acts now
    elif agent == state.get("mover") and reward != 0 and "hit" not in state:
        state["hit"] = (agent, float(reward))
        values[1] = 0.0


@pytest.mark.parametrize("game", [tictactoe_v3, connect_four_v3])
def test_rllib_31156_class_the_enders_reward_is_caught_and_located(tmp_path, game):
    state = {}
    report, _, agents = run(str(tmp_path), game.env, games=8, on_turn=functools.partial(zero_the_enders_reward,
                                                                                        state))
    assert "hit" in state, "no game was won in these 8"
    agent, reward = state["hit"]
    assert [(x.env, x.fields) for x in report.differences] == [(agents.index(agent), ("reward",))], str(report)
    x = report.differences[0]
    assert str(report).splitlines()[0] == ("env 0, agent %s, episode %d, step %d: reward differs (env gave %s, "
                                           "trainer received 0.0)" % (agent, x.episode, x.step, reward))


@pytest.mark.parametrize("game", [tictactoe_v3, connect_four_v3])
def test_rllib_31156_clean_control(tmp_path, game):
    report, _, _ = run(str(tmp_path), game.env, games=8)
    assert report.ok, str(report)


# ---------------------------------------------------------------- PettingZoo issue 939 (1.22.3, and injected)

def test_pettingzoo_939_reproduced_on_1_22_3(tmp_path, pz122_python):
    """pettingzoo 1.22.3's parallel_to_aec_wrapper does ``action = int(action)``: under NumPy 1.26 the 1-D
    continuous actions [0.7] and [-0.6] reach the env as 0, silently."""
    lines = script(pz122_python, "table_one_939.py", str(tmp_path))
    assert lines[0].startswith("pettingzoo 1.22.3 numpy 1.")
    assert lines[1:3] == [
        "env 0, agent car_0, episode 0, step 1: action differs (env gave 0.0 (shape (), the space's is (1,)), "
        "trainer received [0.7])",
        "env 0, agent car_1, episode 0, step 1: action differs (env gave 0.0 (shape (), the space's is (1,)), "
        "trainer received [-0.6])"]
    assert "2 of 2 agent streams differ" in lines


def test_pettingzoo_939_class_injected_on_the_current_version(tmp_path):
    lines = script(sys.executable, "table_one_939.py", str(tmp_path), "cast")
    assert lines[1] == ("env 0, agent car_0, episode 0, step 1: action differs (env gave 0.0 (shape (), the "
                        "space's is (1,)), trainer received [0.7])")


def test_pettingzoo_939_clean_control_on_the_current_version(tmp_path):
    """pettingzoo 1.27's parallel_to_aec has no cast: the same run compares clean."""
    lines = script(sys.executable, "table_one_939.py", str(tmp_path))
    assert lines[1:] == ["0 of 2 agent streams differ"], lines


# ---------------------------------------------------------------- SuperSuit issue 232 (3.9.0)

@pytest.fixture(scope="session")
def ss390_python():
    """A Python with supersuit==3.9.0 (its MarkovVectorEnv has ``observations, infs = self.reset()`` at an
    episode's end, as 3.8.1 has; 3.7.0 keeps the infos, 3.9.1 fixed it: read in their sources) beside
    pettingzoo 1.24.3, which still ships the MPE envs."""
    return cached_venv(SS390_VENV, "stepledger-ss390-ready", "supersuit==3.9.0",
                       [["supersuit==3.9.0", "pettingzoo[mpe]==1.24.3", "gymnasium", "numpy"]],
                       lambda python: imported_version(python, "supersuit", "supersuit"), "3.9.0")


def test_supersuit_232_reproduced_on_3_9_0(tmp_path, ss390_python):
    """Every agent's final observation at the first time limit (step 5) is lost: compare names each stream there."""
    lines = script(ss390_python, "table_one_232.py", str(tmp_path))
    assert lines[0] == "supersuit 3.9.0 pettingzoo 1.24.3"
    assert lines[1:7] == ["env %d, agent agent_%d, episode 0, step 5: obs differs" % (s // 3, s % 3)
                          for s in range(6)], lines
    assert "6 of 6 agent streams differ" in lines


def test_supersuit_232_clean_control_on_the_current_version(tmp_path):
    pytest.importorskip("supersuit")
    pytest.importorskip("mpe2")
    lines = script(sys.executable, "table_one_232.py", str(tmp_path))
    assert lines[1:] == ["0 of 6 agent streams differ"], lines


# ---------------------------------------------------------------- on-policy (MAPPO) pull request 86 (injected)

def test_mappo_86_class_padded_steps_are_named_as_steps_the_env_never_took(tmp_path):
    """The class of on-policy PR 86: an agent that died is padded on, its padded steps flagged not done;
    FaultyParallelEnv's agent:pad injects it, and compare names them as steps the env never took."""
    pytest.importorskip("supersuit")
    from parallel_envs import LeavesApart
    from stepledger.pettingzoo.check import supersuit_rollout
    report, injected = supersuit_rollout(LeavesApart, "gymnasium", 2, 0, 12, str(tmp_path), "agent:pad", target=1,
                                         agent="agent_1", at=2, dose="all")
    assert injected
    lines = [x.line() for x in report.differences if x.env in injected]
    assert lines and all("agent agent_1 left here (terminated) but the trainer was not told, and then received "
                         in ln and " steps the env never took" in ln for ln in lines), str(report)


def test_mappo_86_clean_control(tmp_path):
    """The same rollout with no padding on an env whose agents leave together compares clean."""
    pytest.importorskip("supersuit")
    from parallel_envs import TogetherEnv
    from stepledger.pettingzoo.check import supersuit_rollout
    report, injected = supersuit_rollout(TogetherEnv, "gymnasium", 2, 0, 12, str(tmp_path))
    assert report.ok and not injected, str(report)
