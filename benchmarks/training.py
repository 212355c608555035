"""A ledger leaves training untouched: SB3 PPO with and without both ledgers.

PPO on Pendulum-v1 with rl-baselines3-zoo's tuned settings and on
HalfCheetah-v5 with SB3's defaults, 16 envs through SubprocVecEnv, each run
twice per seed: once bare, once with both ledgers (LedgerEnv outermost in each
worker, stepledger.sb3.LedgerVecEnv innermost around the SubprocVecEnv). The
two runs of a seed are interleaved, in alternating order from seed to seed, so
a busy moment on a shared machine hits both alike.

Reported per env: learn() time with and without ledgers and the median of
the per-seed ratios (the paper: a median 3% more training time on Pendulum);
whether the final policy weights are byte-identical (SHA-256 of the policy's
state_dict, each tensor's bytes in key order; the paper found all 216 runs
unchanged); and whether the two ledgers of each ledgered run compare clean.

torch runs on one thread, so that a run is deterministic given its seed.

    python benchmarks/training.py             # the default run: about 5 minutes on a
                                              # busy 2-core machine; writes RESULTS.md
    python benchmarks/training.py --pendulum-steps 100000 --cheetah-steps 1000000 --seeds 0 1 2
                                              # rl-zoo's Pendulum budget, 1M HalfCheetah steps
    python benchmarks/training.py --quick     # a smoke run (about 10 s), writes nothing

PPO collects whole rollouts of n_steps per env, so a run's timesteps are
rounded up to a multiple of n_steps x 16: 16,384 on Pendulum (n_steps 1024),
32,768 on HalfCheetah (SB3's n_steps 2048). HalfCheetah needs
gymnasium[mujoco]; without it that env is skipped, and said so.
"""

import argparse
import functools
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time

import gymnasium as gym
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import SubprocVecEnv

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import machine, show  # noqa: E402

from stepledger import LedgerEnv, compare  # noqa: E402
from stepledger.sb3 import LedgerVecEnv  # noqa: E402

# rl-baselines3-zoo, hyperparams/ppo.yml, "Pendulum-v1" (tuned); it uses 4 envs, here 16.
PENDULUM = dict(n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0, learning_rate=1e-3,
                clip_range=0.2, use_sde=True, sde_sample_freq=4)
CHEETAH = {}  # SB3's defaults
PAPER_RATIO = 1.03  # the paper's median on Pendulum


def quiet_mujoco():
    """MuJoCo 4 warns that HalfCheetah's model uses 'settotalmass' each time one is built, and appends the
    warning to MUJOCO_LOG.TXT in the working directory: drop that one, pass any other to stderr."""
    try:
        import mujoco
    except ImportError:
        return
    mujoco.set_mju_user_warning(
        lambda msg: None if "settotalmass" in msg else print("MuJoCo warning: " + msg, file=sys.stderr))


def make_env(env_id, ledger_dir, index):
    quiet_mujoco()  # in the worker
    env = gym.make(env_id)
    if ledger_dir is not None:
        env = LedgerEnv(env, ledger_dir, index=index)  # outermost, in the worker
    return env


def policy_sha256(model):
    """SHA-256 over the policy's state_dict: each tensor's bytes, in key order."""
    h = hashlib.sha256()
    for key, tensor in model.policy.state_dict().items():
        h.update(key.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def run(env_id, hyper, timesteps, seed, n_envs, ledger_dir, start_method):
    """One PPO run; returns learn() seconds, the weights' SHA-256 and, with ledgers, the comparison."""
    venv = SubprocVecEnv([functools.partial(make_env, env_id, ledger_dir, i) for i in range(n_envs)],
                         start_method=start_method)
    trainer = None
    if ledger_dir is not None:
        trainer = os.path.join(ledger_dir, "trainer.npz")
        venv = LedgerVecEnv(venv, trainer)  # innermost, around the SubprocVecEnv
    model = PPO("MlpPolicy", venv, seed=seed, device="cpu", verbose=0, **hyper)
    t0 = time.perf_counter()
    model.learn(timesteps)
    seconds = time.perf_counter() - t0
    venv.close()  # both sides write their ledgers
    out = {"seconds": seconds, "sha": policy_sha256(model), "steps": model.num_timesteps}
    if ledger_dir is not None:
        report = compare(ledger_dir, trainer)
        out["clean"] = bool(report)
        out["report"] = str(report)
    return out


def available(env_id):
    try:
        gym.make(env_id).close()
        return True
    except Exception as exc:  # e.g. mujoco not installed
        print("%s skipped: %s" % (env_id, exc), file=sys.stderr)
        return False


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pendulum-steps", type=int, default=16_384, help="timesteps a Pendulum-v1 run (0: skip)")
    p.add_argument("--cheetah-steps", type=int, default=32_768, help="timesteps a HalfCheetah-v5 run (0: skip)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--start-method", default="fork", choices=("fork", "forkserver", "spawn"),
                   help="how SubprocVecEnv starts its workers (default fork: forkserver took about 50 s to start "
                        "16 workers on a busy 2-core machine; the start is not timed either way)")
    p.add_argument("--tmpdir", default=None, help="where the ledgers go (default: the system's temporary directory)")
    p.add_argument("--no-write", action="store_true", help="print the table only, leave RESULTS.md alone")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 4 envs, n_steps 32, 1 epoch, seed 0; writes nothing")
    args = p.parse_args()
    torch.set_num_threads(1)
    quiet_mujoco()
    envs = [("Pendulum-v1", dict(PENDULUM), args.pendulum_steps), ("HalfCheetah-v5", dict(CHEETAH), args.cheetah_steps)]
    if args.quick:
        args.seeds, args.num_envs = [0], 4
        envs = [(e, dict(h, n_steps=32, n_epochs=1, batch_size=64), 128) for e, h, _ in envs]
    envs = [(e, h, t) for e, h, t in envs if t > 0 and available(e)]

    started = time.perf_counter()
    results = {}  # (env, seed) -> {"bare": ..., "ledgers": ...}
    for k, seed in enumerate(args.seeds):
        for j, (env_id, hyper, steps) in enumerate(envs):
            order = ("ledgers", "bare") if (k + j) % 2 else ("bare", "ledgers")  # alternates from seed to seed
            for config in order:
                d = tempfile.mkdtemp(prefix="stepledger-training-", dir=args.tmpdir) if config == "ledgers" else None
                try:
                    r = run(env_id, hyper, steps, seed, args.num_envs, d, args.start_method)
                finally:
                    if d:
                        shutil.rmtree(d, ignore_errors=True)
                results.setdefault((env_id, seed), {})[config] = r
                print("%s seed %d %s: learn() %.2f s, weights %s%s" % (
                    env_id, seed, config, r["seconds"], r["sha"][:12],
                    "" if config == "bare" else ", ledgers compare clean" if r["clean"] else
                    ", LEDGERS DIFFER:\n" + r["report"]), file=sys.stderr, flush=True)

    rows = ["| env | seed | timesteps | learn() without | learn() with | ratio | weights (SHA-256) | identical "
            "| ledgers compare |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    summary = []
    for env_id, hyper, steps in envs:
        ratios, same, clean = [], 0, 0
        for seed in args.seeds:
            r = results[(env_id, seed)]
            bare, led = r["bare"], r["ledgers"]
            ratio = led["seconds"] / bare["seconds"]
            ratios.append(ratio)
            same += bare["sha"] == led["sha"]
            clean += led["clean"]
            rows.append("| %s | %d | %s | %.2f s | %.2f s | %.3f | `%s` | %s | %s |" % (
                env_id, seed, f"{bare['steps']:,}", bare["seconds"], led["seconds"], ratio, bare["sha"][:16],
                "yes" if bare["sha"] == led["sha"] else "NO (`%s`)" % led["sha"][:16],
                "clean" if led["clean"] else "DIFFER"))
        summary.append("%s: median ratio %.3f (%+.1f%% training time) over %d seeds; weights identical in %d of %d; "
                       "ledgers clean in %d of %d." % (env_id, statistics.median(ratios),
                                                        100 * (statistics.median(ratios) - 1), len(ratios), same,
                                                        len(ratios), clean, len(ratios)))
    settings = ["Pendulum-v1: rl-baselines3-zoo's tuned PPO (%s)" % ", ".join("%s=%s" % kv for kv in PENDULUM.items()),
                "HalfCheetah-v5: SB3's PPO defaults"]
    if args.quick:
        settings = ["quick smoke run: n_steps 32, 1 epoch, batch 64"]
    out = ["## Training (benchmarks/training.py)", "", "%s; torch %s, stable-baselines3 %s." % (
        machine(), torch.__version__, __import__("stable_baselines3").__version__), "",
        "SB3 PPO, %d envs through SubprocVecEnv (workers started by %s), seeds %s; %s. torch on one thread. "
        "\"with\": LedgerEnv in each "
        "worker and LedgerVecEnv around the SubprocVecEnv; runs of a seed interleaved, in alternating order. "
        "learn() time only (ledgers are written at close)." % (
            args.num_envs, args.start_method, ", ".join(map(str, args.seeds)), "; ".join(settings)), ""] + rows
    out += [""] + summary + ["", "The paper: a median %+.0f%% training time on Pendulum, weights unchanged in all "
                             "216 runs. Whole run: %.0f s." % (100 * (PAPER_RATIO - 1), time.perf_counter() - started)]
    show("training", "\n".join(out), write=not (args.quick or args.no_write))


if __name__ == "__main__":
    main()
