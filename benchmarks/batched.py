"""What the env side at a vector env's own output costs, beside the trainer side, on CartPoleVectorEnv.

Gymnasium's ``CartPoleVectorEnv`` (``gym.make_vec("CartPole-v1", vectorization_mode="vector_entry_point")``)
steps every env in one NumPy call. Configurations: none, the env side (``LedgerBatchEnv`` directly on the
vector env), the trainer side (``LedgerVectorEnv`` around it) and both. Pre-generated random actions. All
are built at once and take turns in blocks of vector steps, the order rotating from round to round; each
turn is set against the turn without ledgers of the same round and the medians of those paired differences
and ratios are reported, so that a busy moment on a shared machine falls on both sides of a pair.

With ``--instructions`` (where valgrind is installed), the instructions a vector step takes in each
configuration, counted by callgrind (benchmarks/_callgrind.py) over 200 vector steps after a warm-up:
counts do not move with the machine's load, as wall times on a shared 2-core machine do.

    python benchmarks/batched.py                    # the timed run, writes its section of RESULTS.md
    python benchmarks/batched.py --instructions     # also the instruction counts
    python benchmarks/batched.py --quick            # a smoke run, writes nothing
"""

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import gymnasium as gym
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _callgrind  # noqa: E402
from _results import machine, write_section  # noqa: E402

from stepledger import LedgerVectorEnv  # noqa: E402
from stepledger.gymnasium import LedgerBatchEnv  # noqa: E402

TARGETS = {"side_us": 0.2, "both_ratio": 1.5}  # issue 29: each side at most 0.2 µs an env step, both at most 1.5x
CONFIGS = ("none", "env", "trainer", "both")


def cartpole(config, n, directory, flush_interval=None):
    """CartPoleVectorEnv of n envs with the ledgers of ``config``."""
    envs = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
    if config in ("env", "both"):
        envs = LedgerBatchEnv(envs, directory, flush_interval=flush_interval)
    if config in ("trainer", "both"):
        envs = LedgerVectorEnv(envs, os.path.join(directory, "trainer.npz"), flush_interval=flush_interval)
    return envs


def discard(envs, directory):
    envs.close()
    shutil.rmtree(directory, ignore_errors=True)


def count_steps(config, n_envs, steps):
    """Under callgrind (--count): ``steps`` vector steps inside functools.reduce, the one call collected."""
    d = tempfile.mkdtemp(prefix="stepledger-bench-")
    envs = cartpole(config, n_envs, d, math.inf)
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 2, n_envs) for _ in range(steps)]
    envs.reset(seed=0)
    _callgrind.collected(envs.step, actions)
    discard(envs, d)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-envs", type=int, default=256)
    p.add_argument("--steps", type=int, default=3000, help="vector steps per run")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--block", type=int, default=50, help="vector steps per turn")
    p.add_argument("--flush-interval", type=float, default=5.0)
    p.add_argument("--quick", action="store_true", help="a smoke run: few steps, no RESULTS.md")
    p.add_argument("--instructions", action="store_true", help="also count instructions a vector step (callgrind)")
    p.add_argument("--count", nargs=3, metavar=("CONFIG", "ENVS", "STEPS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.count:
        count_steps(args.count[0], int(args.count[1]), int(args.count[2]))
        return
    if args.quick:
        args.steps, args.runs = 300, 1
    n = args.num_envs
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 2, n) for _ in range(args.steps)]
    times = {c: [] for c in CONFIGS}
    block = max(1, min(args.block, args.steps))
    for _ in range(args.runs):
        dirs = {c: tempfile.mkdtemp(prefix="stepledger-bench-") for c in CONFIGS}
        envs = {c: cartpole(c, n, dirs[c], args.flush_interval) for c in CONFIGS}
        for e in envs.values():
            e.reset(seed=0)
        for turn, start in enumerate(range(0, args.steps, block)):
            chunk = actions[start:start + block]
            for c in CONFIGS[turn % len(CONFIGS):] + CONFIGS[:turn % len(CONFIGS)]:
                step = envs[c].step
                t0 = time.perf_counter()
                for a in chunk:
                    step(a)
                times[c].append((time.perf_counter() - t0) / len(chunk) * 1e6)
        for c in CONFIGS:
            discard(envs[c], dirs[c])
    med = {c: statistics.median(v) for c, v in times.items()}
    diff = {c: statistics.median(t - b for t, b in zip(times[c], times["none"])) / n for c in CONFIGS}
    ratio = {c: statistics.median(t / b for t, b in zip(times[c], times["none"])) for c in CONFIGS}
    out = ["## The env side at a vector env's output (benchmarks/batched.py)", "",
           "%s; load average %.1f at the end." % (machine(), os.getloadavg()[0]), "",
           "CartPoleVectorEnv of %d envs (Gymnasium's vector entry point), pre-generated actions, %d runs of %d "
           "vector steps in which the configurations take turns every %d steps, the order rotating. µs a vector "
           "step: medians over all turns; per env step and ratio: medians of each turn against the bare turn "
           "of the same round." % (n, args.runs, args.steps, block), "",
           "| ledgers | µs a vector step | µs more an env step | vs. none (paired) |", "| --- | --- | --- | --- |"]
    for c in CONFIGS:
        out.append("| %s | %.1f | %s | %.3fx |" % (c, med[c], "" if c == "none" else "%.3f" % diff[c], ratio[c]))
    out += ["", "Targets (issue 29): each side at most %.1f µs an env step (env side %.3f, trainer side %.3f); both "
            "at most %.1fx the bare step (%.3fx)." % (TARGETS["side_us"], diff["env"], diff["trainer"],
                                                     TARGETS["both_ratio"], ratio["both"])]
    if args.instructions:
        if not _callgrind.available():
            out += ["", "Instruction counts: not made (valgrind is not installed)."]
        else:
            steps = 200
            counts = {c: _callgrind.per_call(__file__, (c, n, steps), steps) for c in CONFIGS}
            base = counts["none"]
            out += ["", "Instructions a vector step (callgrind, %d vector steps after a warm-up; the core's AVX2 "
                    "path; periodic spills off):" % steps, "",
                    "| ledgers | instructions a vector step | more than none, an env step | vs. none |",
                    "| --- | --- | --- | --- |"]
            out += ["| %s | %s | %s | %.3fx |" % (c, format(round(counts[c]), ","), "" if c == "none" else
                                                 format(round((counts[c] - base) / n), ","), counts[c] / base)
                    for c in CONFIGS]
    text = "\n".join(out)
    print(text)
    if not args.quick:
        write_section("batched", text)


if __name__ == "__main__":
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    main()
