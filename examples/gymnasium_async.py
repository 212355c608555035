"""stepledger on Gymnasium's AsyncVectorEnv, top to bottom.

Eight Pendulum-v1 envs run in worker processes. Each is wrapped in LedgerEnv
inside its worker (the env side); the AsyncVectorEnv is wrapped in
LedgerVectorEnv in the trainer's process (the trainer side). After a short
random rollout both sides write their ledgers and compare prints the report.

With --fault, three workers play a faulty bridge: FaultyEnv, outside
LedgerEnv, changes one value each on the way to the trainer (a reward rounded
through float16, an observation rounded through float16, a time limit sent as
a termination), and the report names each one.

    python examples/gymnasium_async.py            # clean: 0 of 8 envs differ
    python examples/gymnasium_async.py --fault    # three envs differ
    python examples/gymnasium_async.py --fault --keep-values   # ...and the report prints the obs values

By default the ledgers keep a digest of each observation and action (the
rewards and end flags exactly), so the report says "obs differs" and where;
--keep-values passes keep_values=True to both sides, which also keep each
observation and action, and the report prints both sides' values.

The ledgers go to a temporary directory that is removed at the end, unless
--keep or --dir DIR is given.
"""

import argparse
import functools
import shutil
import sys
import tempfile

import gymnasium as gym
import numpy as np

from stepledger import LedgerEnv, LedgerVectorEnv, compare
from stepledger.faults import FaultyEnv

EPISODE_STEPS = 25
# env index -> (fault, the env's step counter from which it may hit)
FAULTS = {1: ("reward:f16", 12), 3: ("obs:f16", 40), 4: ("truncated:as-term", 0)}
# --fault needs the faulty envs to exist, and enough vector steps for each fault's first opportunity: the
# step counter `at` is reached after at + 1 steps, plus one vector step for each reset on the way (NEXT_STEP);
# the time limit is the first opportunity of the truncation fault.
MIN_ENVS = max(FAULTS) + 1
MIN_STEPS = max(max(at + 1 + at // EPISODE_STEPS for _, at in FAULTS.values()), EPISODE_STEPS)


def make_env(index, directory, faults, keep_values):
    env = gym.make("Pendulum-v1", max_episode_steps=EPISODE_STEPS)
    env = LedgerEnv(env, directory, index=index, keep_values=keep_values)  # outermost on the env side...
    if index in faults:  # ...but for the injector, which stands for a faulty bridge
        fault, at = faults[index]
        env = FaultyEnv(env, fault, index=index, at=at, target=index)
    return env


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault", action="store_true",
                        help="inject three faults in the workers (needs --num-envs %d and --steps %d at least)"
                             % (MIN_ENVS, MIN_STEPS))
    parser.add_argument("--num-envs", type=int, default=8, help="envs in the AsyncVectorEnv (default: 8)")
    parser.add_argument("--steps", type=int, default=100, help="vector steps (default: 100)")
    parser.add_argument("--dir", default=None, help="where the ledgers go (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--keep-values", action="store_true",
                        help="keep_values=True on both sides: the report prints the observations and actions that "
                             "differ (default: their digests only)")
    args = parser.parse_args()
    if args.num_envs < 1 or args.steps < 1:
        parser.error("--num-envs and --steps must be at least 1")
    if args.fault and args.num_envs < MIN_ENVS:
        parser.error("--fault injects into envs %s, so it needs --num-envs %d or more (got %d)"
                     % (", ".join(map(str, sorted(FAULTS))), MIN_ENVS, args.num_envs))
    if args.fault and args.steps < MIN_STEPS:
        parser.error("--fault needs --steps %d or more: with fewer, env 3's observation fault never has its "
                     "first opportunity (got %d)" % (MIN_STEPS, args.steps))

    directory = args.dir or tempfile.mkdtemp(prefix="stepledger-example-")
    faults = FAULTS if args.fault else {}
    envs = gym.vector.AsyncVectorEnv([functools.partial(make_env, i, directory, faults, args.keep_values)
                                      for i in range(args.num_envs)])
    # innermost on the trainer side, with the same keep_values as the env side
    envs = LedgerVectorEnv(envs, directory + "/trainer.npz", keep_values=args.keep_values)

    envs.single_action_space.seed(0)
    actions = [np.stack([envs.single_action_space.sample() for _ in range(args.num_envs)]) for _ in range(args.steps)]
    envs.reset(seed=0)
    for a in actions:
        envs.step(a)
    envs.close()  # both sides write their ledgers here

    report = compare(directory, directory + "/trainer.npz")
    print(report)
    if args.dir or args.keep:
        print("ledgers in", directory)
    else:
        shutil.rmtree(directory, ignore_errors=True)
    return 0 if report.ok != args.fault else 1


if __name__ == "__main__":
    sys.exit(main())
