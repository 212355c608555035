"""Kills by the hundred: tests/recording/test_kills.py's cases at seeded random moments, counted.

For each harness (AsyncVectorEnv fork, forkserver and spawn, SyncVectorEnv, SB3 SubprocVecEnv and DummyVecEnv)
the script of tests/crash_harness.py is run to its end once (the reference), then killed again and again:
SIGKILL to every process during a step (spills every 0.05 s, so that kills land in spills and merges too), with
no spill ever, during close(), and a segfault inside env.step. After each kill both sides are read; what is read
must be the reference's first events, and the events lost are those the script had reported recorded (on a pipe,
outside the killed processes) and that are not read back. Prints the kills per harness and way, and the events
lost (the goal: 0).

    python benchmarks/kill_soak.py --kills 20            # 20 kills of each way for each harness
    python benchmarks/kill_soak.py --kills 3 --harness sync
"""

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import crash_harness as K  # noqa: E402

HARNESSES = ["async-fork", "async-forkserver", "async-spawn", "sync", "subproc", "dummy"]
WAYS = ["step", "step-no-spill", "close", "segv"]


def one(harness, way, directory, rng, reference):
    target = int(rng.integers(20, 1500))
    if way == "close":
        proc = K.start(harness, "close", directory, target)
        lines = []
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("closing"):
                time.sleep(float(rng.uniform(0, 0.05)))
                os.killpg(proc.pid, signal.SIGKILL)
                break
        rest, _ = K.finish(proc)
    elif way == "segv":
        proc = K.start(harness, "segv", directory, min(target, 600))
        lines, (rest, _) = [], K.finish(proc, timeout=20)
    else:
        proc = K.start(harness, "run", directory, 0, flush=1000.0 if way == "step-no-spill" else 0.05)
        lines = K.kill_at(proc, target, rng)
        rest, _ = K.finish(proc)
    known = K.known_counts(lines + rest)
    env, _ = K.streams(directory)
    trainer, _ = K.streams(os.path.join(directory, "trainer.npz"))
    return sum(K.check_prefix(env, reference[0], known).values()) + \
        sum(K.check_prefix(trainer, reference[1], known).values()), sum(known.values()) * 2


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=10, help="kills of each way for each harness")
    p.add_argument("--harness", action="append", choices=HARNESSES)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    print("| harness | way | kills | events known recorded | events lost |")
    print("| --- | --- | --- | --- | --- |")
    total = [0, 0, 0]
    for harness in args.harness or HARNESSES:
        ref_dir = tempfile.mkdtemp(prefix="stepledger-soak-")
        K.finish(K.start(harness, "reference", ref_dir, 2500))
        reference = (K.streams(ref_dir)[0], K.streams(os.path.join(ref_dir, "trainer.npz"))[0])
        shutil.rmtree(ref_dir)
        for way in WAYS:
            kills = lost = known = 0
            for _ in range(args.kills):
                d = tempfile.mkdtemp(prefix="stepledger-soak-")
                try:
                    got = one(harness, way, d, rng, reference)
                finally:
                    shutil.rmtree(d, ignore_errors=True)
                kills += 1
                lost += got[0]
                known += got[1]
            total = [total[0] + kills, total[1] + known, total[2] + lost]
            print("| %s | %s | %d | %d | %d |" % (harness, way, kills, known, lost), flush=True)
    print("| all | all | %d | %d | %d |" % tuple(total))


if __name__ == "__main__":
    main()
