"""What keep_values=True costs, against the default, side by side in one run.

A SyncVectorEnv of 16 Pendulum-v1 envs (observations of 3 float32, actions
of 1: 16 bytes an event kept), pre-generated actions. For each side (env,
trainer, both) the ledgers with and without kept values take turns in
blocks of 100 vector steps, each turn set against the turn without ledgers
in the same round: the paired ratio and µs an env step. Then the bytes an
event takes in memory (the process's accounted buffers over the events
held) and on disk (the closed ledgers over their events), and with
--instructions the instructions a vector step takes under callgrind
(benchmarks/overhead.py's counter, over 200 vector steps after a warm-up).

    python benchmarks/keep_values.py                  # times, memory, disk
    python benchmarks/keep_values.py --instructions   # also the instruction counts (a few minutes more)
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import gymnasium as gym
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _callgrind  # noqa: E402
from _results import machine, write_section  # noqa: E402

from stepledger import LedgerEnv, LedgerVectorEnv, core  # noqa: E402

SIDES = ("env", "trainer", "both")


def vector(config, keep, n, directory, flush_interval=None):
    def make(i):
        env = gym.make("Pendulum-v1")
        if config in ("env", "both"):
            env = LedgerEnv(env, directory, index=i, keep_values=keep, flush_interval=flush_interval)
        return env
    envs = gym.vector.SyncVectorEnv([lambda i=i: make(i) for i in range(n)])
    if config in ("trainer", "both"):
        envs = LedgerVectorEnv(envs, os.path.join(directory, "trainer.npz"), keep_values=keep,
                               flush_interval=flush_interval)
    return envs


def discard(envs):
    from stepledger.recording import spiller
    for rec in list(spiller.OPEN.values()):
        rec.discard()
    envs.close()


def times(n, steps, runs, block):
    rng = np.random.default_rng(0)
    actions = [rng.uniform(-2, 2, (n, 1)).astype(np.float32) for _ in range(steps)]
    configs = [("none", False)] + [(s, k) for s in SIDES for k in (False, True)]
    per = {c: [] for c in configs}
    for _ in range(runs):
        dirs = {c: tempfile.mkdtemp(prefix="stepledger-keep-") for c in configs}
        envs = {c: vector(c[0], c[1], n, dirs[c], 1.0) for c in configs}
        for e in envs.values():
            e.reset(seed=0)
        for turn, start in enumerate(range(0, steps, block)):
            chunk = actions[start:start + block]
            for c in configs[turn % len(configs):] + configs[:turn % len(configs)]:
                step = envs[c].step
                t0 = time.perf_counter()
                for a in chunk:
                    step(a)
                per[c].append((time.perf_counter() - t0) / len(chunk) * 1e6)
        for c in configs:
            discard(envs[c])
            shutil.rmtree(dirs[c], ignore_errors=True)
    base = per[("none", False)]
    return {c: (statistics.median(t / b for t, b in zip(per[c], base)),
                statistics.median(t - b for t, b in zip(per[c], base)) / n) for c in configs if c[0] != "none"}


def bytes_per_event(config, keep, n, steps):
    """(memory bytes an event while recording, disk bytes an event once closed) for one side."""
    d = tempfile.mkdtemp(prefix="stepledger-keep-")
    before = core.memory_in_use()
    envs = vector(config, keep, n, d, 3600.0)
    rng = np.random.default_rng(0)
    envs.reset(seed=0)
    for _ in range(steps):
        envs.step(rng.uniform(-2, 2, (n, 1)).astype(np.float32))
    events = n * (steps + 1) * (2 if config == "both" else 1)
    mem = (core.memory_in_use() - before) / events
    envs.close()
    disk = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".npz")) / events
    shutil.rmtree(d, ignore_errors=True)
    return mem, disk


def count(config, keep, n, steps):
    """Under callgrind (--count): ``steps`` vector steps inside functools.reduce, the one call collected."""
    import math
    d = tempfile.mkdtemp(prefix="stepledger-keep-")
    envs = vector(config, keep, n, d, math.inf)
    rng = np.random.default_rng(0)
    actions = [rng.uniform(-2, 2, (n, 1)).astype(np.float32) for _ in range(steps)]
    envs.reset(seed=0)
    _callgrind.collected(envs.step, actions)
    discard(envs)
    shutil.rmtree(d, ignore_errors=True)


def instructions(config, keep, n, steps=200):
    return _callgrind.per_call(__file__, (config, int(keep), n, steps), steps)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--steps", type=int, default=3000, help="vector steps per run")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--block", type=int, default=100)
    p.add_argument("--instructions", action="store_true", help="also count instructions (callgrind)")
    p.add_argument("--quick", action="store_true", help="a smoke run, writes nothing")
    p.add_argument("--count", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.count:
        count(args.count[0], args.count[1] == "1", int(args.count[2]), int(args.count[3]))
        return
    if args.quick:
        args.steps, args.runs = 300, 1
    n = args.num_envs
    t = times(n, args.steps, args.runs, args.block)
    out = ["## What keep_values=True costs (benchmarks/keep_values.py)", "", "%s." % machine(), "",
           "SyncVectorEnv of %d Pendulum-v1 (16 bytes of values an event), %d runs of %d vector steps, the "
           "configurations taking turns every %d steps; each turn set against the turn without ledgers in the "
           "same round (medians of the paired ratios and differences)." % (n, args.runs, args.steps, args.block), "",
           "| ledgers | keep_values | vs. none | µs per env step | memory, bytes an event | disk, bytes an event |",
           "| --- | --- | --- | --- | --- | --- |"]
    for side in SIDES:
        for keep in (False, True):
            mem, disk = bytes_per_event(side, keep, n, 2000 if not args.quick else 200)
            ratio, us = t[(side, keep)]
            out.append("| %s | %s | %.3fx | %.2f | %.1f | %.1f |" % (side, keep, ratio, us, mem, disk))
    if args.instructions and shutil.which("valgrind"):
        base = instructions("none", False, n)
        out += ["", "Instructions a vector step (callgrind, 200 vector steps after a warm-up, AVX2 path):", "",
                "| ledgers | keep_values=False | keep_values=True | more an env step |", "| --- | --- | --- | --- |",
                "| none | %s | | |" % format(round(base), ",")]
        for side in SIDES:
            off, on = instructions(side, False, n), instructions(side, True, n)
            out.append("| %s | %s (%s an env step) | %s (%s an env step) | %s |" % (
                side, format(round(off), ","), format(round((off - base) / n), ","), format(round(on), ","),
                format(round((on - base) / n), ","), format(round((on - off) / n), ",")))
    text = "\n".join(out)
    print(text)
    if not args.quick:
        write_section("keep_values", text)


if __name__ == "__main__":
    main()
