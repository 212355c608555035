"""What the mapped part of a ledger (format/mapped.py) costs a step, side by side with today's recording.

Instructions (callgrind, as benchmarks/overhead.py --instructions counts them: 16 Pendulum-v1 in a SyncVectorEnv,
200 vector steps after a warm-up, periodic spills off): an env step's cost on the env side and on the trainer side,
for main (another checkout, ``--main``, its core built), this branch with its mapped part, and this branch with
``STEPLEDGER_MAPPED_BYTES=0`` (the buffers in memory as before), each in a process of its own, in one run.

Time (paired turns, in one process): the same configurations of this branch, mapped and not, built side by side,
taking turns every 100 vector steps; each mapped turn is set against the unmapped turn of the same round, and the
median ratio is given, per side. Periodic spills on (every second), so the mapped rings are let go of and reused as
in a run.

Page faults: the minor faults the stepping process takes over the mapped turns, per thousand vector steps (the
rings are touched when made and reused: none are expected on the step path, but the kernel write-protects a
page again when it writes it back, and the next store to it faults once).

    python benchmarks/mapped_overhead.py --main /work/main             # the table
    python benchmarks/mapped_overhead.py --main /work/main --quick     # a smoke run
"""

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _callgrind  # noqa: E402
import overhead  # noqa: E402

from stepledger.format import schema as S  # noqa: E402

ROOT = os.path.dirname(HERE)


def built_with(mapped, config, n, directory, interval):
    """A configuration of overhead.py's, its ledgers built with the mapped part or without."""
    before = os.environ.get(S.ENV_MAPPED_BYTES)
    os.environ[S.ENV_MAPPED_BYTES] = str(S.DEFAULT_MAPPED_BYTES if mapped else 0)
    try:
        return overhead.pendulum_vector(config, n, directory, interval)
    finally:
        if before is None:
            os.environ.pop(S.ENV_MAPPED_BYTES)
        else:
            os.environ[S.ENV_MAPPED_BYTES] = before


def instructions(main_root, n, steps):
    script = os.path.join(HERE, "overhead.py")
    trees = {"main": {"PYTHONPATH": main_root, S.ENV_MAPPED_BYTES: "0"},
             "branch, mapped": {"PYTHONPATH": ROOT},
             "branch, not mapped": {"PYTHONPATH": ROOT, S.ENV_MAPPED_BYTES: "0"}}
    out = {}
    for name, env in trees.items():
        if name == "main" and not main_root:
            continue
        counts = {c: _callgrind.per_call(script, (c, n, steps), steps, env=env) for c in ("none", "env", "trainer")}
        if counts["none"] is None:
            return None
        out[name] = ((counts["env"] - counts["none"]) / n, (counts["trainer"] - counts["none"]) / n)
    return out


def paired(n, steps, runs, block, interval):
    configs = [(side, mapped) for side in ("env", "trainer") for mapped in (False, True)] + [("none", False)]
    times = {c: [] for c in configs}
    faults = [0, 0]  # minor faults over the mapped turns, vector steps of them
    rng = np.random.default_rng(0)
    actions = [rng.uniform(-2, 2, (n, 1)).astype(np.float32) for _ in range(steps)]
    for _ in range(runs):
        dirs = {c: tempfile.mkdtemp(prefix="stepledger-bench-") for c in configs}
        envs = {c: built_with(c[1], c[0], n, dirs[c], interval) for c in configs}
        for e in envs.values():
            e.reset(seed=0)
        for turn, start in enumerate(range(0, steps, block)):
            chunk = actions[start:start + block]
            for c in configs[turn % len(configs):] + configs[:turn % len(configs)]:
                step = envs[c].step
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t0 = time.perf_counter()
                for a in chunk:
                    step(a)
                times[c].append((time.perf_counter() - t0) / len(chunk) * 1e6)
                if c[1] and turn > 0:
                    faults[0] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
                    faults[1] += len(chunk)
        for c in configs:
            overhead.discard(envs[c], dirs[c])
    ratio = {side: statistics.median(m / h for m, h in zip(times[(side, True)], times[(side, False)]))
             for side in ("env", "trainer")}
    none = times[("none", False)]
    us = {c: statistics.median(t - b for t, b in zip(times[c], none)) / n for c in configs if c[0] != "none"}
    return ratio, us, 1000.0 * faults[0] / max(1, faults[1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--main", help="a checkout of main with its core built in place, for its instruction counts")
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.steps, args.runs = 600, 2
    n = args.num_envs
    counts = instructions(args.main, n, 200)
    ratio, us, faults = paired(n, args.steps, args.runs, 100, 1.0)
    print("| recording | instructions an env step, env side | instructions an env step, trainer side |")
    print("| --- | --- | --- |")
    for name, (e, t) in (counts or {}).items():
        print("| %s | %.0f | %.0f |" % (name, e, t))
    print()
    print("| side | µs an env step, not mapped | µs an env step, mapped | mapped / not mapped, paired turns |")
    print("| --- | --- | --- | --- |")
    for side in ("env", "trainer"):
        print("| %s | %.3f | %.3f | %.3fx |" % (side, us[(side, False)], us[(side, True)], ratio[side]))
    print()
    print("minor page faults of the stepping process over the mapped turns: %.2f per 1000 vector steps" % faults)


if __name__ == "__main__":
    main()
