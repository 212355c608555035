"""What the reader's checks on hostile files cost: compare of 16 envs x 1M events a side, before and after.

"After" is this checkout. "Before" is the same package with the reader's
files (``--files``: ledgerfile.py and _zipwriter.py) taken from commit
d936b1f, where each member was reopened by path, nothing was bounded before
inflating and the meta had no schema: the package is copied into a temporary
directory, those files are replaced by ``git show d936b1f:FILE``, and its
Cython core is built there, so both differ only in the reader. The
ledgers (a real 16-env Pendulum-v1 rollout cycled to 1M events a stream, as
in storage.py part 4: the env files written from the trainer ledger's
streams, so every event is read) are written once; then each version's
``stepledger.compare`` runs in a fresh interpreter, alternating, ``--rounds``
times each. Each run reports its own wall time and peak RSS (VmHWM).

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


def export(commit, files, directory):
    """This checkout's package with ``files`` as they were at ``commit``, its compiled core built in place."""
    for name in ("stepledger", "setup.py", "pyproject.toml", "README.md"):
        src = os.path.join(ROOT, name)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(directory, name), ignore=shutil.ignore_patterns("*.so", "__pycache__"))
        elif os.path.exists(src):
            shutil.copy(src, directory)
    for name in files:
        old = subprocess.run(["git", "-C", ROOT, "show", "%s:stepledger/%s" % (commit, name)], check=True,
                             stdout=subprocess.PIPE).stdout
        with open(os.path.join(directory, "stepledger", name), "wb") as f:
            f.write(old)
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=directory, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return directory


def write_ledgers(directory, events_per_env):
    sys.path.insert(0, HERE)
    import storage  # the Pendulum pool and the recording loop of storage.py
    pool = storage.Pool(16, 4000)
    rec = storage.record(os.path.join(directory, "trainer.npz"), pool, events_per_env)
    rec.close()
    storage.write_env_side(directory)
    shutil.rmtree(os.path.join(directory, "spec-env"), ignore_errors=True)


def measure(package, directory):
    proc = subprocess.run([sys.executable, "-c", _MEASURE, package, os.path.join(directory, "env"),
                           os.path.join(directory, "trainer.npz")], stdout=subprocess.PIPE, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if proc.returncode:
        raise SystemExit("compare failed with %s" % package)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", default="d936b1f", help="the commit to take the old reader from (default d936b1f)")
    p.add_argument("--files", default="ledgerfile.py,_zipwriter.py",
                   help="the reader's files taken from that commit (default ledgerfile.py,_zipwriter.py)")
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
        before = export(args.before, args.files.split(","), os.path.join(tmp, "before"))
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
        print("  before (%s from %s): median %.3f s, peak RSS %.0f MB" % (args.files, args.before, med["before"], peak["before"] / MB))
        print("  after  (this checkout): median %.3f s, peak RSS %.0f MB" % (med["after"], peak["after"] / MB))
        print("  time after/before: %.3f (target at most %.2f): %s"
              % (ratio, TARGET_RATIO, "met" if ratio <= TARGET_RATIO else "NOT met"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
