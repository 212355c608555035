"""PPO on Pendulum-v1 through SB3's SubprocVecEnv, with both ledgers, compared at the end.

Each env is wrapped in LedgerEnv inside its worker; the SubprocVecEnv is
wrapped in stepledger.sb3.LedgerVecEnv, innermost on the trainer side (a
VecNormalize would go outside it). PPO edits the reward array it gets back in
place at time limits; the ledger digests values as they arrive, so it is
untouched by that.

With --fault, env 2's worker rounds one reward through float16 on its way to
the trainer, and the report names the env, episode and step.

    python examples/sb3_pendulum.py --steps 8192
    python examples/sb3_pendulum.py --steps 8192 --fault
"""

import argparse
import functools
import tempfile

import gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import SubprocVecEnv

from stepledger import LedgerEnv, compare
from stepledger.faults import FaultyEnv
from stepledger.sb3 import LedgerVecEnv


def make_env(index, directory, fault):
    env = LedgerEnv(gym.make("Pendulum-v1"), directory, index=index)
    if fault and index == 2:
        env = FaultyEnv(env, "reward:f16", index=index, at=300, target=2)
    return env


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault", action="store_true", help="round one reward of env 2 through float16")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8192, help="PPO timesteps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", default=None, help="where the ledgers go (default: a new temporary directory)")
    args = parser.parse_args()

    directory = args.dir or tempfile.mkdtemp(prefix="stepledger-sb3-")
    venv = SubprocVecEnv([functools.partial(make_env, i, directory, args.fault) for i in range(args.num_envs)])
    venv = LedgerVecEnv(venv, directory + "/trainer.npz")
    model = PPO("MlpPolicy", venv, n_steps=1024, seed=args.seed, verbose=0)
    model.learn(args.steps)
    venv.close()

    print(compare(directory, directory + "/trainer.npz"))
    print("ledgers in", directory)


if __name__ == "__main__":
    main()
