"""Games of a PettingZoo turn-based env through the hand-written agent_iter loop, LedgerAECEnv on the env side and
TurnLedger on the trainer side (tests/pettingzoo/test_aec.py, tests/pettingzoo/test_table_one.py, the Tianshou
control)."""

import os

import numpy as np

from stepledger import compare
from stepledger.pettingzoo import LedgerAECEnv, TurnLedger


def play(env, turns, games, seed=0, on_turn=None):
    """``games`` games of random legal moves through the agent_iter loop, the trainer side fed by ``turns``;
    ``on_turn(agent, values)`` may change (obs, reward, termination, truncation) on their way to the trainer.
    Returns each agent's actions taken, per game."""
    rng = np.random.default_rng(seed)
    taken = []
    for game in range(games):
        env.reset(seed=seed + game)
        moves = {a: 0 for a in env.possible_agents}
        for agent in env.agent_iter():
            obs, reward, term, trunc, info = env.last()
            values = [obs, reward, term, trunc]
            if on_turn is not None:
                on_turn(agent, values)
            turns.observed(agent, *values)
            mask = obs["action_mask"] if isinstance(obs, dict) else np.ones(env.action_space(agent).n)
            action = None if term or trunc else int(rng.choice(np.flatnonzero(mask)))
            turns.acted(agent, action)
            if action is not None:
                moves[agent] += 1
            env.step(action)
        taken.append(moves)
    return taken


def run(d, make, games=4, on_turn=None, index=0):
    env = LedgerAECEnv(make(), d, index=index)
    agent = env.possible_agents[0]
    turns = TurnLedger(os.path.join(d, "trainer.npz"), env.possible_agents, env.observation_space(agent),
                       env.action_space(agent))
    taken = play(env, turns, games, on_turn=on_turn)
    env.close()
    turns.close()
    return compare(d, os.path.join(d, "trainer.npz")), taken, env.possible_agents


