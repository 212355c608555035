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

It needs Stable-Baselines3, the [sb3] extra: pip install "plugrl-stepledger[sb3]".
The ledgers go to a temporary directory that is removed at the end, unless
--keep or --dir DIR is given.
"""

import argparse
import functools
import shutil
import sys
import tempfile

import gymnasium as gym

from stepledger import LedgerEnv, compare
from stepledger.faults import FaultyEnv

FAULTY_ENV, FAULT_AT = 2, 300  # env 2's reward, from its 300th step on (PPO's first rollout has 1024 per env)


def make_env(index, directory, fault):
    env = LedgerEnv(gym.make("Pendulum-v1"), directory, index=index)
    if fault and index == FAULTY_ENV:
        env = FaultyEnv(env, "reward:f16", index=index, at=FAULT_AT, target=FAULTY_ENV)
    return env


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault", action="store_true",
                        help="round one reward of env %d through float16 (needs --num-envs %d or more)"
                             % (FAULTY_ENV, FAULTY_ENV + 1))
    parser.add_argument("--num-envs", type=int, default=4, help="envs in the SubprocVecEnv (default: 4)")
    parser.add_argument("--steps", type=int, default=8192, help="PPO timesteps (default: 8192)")
    parser.add_argument("--seed", type=int, default=0, help="PPO's seed (default: 0)")
    parser.add_argument("--dir", default=None, help="where the ledgers go (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    if args.num_envs < 1 or args.steps < 1:
        parser.error("--num-envs and --steps must be at least 1")
    if args.fault and args.num_envs <= FAULTY_ENV:
        parser.error("--fault injects into env %d, so it needs --num-envs %d or more (got %d)"
                     % (FAULTY_ENV, FAULTY_ENV + 1, args.num_envs))
    try:
        from stable_baselines3 import PPO
        from stable_baselines3.common.vec_env import SubprocVecEnv

        from stepledger.sb3 import LedgerVecEnv
    except ImportError:
        parser.exit(2, "%s: needs Stable-Baselines3, the [sb3] extra: pip install \"plugrl-stepledger[sb3]\"\n"
                    % parser.prog)

    directory = args.dir or tempfile.mkdtemp(prefix="stepledger-sb3-")
    venv = SubprocVecEnv([functools.partial(make_env, i, directory, args.fault) for i in range(args.num_envs)])
    venv = LedgerVecEnv(venv, directory + "/trainer.npz")
    model = PPO("MlpPolicy", venv, n_steps=1024, seed=args.seed, verbose=0)
    model.learn(args.steps)
    venv.close()

    report = compare(directory, directory + "/trainer.npz")
    print(report)
    if args.dir or args.keep:
        print("ledgers in", directory)
    else:
        shutil.rmtree(directory, ignore_errors=True)
    return 0 if report.ok != args.fault else 1


if __name__ == "__main__":
    sys.exit(main())
