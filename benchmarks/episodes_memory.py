"""What `stepledger episodes` holds in memory as the ledgers grow, before and after, side by side.

The env ledgers: 4 envs of one-step episodes (a reset, then a terminated step), E episodes an env, for
E in --episodes (by default 250k and 1M: 2M and 8M events in all). The logs have the first 2,000
episodes of each env: an EpisodeLogTap-style .npz with env indices (paired per env) and a
monitor.csv without (paired in completion order); their last logged episode is one step short, so
that the check has a difference to report and every recorded episode after the logged ones to count.
The monitor.csv is also matched as a multiset (--match multiset), which pairs any logged episode with
any recorded one: "after", a maximum matching of the rows held drops those it leaves unmatched, every
1.25 x (logged episodes) + 64k rows.

"After" is this checkout. "Before" is the package at --before (the commit before the episode check
kept only what a log can be paired with; it kept every episode in all three ways): it is copied out with ``git archive`` into a temporary
directory. Each (version, ledger size, log) runs in a fresh interpreter, in turn, --rounds times;
each reports the check's peak of traced allocations (tracemalloc: Python objects and NumPy arrays)
and the process's peak RSS (VmHWM), and the report's first lines, which must be the same before and
after.

    python benchmarks/episodes_memory.py             # a few minutes on a busy 2-core machine
    python benchmarks/episodes_memory.py --quick     # 20k and 80k episodes an env, 1 round

Target: the peak does not grow with the ledgers' episodes (after), where it grew by 100 B and more an episode
(before).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MB = 1 << 20
N_ENVS = 4
LOGGED = 2000

_MEASURE = r"""
import json, sys, tracemalloc
sys.path.insert(0, sys.argv[1])
from stepledger.episodes import check_episodes
tracemalloc.start()
report = check_episodes(sys.argv[2], sys.argv[3], match=sys.argv[4])
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
hwm = 0
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        hwm = int(line.split()[1]) * 1024
print(json.dumps({"traced": peak, "rss": hwm, "lines": report.lines()[:3], "mode": report.mode}))
"""


def write_ledgers(directory, episodes):
    """N_ENVS env ledgers of ``episodes`` one-step episodes each; rewards 0.5 + episode / 1000."""
    import numpy as np
    from gymnasium import spaces as gs

    from stepledger.format import schema as S
    from stepledger import core
    from stepledger.recording import Recording, spill_everything
    from stepledger.format.spaces import LeafLayout
    box = LeafLayout(gs.Box(-1, 1, shape=(1,), dtype=np.float32))
    rec = Recording(os.path.join(directory, "env-0.npz"), "env", range(N_ENVS), box, box, np.float32, False)
    for k in range(N_ENVS):
        buf = rec.buffers[k]
        for ep in range(episodes):
            buf.append(S.KIND_RESET, 1, 0, 0, False, False)
            if buf.append(S.KIND_STEP, 1, 0, core.reward_bits(0.5 + (ep % 1000) / 1000, True), True, False):
                spill_everything()  # over the memory limit: spill, as a recording does
    rec.close()
    return directory


def write_logs(directory):
    import numpy as np
    r = np.array([np.float32(0.5 + (ep % 1000) / 1000) for ep in range(LOGGED)], dtype=np.float64)
    env = np.repeat(np.arange(N_ENVS), LOGGED)
    rs, ls = np.tile(r, N_ENVS), np.ones(N_ENVS * LOGGED, dtype=np.int64)
    ls[-1] = 2  # one logged episode one step longer than recorded: a difference to report
    tap = os.path.join(directory, "tap.npz")
    np.savez(tap, env=env, r=rs, l=ls, meta=np.array(json.dumps({"format": "stepledger-episode-log",
                                                                    "format_version": 1})))
    csv = os.path.join(directory, "monitor.csv")  # in completion order: episode by episode, env by env
    order = np.lexsort((env, np.tile(np.arange(LOGGED), N_ENVS)))
    with open(csv, "w") as f:
        f.write('#{"t_start": 0}\nr,l,t\n')
        for j in order:
            f.write("%r,%d,0\n" % (float(rs[j]), ls[j]))
    return {"per env": (tap, "auto"), "in order": (csv, "auto"), "multiset": (csv, "multiset")}


def measure(package, env_dir, log, match):
    out = subprocess.run([sys.executable, "-c", _MEASURE, package, env_dir, log, match], capture_output=True, text=True,
                         timeout=1800, env=dict(os.environ, STEPLEDGER_PUREPYTHON="1"))
    if out.returncode:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, nargs="+", default=[250_000, 1_000_000], help="episodes an env")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--before", default="8c96c3a", help="the commit to compare with")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.episodes, args.rounds = [20_000, 80_000], 1
    with tempfile.TemporaryDirectory() as tmp:
        before = os.path.join(tmp, "before")
        os.makedirs(before)
        archive = subprocess.run(["git", "-C", ROOT, "archive", args.before, "stepledger"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
        logs = write_logs(tmp)
        dirs = {}
        for e in args.episodes:
            dirs[e] = os.path.join(tmp, "ledger-%d" % e)
            os.makedirs(dirs[e])
            write_ledgers(dirs[e], e)
        results = {}
        for _ in range(args.rounds):
            for e in args.episodes:
                for how, (log, match) in logs.items():
                    for name, package in (("before", before), ("after", ROOT)):
                        results.setdefault((e, how, name), []).append(measure(package, dirs[e], log, match))
        print("stepledger episodes, %d envs, %d logged episodes an env; median of %d rounds" % (
            N_ENVS, LOGGED, args.rounds))
        print("%-10s %-9s %-7s %14s %12s  %s" % ("episodes", "log", "version", "traced peak MB", "peak RSS MB",
                                                  "report"))
        for (e, how, name), runs in results.items():
            traced = statistics.median(r["traced"] for r in runs) / MB
            rss = statistics.median(r["rss"] for r in runs) / MB
            print("%-10s %-9s %-7s %14.1f %12.1f  %s" % ("%d x %d" % (N_ENVS, e), how, name, traced, rss,
                                                      runs[0]["lines"][0][:60]))
        lo, hi = min(args.episodes), max(args.episodes)
        for how in logs:
            for name in ("before", "after"):
                a = statistics.median(r["traced"] for r in results[(lo, how, name)])
                b = statistics.median(r["traced"] for r in results[(hi, how, name)])
                print("%s, %s: %+.1f B a recorded episode from %d to %d episodes an env" % (
                    how, name, (b - a) / (N_ENVS * (hi - lo)), lo, hi))
            same = all(results[(e, how, "before")][0]["lines"] == results[(e, how, "after")][0]["lines"]
                       for e in args.episodes)
            print("%s: the reports' lines are %s before and after" % (how, "the same" if same else "NOT the same"))


if __name__ == "__main__":
    main()
