"""What the turn-based (AEC) ledgers cost per agent turn, side by side with the bare loop, in one run.

PettingZoo's tic-tac-toe (``tictactoe_v3.env()``, its own wrappers included) played by the hand-written
``agent_iter`` loop, random legal moves from a generator seeded per game (so every configuration plays the same
games): no ledger, ``LedgerAECEnv`` (env side), and ``LedgerAECEnv`` + ``TurnLedger`` (both sides). The
configurations take turns game block by game block; each block is set against the bare loop's block of the
same round (paired differences, medians over the blocks), so a busy moment on a shared machine falls on both
sides of a pair. A turn is one iteration of the loop: ``last()``, choosing the move, ``step()``.

    python benchmarks/aec_overhead.py            # prints the figures
    python benchmarks/aec_overhead.py --quick    # a smoke run
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings

import numpy as np

CONFIGS = ("none", "env", "both")


def build(config, directory):
    from pettingzoo.classic import tictactoe_v3
    from stepledger.pettingzoo import LedgerAECEnv, TurnLedger
    env = tictactoe_v3.env()
    turns = None
    if config != "none":
        env = LedgerAECEnv(env, directory, index=0)
    if config == "both":
        a = env.possible_agents[0]
        turns = TurnLedger(os.path.join(directory, "trainer.npz"), env.possible_agents, env.observation_space(a),
                           env.action_space(a))
    return env, turns


def block(env, turns, first_game, games):
    """Play ``games`` games; returns (seconds, turns taken)."""
    n = 0
    t0 = time.perf_counter()
    for g in range(first_game, first_game + games):
        rng = np.random.default_rng(g)
        env.reset(seed=g)
        for agent in env.agent_iter():
            obs, reward, term, trunc, _ = env.last()
            if turns is not None:
                turns.observed(agent, obs, reward, term, trunc)
            action = None if term or trunc else int(rng.choice(np.flatnonzero(obs["action_mask"])))
            if turns is not None:
                turns.acted(agent, action)
            env.step(action)
            n += 1
    return time.perf_counter() - t0, n


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=60, help="blocks of games per configuration")
    p.add_argument("--games", type=int, default=20, help="games per block")
    p.add_argument("--quick", action="store_true", help="a smoke run")
    args = p.parse_args()
    if args.quick:
        args.blocks, args.games = 4, 3
    warnings.simplefilter("ignore")
    root = tempfile.mkdtemp(prefix="stepledger-aec-bench-")
    try:
        built = {c: build(c, os.path.join(root, c)) for c in CONFIGS}
        per_turn = {c: [] for c in CONFIGS}
        counts = {}
        for b in range(args.blocks):
            for c in CONFIGS:
                env, turns = built[c]
                seconds, n = block(env, turns, b * args.games, args.games)
                per_turn[c].append(seconds / n * 1e6)
                counts[c] = counts.get(c, 0) + n
        for env, turns in built.values():
            env.close()
            if turns is not None:
                turns.close()
        assert len(set(counts.values())) == 1, counts  # the same games in every configuration
        bare = statistics.median(per_turn["none"])
        print("tic-tac-toe, %d turns per configuration (%d blocks of %d games)" % (counts["none"], args.blocks,
                                                                                  args.games))
        print("bare loop: %.2f us a turn (median over blocks)" % bare)
        for c, name in (("env", "LedgerAECEnv (env side)"), ("both", "LedgerAECEnv + TurnLedger (both sides)")):
            diffs = [x - y for x, y in zip(per_turn[c], per_turn["none"])]
            ratios = [x / y for x, y in zip(per_turn[c], per_turn["none"])]
            print("%s: +%.2f us a turn, %.3fx (paired medians)" % (name, statistics.median(diffs),
                                                                  statistics.median(ratios)))
        if "both" in per_turn:
            print("load average: %.1f" % os.getloadavg()[0])
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
