"""What the reader's checks on hostile files cost: compare of 16 envs x 1M events a side, before and after.

"After" is this checkout. "Before" is the whole package at commit d936b1f
(``--before``), the last one before the reader's checks of issue 14 (each member
was reopened by path, nothing was bounded before inflating, the meta had no
schema), copied out with ``git archive`` and its Cython core built there.
(Replacing only the reader's files in this checkout, as this script first
did, no longer works: the rest of the package now imports what only the new
reader has.) Other changes to compare since then (hints, the search for env
files that match other envs' streams) are in "after" too, so the ratio is an
upper bound on what the checks cost.

The ledgers (a real 16-env Pendulum-v1 rollout cycled to 1M events a stream,
as in storage.py part 4: the env files written from the trainer ledger's
streams, so every event is read) are written once, in format version 1, which
both versions read (d936b1f refuses version 2 files, which it predates); then
each version's ``stepledger.compare`` runs in a fresh interpreter,
alternating, ``--rounds`` times each. Each run reports its own wall time and
peak RSS (VmHWM).

    python benchmarks/reading_checks.py              # about 3 minutes on a busy 2-core machine
    python benchmarks/reading_checks.py --quick      # 16 x 100k events, 3 rounds: a smoke run
    python benchmarks/reading_checks.py --before COMMIT   # another "before"

Target: the checks slow compare by at most 5% (median over median).
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
ROOT = os.path.dirname(HERE)
MB = 1 << 20
TARGET_RATIO = 1.05

_MEASURE = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import stepledger
assert os.path.dirname(stepledger.__file__) == os.path.join(sys.argv[1], "stepledger"), stepledger.__file__
from stepledger import compare
t0 = time.perf_counter()
report = compare(sys.argv[2], sys.argv[3])
seconds = time.perf_counter() - t0
hwm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(json.dumps({"seconds": seconds, "peak": hwm, "ok": report.ok, "core": stepledger.CORE}))
"""


def log(text):
    print(text, file=sys.stderr, flush=True)


def export(commit, directory):
    """The package as it was at ``commit``, its compiled core built in place."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", commit, "stepledger", "setup.py", "pyproject.toml",
                              "README.md"], check=True, stdout=subprocess.PIPE).stdout
    subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=directory, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return directory


def write_ledgers(directory, events_per_env):
    """The trainer ledger and the env files from its streams, rewritten in format version 1."""
    sys.path.insert(0, HERE)
    import storage  # the Pendulum pool and the recording loop of storage.py

    from stepledger.format import schema as S
    from stepledger import read
    from stepledger.format.ledgerfile import Segment, write_ledger
    pool = storage.Pool(16, 4000)
    recorded = os.path.join(directory, "recorded.npz")
    rec = storage.record(recorded, pool, events_per_env)
    rec.close()
    os.makedirs(os.path.join(directory, "env"))
    with read(recorded) as ledger:
        meta = {k: v for k, v in ledger.meta.items() if k not in S.PER_FILE_META}
        meta[S.META_FORMAT_VERSION] = 1
        streams = {i: st.columns for i, st in ledger.streams.items()}
    write_ledger(os.path.join(directory, "trainer.npz"), meta, sorted(streams), [Segment(streams)])
    env_meta = dict(meta, side="env")
    env_meta.pop(S.META_AUTORESET, None)  # LedgerEnv's meta has none
    for i, cols in streams.items():
        write_ledger(os.path.join(directory, "env", "env-%d.npz" % i), env_meta, [i], [Segment({i: cols})])
    os.unlink(recorded)


def measure(package, directory):
    proc = subprocess.run([sys.executable, "-c", _MEASURE, package, os.path.join(directory, "env"),
                           os.path.join(directory, "trainer.npz")], stdout=subprocess.PIPE, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if proc.returncode:
        raise SystemExit("compare failed with %s" % package)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", default="d936b1f", help="the commit of the package before the checks (default d936b1f)")
    p.add_argument("--events", type=int, default=1_000_000, help="events a stream (default 1M)")
    p.add_argument("--rounds", type=int, default=7, help="runs of each version, alternating (default 7)")
    p.add_argument("--quick", action="store_true", help="16 x 100k events, 3 rounds")
    p.add_argument("--tmpdir", default=None, help="where to write the ledgers (about 600 MB)")
    args = p.parse_args()
    if args.quick:
        args.events, args.rounds = 100_000, 3
    tmp = tempfile.mkdtemp(prefix="reading-checks-", dir=args.tmpdir)
    try:
        os.mkdir(os.path.join(tmp, "before"))
        before = export(args.before, os.path.join(tmp, "before"))
        data = os.path.join(tmp, "data")
        os.mkdir(data)
        log("writing 16 x %s events a side..." % f"{args.events:,}")
        t0 = time.perf_counter()
        sys.path.insert(0, ROOT)
        write_ledgers(data, args.events)
        log("written in %.0f s; comparing, %d rounds of each version" % (time.perf_counter() - t0, args.rounds))
        runs = {"before": [], "after": []}
        for r in range(args.rounds):
            for which, package in (("before", before), ("after", ROOT)) if r % 2 == 0 else \
                    (("after", ROOT), ("before", before)):
                out = measure(package, data)
                assert out["ok"] and out["core"] == "cython", out
                runs[which].append(out)
                log("  round %d %-6s %.3f s, peak %.0f MB" % (r + 1, which, out["seconds"], out["peak"] / MB))
        med = {w: statistics.median(x["seconds"] for x in v) for w, v in runs.items()}
        peak = {w: statistics.median(x["peak"] for x in v) for w, v in runs.items()}
        ratio = med["after"] / med["before"]
        print("compare of 16 envs x %s events a side (%d rounds each, alternating, fresh processes):"
              % (f"{args.events:,}", args.rounds))
        print("  before (the package at %s): median %.3f s, peak RSS %.0f MB" % (args.before, med["before"],
                                                                                 peak["before"] / MB))
        print("  after  (this checkout): median %.3f s, peak RSS %.0f MB" % (med["after"], peak["after"] / MB))
        print("  time after/before: %.3f (target at most %.2f): %s"
              % (ratio, TARGET_RATIO, "met" if ratio <= TARGET_RATIO else "NOT met"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
