"""Closing a 16M-event trainer ledger with and without ISA-L (the optional [isal] extra), side by side.

isal is an accelerator, not a dependency: without it the ledger is written
with zlib, in the same format. This script records 16 envs x 1M events of a
real Pendulum-v1 rollout through Recording and VectorRecorder (as
benchmarks/storage.py part 3 does), then times ``close()``: in fresh
processes, alternating with isal importable and with isal blocked, several
rounds, and prints each run, the medians, their ratio and the file sizes.
It also checks that the two files hold the same columns and settings.

A third configuration, "zlib, isal's levels", is the writer as it was before
isal became optional (e7c86ec): zlib alone deflating every member at the
levels ISA-L uses (the float32 reward bits and the step counter at level 1).
It shows what storing the reward bits and deflating the step counter at zlib's
level 3 buys in time, and costs in bytes.

    python benchmarks/deflate.py                 # 16 x 1M events, 3 rounds
    python benchmarks/deflate.py --quick         # a smoke run
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_ZLIB_S = 4.0  # closing 16M events without isal

_BLOCK = r"""
import sys
class _NoIsal:
    def find_spec(self, name, path=None, target=None):
        if name == "isal" or name.startswith("isal."):
            raise ImportError("isal blocked by benchmarks/deflate.py")
sys.meta_path.insert(0, _NoIsal())
"""


def child(n_envs, events, pool_steps, path, block):
    if block != "0":
        exec(_BLOCK)
    sys.path.insert(0, HERE)
    from storage import Pool, record

    from stepledger.format import schema as _schema
    from stepledger.format import ledgerfile
    from stepledger.format.zipwriter import DEFLATE
    if block == "2":  # the levels of the writer before isal was optional, with zlib
        ledgerfile._LEVEL.update(_schema.COLUMN_LEVELS["isal"])
    pool = Pool(n_envs, pool_steps)
    rec = record(path, pool, events)
    t0 = time.perf_counter()
    rec.close()
    seconds = time.perf_counter() - t0
    return {"deflate": DEFLATE, "close_s": seconds, "bytes": os.path.getsize(path)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-envs", type=int, default=16, help="streams (default: 16)")
    p.add_argument("--events-per-env", type=int, default=1_000_000, help="events a stream (default: 1000000)")
    p.add_argument("--pool", type=int, default=8192, help="vector steps of the rollout that is cycled (default: 8192)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each configuration, alternating (default: 3)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 16 x 20000 events, one round")
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        n, events, pool, path, block = args.child
        print(json.dumps(child(int(n), int(events), int(pool), path, block)))
        return 0
    if args.quick:
        args.events_per_env, args.rounds, args.pool = 20_000, 1, 512
    tmp = tempfile.mkdtemp(prefix="stepledger-deflate-")
    configs = (("isal", "0", "isal"), ("zlib", "1", "zlib"), ("zlib, isal's levels", "2", "zlib"))
    runs = {name: [] for name, _, _ in configs}
    paths = {}
    try:
        for r in range(args.rounds):
            for name, block, deflate in configs:
                path = os.path.join(tmp, "%s-%d" % (block, r), "trainer.npz")
                out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(args.num_envs),
                                      str(args.events_per_env), str(args.pool), path, block],
                                     stdout=subprocess.PIPE, text=True, check=True)
                res = json.loads(out.stdout.strip().splitlines()[-1])
                if res["deflate"] != deflate:
                    raise SystemExit("expected %s, the child used %s (is isal installed?)" % (deflate, res["deflate"]))
                runs[name].append(res)
                paths[name] = path
                print("round %d, %s: close() %.2f s, %.2f bytes an event" % (
                    r, name, res["close_s"], res["bytes"] / (args.num_envs * args.events_per_env)), flush=True)
        from stepledger import read
        from stepledger.format import schema as _schema

        def settings(meta):  # what a recording's files share: not the writer, run, times or pid
            return {k: v for k, v in meta.items() if k not in _schema.PER_FILE_META}
        same = True
        for other in ("zlib", "zlib, isal's levels"):
            with read(paths["isal"]) as a, read(paths[other]) as b:
                same = same and settings(a.meta) == settings(b.meta) and sorted(a.streams) == sorted(b.streams) \
                    and all(all((a.streams[i].columns[c] == b.streams[i].columns[c]).all()
                                for c in a.streams[i].columns) for i in a.streams)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = args.num_envs * args.events_per_env
    med = {k: statistics.median(r["close_s"] for r in v) for k, v in runs.items()}
    size = {k: statistics.median(r["bytes"] for r in v) / total for k, v in runs.items()}
    print("%d envs x %d events (%d events), %d rounds, each close() in a fresh process:"
          % (args.num_envs, args.events_per_env, total, args.rounds))
    print("  with isal:    median %.2f s, %.2f bytes an event" % (med["isal"], size["isal"]))
    print("  without isal: median %.2f s, %.2f bytes an event (target: under %.0f s at 16M events)"
          % (med["zlib"], size["zlib"], TARGET_ZLIB_S))
    old = "zlib, isal's levels"
    print("  without isal, at isal's levels (before e7c86ec): median %.2f s, %.2f bytes an event"
          % (med[old], size[old]))
    print("  without / with: %.2fx the time, %.2fx the bytes" % (med["zlib"] / med["isal"], size["zlib"] / size["isal"]))
    print("  without, now / before: %.2fx the time, %.2fx the bytes" % (med["zlib"] / med[old], size["zlib"] / size[old]))
    print("  the three files hold the same settings and columns: %s" % same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
