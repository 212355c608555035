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
"""

import argparse
import functools
import tempfile

import gymnasium as gym
import numpy as np

from stepledger import LedgerEnv, LedgerVectorEnv, compare
from stepledger.faults import FaultyEnv

FAULTS = {1: ("reward:f16", 12), 3: ("obs:f16", 40), 4: ("truncated:as-term", 0)}


def make_env(index, directory, faults):
    env = gym.make("Pendulum-v1", max_episode_steps=25)
    env = LedgerEnv(env, directory, index=index, keep_values=True)  # outermost on the env side...
    if index in faults:  # ...but for the injector, which stands for a faulty bridge
        fault, at = faults[index]
        env = FaultyEnv(env, fault, index=index, at=at, target=index)
    return env


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault", action="store_true", help="inject three faults in the workers")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100, help="vector steps")
    parser.add_argument("--dir", default=None, help="where the ledgers go (default: a new temporary directory)")
    args = parser.parse_args()

    directory = args.dir or tempfile.mkdtemp(prefix="stepledger-example-")
    faults = FAULTS if args.fault else {}
    envs = gym.vector.AsyncVectorEnv([functools.partial(make_env, i, directory, faults) for i in range(args.num_envs)])
    envs = LedgerVectorEnv(envs, directory + "/trainer.npz", keep_values=True)  # innermost on the trainer side

    envs.single_action_space.seed(0)
    actions = [np.stack([envs.single_action_space.sample() for _ in range(args.num_envs)]) for _ in range(args.steps)]
    envs.reset(seed=0)
    for a in actions:
        envs.step(a)
    envs.close()  # both sides write their ledgers here

    report = compare(directory, directory + "/trainer.npz")
    print(report)
    print("ledgers in", directory)


if __name__ == "__main__":
    main()
