"""Compare at scale: one process against worker processes (--jobs), Ray tasks with 1 and 2 workers, and a run of
1,000 env ledgers, local and on an S3-compatible server on loopback.

Each compare runs in a fresh process (``python -c`` calling ``stepledger.compare``), timed from the call to the
result; while it runs, this script samples the memory of the process and all its children every 10 ms
(PSS from /proc/PID/smaps_rollup: the pages a process shares counted once between them, so the sum is what the
tree takes together; and the sum of their RSS, which counts shared pages once per process). Runs of the two
settings compared alternate (A B B A ...), so that a busy moment on a shared machine falls on both alike; the
tables give medians and the paired ratio. The ledgers are written by stepledger's writer from columns made
here (tests/big_ledgers.py), with a real recording's meta.

    python benchmarks/compare_scale.py                 # every part; writes its section of RESULTS.md
    python benchmarks/compare_scale.py --part jobs     # 16 envs x 1,000,000 events a side: --jobs 1 and 2
    python benchmarks/compare_scale.py --part ray      # Ray with 1 and 2 workers (needs the Ray venv)
    python benchmarks/compare_scale.py --part large    # 1,000 envs x 100,000 events, local and on S3
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "tests")
sys.path[:0] = [ROOT, TESTS]

import _results  # noqa: E402
from stepledger.format import storage  # noqa: E402  (its FETCH_BLOCK, named in the S3 table)

MB = 1 << 20
TARGETS = {"jobs_s": 1.0, "jobs_mb": 256}

# The timed child: compare once, print the seconds and the verdict as JSON.
CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
from stepledger import compare
kw = json.loads(sys.argv[3])
t1 = time.perf_counter()
r = compare(sys.argv[1], sys.argv[2], **kw)
t2 = time.perf_counter()
cpu = sum(getattr(resource.getrusage(w), k) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
          for k in ("ru_utime", "ru_stime"))
print(json.dumps({"seconds": t2 - t1, "import_s": t1 - t0, "cpu_s": cpu, "ok": r.ok, "envs": len(r.envs),
                  "differ": len(r.differences)}))
"""

# The Ray child: join a local cluster of N CPUs (not timed), then compare ``repeat`` times as Ray tasks.
RAY_CHILD = """
import json, sys, time
import ray
from stepledger import compare
ray.init(address="local", num_cpus=int(sys.argv[3]), include_dashboard=False, log_to_driver=False)  # a cluster of its own
compare(sys.argv[1], sys.argv[2], ray=True)  # a first compare: the workers start and import stepledger
times = []
for _ in range(int(sys.argv[4])):
    t0 = time.perf_counter()
    r = compare(sys.argv[1], sys.argv[2], ray=True)
    times.append(time.perf_counter() - t0)
ray.shutdown()
print(json.dumps({"times": times, "ok": r.ok, "envs": len(r.envs)}))
"""


def log(text):
    print(text, file=sys.stderr, flush=True)


def uptime():
    with open("/proc/loadavg") as f:
        return "load average %s" % ", ".join(f.read().split()[:3])


def _pss(pid):
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class TreeMemory:
    """Samples the memory of a process and all its descendants (psutil) every ``every`` seconds."""

    def __init__(self, pid, every=0.01):
        import psutil
        self.proc, self.every = psutil.Process(pid), every
        self.pss = self.rss = self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        import psutil
        while not self._stop.is_set():
            try:
                tree = [self.proc] + self.proc.children(recursive=True)
            except psutil.Error:
                break
            pss = rss = 0
            for p in tree:
                try:
                    rss += p.memory_info().rss
                    pss += _pss(p.pid)
                except psutil.Error:
                    pass
            self.pss, self.rss = max(self.pss, pss), max(self.rss, rss)
            self.most = max(self.most, len(tree))
            time.sleep(self.every)

    def stop(self):
        self._stop.set()
        self._thread.join()


def run_compare(env_dir, trainer, python=sys.executable, env=None, **kw):
    """One compare in a fresh process: its result, with the tree's peak memory and the process's wall time."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([python, "-c", CHILD, env_dir, trainer, json.dumps(kw)], stdout=subprocess.PIPE,
                            text=True, env=env)
    mem = TreeMemory(proc.pid)
    out, _ = proc.communicate()
    mem.stop()
    if proc.returncode:
        raise SystemExit("compare %s failed (exit %d)" % (kw, proc.returncode))
    result = json.loads(out.strip().splitlines()[-1])
    result.update(process_s=time.perf_counter() - t0, pss=mem.pss, rss=mem.rss, processes=mem.most)
    return result


def pairs(env_dir, trainer, settings, n, python=sys.executable, env=None):
    """``n`` runs of each of ``settings`` ({name: compare kwargs}), alternating, the order turning each round."""
    got = {name: [] for name in settings}
    names = list(settings)
    for k in range(n):
        for name in (names if k % 2 == 0 else names[::-1]):
            r = run_compare(env_dir, trainer, python, env, **settings[name])
            got[name].append(r)
            log("  %s: %.2f s, PSS %.0f MB, RSS %.0f MB, %d processes (%s)"
                % (name, r["seconds"], r["pss"] / MB, r["rss"] / MB, r["processes"], uptime()))
    return got


def med(runs, key):
    return statistics.median(r[key] for r in runs)


def ratio(runs, a, b, key="seconds"):
    """The median of the paired ratios b/a (run k of b against run k of a)."""
    return statistics.median(y[key] / x[key] for x, y in zip(runs[a], runs[b]))


def table(runs, names, caption):
    rows = ["| %s | seconds (median) | process wall time | CPU seconds, all processes | peak PSS, all processes "
            "| peak RSS summed | processes |" % caption, "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in names:
        rs = runs[name]
        rows.append("| %s | %.2f | %.2f | %.2f | %.0f MB | %.0f MB | %d |" % (
            name, med(rs, "seconds"), med(rs, "process_s"), med(rs, "cpu_s"), med(rs, "pss") / MB, med(rs, "rss") / MB,
            max(r["processes"] for r in rs)))
    return rows


# ---------------------------------------------------------------- the parts

def part_jobs(base, n, envs=16, events=1_000_000):
    import big_ledgers
    directory = os.path.join(base, "jobs" if envs == 16 and events == 1_000_000 else "jobs-%d-%d" % (envs, events))
    if not os.path.exists(os.path.join(directory, "trainer.npz")):
        log("writing %d env ledgers and a trainer ledger of %d events a stream ..." % (envs, events))
        big_ledgers.write_pair(directory, envs, events)
    trainer = os.path.join(directory, "trainer.npz")
    before = uptime()
    log("%d envs x %d events: --jobs 1 against --jobs 2, %d pairs (%s)" % (envs, events, n, before))
    runs = pairs(directory, trainer, {"--jobs 1": {"jobs": 1}, "--jobs 2": {"jobs": 2}}, n)
    two = runs["--jobs 2"]
    lines = ["Comparing %s envs x %s events a side (the sides agree, so every event is read), %d runs of each, "
             "alternated, each in a fresh process; load before: %s, after: %s (2 cores shared with other "
             "sessions: a load above 2 slows every process, and a second worker gains only what is left over)."
             % (f"{envs:,}", f"{events:,}", n, before, uptime()), ""]
    lines += table(runs, ["--jobs 1", "--jobs 2"], "%s x %s" % (f"{envs:,}", f"{events:,}"))
    lines += ["", "--jobs 2 against --jobs 1: %.2fx the time (median of the paired ratios). Targets: at most %.1f s "
              "(measured %.2f s), at most %d MB for all processes together (measured %.0f MB PSS, %.0f MB RSS summed)."
              % (ratio(runs, "--jobs 1", "--jobs 2"), TARGETS["jobs_s"], med(two, "seconds"), TARGETS["jobs_mb"],
                 med(two, "pss") / MB, med(two, "rss") / MB)]
    return lines


def _ray_python():
    sys.path.insert(0, os.path.join(TESTS, "rllib"))
    import test_rllib_venv as venv
    python = os.path.join(venv.VENV, "bin", "python")
    if not os.path.exists(os.path.join(venv.VENV, venv.MARKER)):
        raise SystemExit("no Ray venv at %s: run tests/rllib/test_rllib_venv.py (or tests/report/test_compare_ray.py) "
                         "once to build it" % venv.VENV)
    return python


def part_ray(base, n):
    import big_ledgers
    python = _ray_python()
    directory = os.path.join(base, "jobs")
    if not os.path.exists(os.path.join(directory, "trainer.npz")):
        big_ledgers.write_pair(directory, 16, 1_000_000)
    trainer = os.path.join(directory, "trainer.npz")
    env = dict(os.environ, PYTHONPATH=ROOT)
    got = {}
    for cpus in (1, 2, 1, 2):
        log("Ray, a local cluster of %d CPU(s) (%s)" % (cpus, uptime()))
        out = subprocess.run([python, "-c", RAY_CHILD, directory, trainer, str(cpus), str(n)], capture_output=True,
                             text=True, env=env, timeout=900)
        if out.returncode:
            raise SystemExit("the Ray compare failed: %s" % out.stderr[-2000:])
        r = json.loads(out.stdout.strip().splitlines()[-1])
        got.setdefault(cpus, []).extend(r["times"])
        log("  %s" % ", ".join("%.2f s" % t for t in r["times"]))
    one = statistics.median(got[1])
    lines = ["Ray: the same 16 envs x 1,000,000 events, compared as Ray tasks (`compare(..., ray=True)`, one task per "
             "CPU, each reading its ledgers from the path) on a local cluster, `ray.init(num_cpus=N)`; %d compares "
             "in each of two sessions per N, after a first one that starts the workers; load: %s." % (n, uptime()),
             "", "| Ray workers (CPUs) | seconds (median) | against 1 worker |", "| --- | --- | --- |"]
    for cpus in (1, 2):
        lines.append("| %d | %.2f | %.2fx |" % (cpus, statistics.median(got[cpus]), statistics.median(got[cpus]) / one))
    return lines


def part_large(base, n, envs=1000, events=100_000, s3=True):
    import big_ledgers
    directory = os.path.join(base, "large")
    if not os.path.exists(os.path.join(directory, "trainer.npz")):
        log("writing %d env ledgers and a trainer ledger of %d events a stream ..." % (envs, events))
        t0 = time.perf_counter()
        big_ledgers.write_pair(directory, envs, events)
        log("  %.0f s" % (time.perf_counter() - t0))
    trainer = os.path.join(directory, "trainer.npz")
    small = os.path.join(base, "large-%d" % (envs // 4))
    if not os.path.exists(os.path.join(small, "trainer.npz")):
        big_ledgers.write_pair(small, envs // 4, events)
    before = uptime()
    log("%d envs x %d events, local (%s)" % (envs, events, before))
    local = pairs(directory, trainer, {"--jobs 1": {"jobs": 1}, "--jobs 2": {"jobs": 2}}, n)
    quarter = pairs(small, os.path.join(small, "trainer.npz"), {"--jobs 1": {"jobs": 1}, "--jobs 2": {"jobs": 2}}, n)
    lines = ["%s env ledgers x %s events a side (%s events a side), the sides agreeing, %d runs of each, alternated; "
             "load before: %s, after: %s." % (f"{envs:,}", f"{events:,}", f"{envs * events:,}", n, before, uptime()), ""]
    lines += table(local, ["--jobs 1", "--jobs 2"], "local, %d envs" % envs)
    lines += ["", "Memory against the number of envs (%d envs of the same length):" % (envs // 4), ""]
    lines += table(quarter, ["--jobs 1", "--jobs 2"], "local, %d envs" % (envs // 4))
    s3 = _on_s3([(directory, "run"), (small, "quarter")], n) if s3 else None
    if s3 is not None:
        lines += ["", "The same ledgers on an S3-compatible server on loopback (%s, through s3fs), compared from their "
                  "URLs (each ledger fetched to a temporary directory, then read; a large one in ranged reads of "
                  "%d MB):" % (s3[0], storage.FETCH_BLOCK >> 20), ""]
        lines += table(s3[1]["run"], ["--jobs 1", "--jobs 2"], "S3, %d envs" % envs)
        lines += ["", "Memory against the number of envs on S3:", ""]
        lines += table(s3[1]["quarter"], ["--jobs 1", "--jobs 2"], "S3, %d envs" % (envs // 4))
    return lines


def _on_s3(directories, n):
    """Each (local directory, name) uploaded to a bucket of a loopback S3 server and compared from there:
    (the server's kind, {name: runs}), or None without a server."""
    try:
        import s3server
        server = s3server.S3Server()
    except Exception as exc:  # noqa: BLE001  (no server: the S3 table is left out, with why)
        log("no S3 server: %s" % exc)
        return None
    server.start()
    try:
        bucket = server.make_bucket("bench-large")
        fs = server.filesystem()
        env = dict(os.environ, **server.environ())
        runs = {}
        for directory, name in directories:
            log("uploading %s to the S3 server ..." % directory)
            t0 = time.perf_counter()
            names = sorted(os.listdir(directory))
            fs.put([os.path.join(directory, x) for x in names], ["%s/%s/%s" % (bucket, name, x) for x in names])
            log("  %.0f s" % (time.perf_counter() - t0))
            runs[name] = pairs("s3://%s/%s" % (bucket, name), "s3://%s/%s/trainer.npz" % (bucket, name),
                               {"--jobs 1": {"jobs": 1}, "--jobs 2": {"jobs": 2}}, n, env=env)
        return server.kind, runs
    finally:
        server.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["jobs", "ray", "large", "all"], default="all")
    p.add_argument("--pairs", type=int, default=5, help="runs of each setting (default 5)")
    p.add_argument("--dir", help="where the ledgers are written and kept (default: a temporary directory, removed)")
    p.add_argument("--no-write", action="store_true", help="print the tables only; RESULTS.md is left as it is")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 4 envs x 600,000 events with and without workers, and 40 envs x 2,000 events "
                        "local (no Ray, no S3); RESULTS.md is left as it is")
    args = p.parse_args()
    if args.quick:
        base = tempfile.mkdtemp(prefix="stepledger-compare-scale-")
        try:
            lines = part_jobs(base, 1, 4, 600_000) + [""] + part_large(base, 1, 40, 2000, s3=False)
            _results.show("compare_scale", "## Compare at scale (--quick)\n\n%s" % "\n".join(lines), write=False)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        return
    base = args.dir or tempfile.mkdtemp(prefix="stepledger-compare-scale-")
    os.makedirs(base, exist_ok=True)
    try:
        lines = [_results.machine(), ""]
        if args.part in ("jobs", "all"):
            lines += part_jobs(base, args.pairs) + [""]
        if args.part in ("ray", "all"):
            lines += part_ray(base, args.pairs) + [""]
        if args.part in ("large", "all"):
            lines += part_large(base, max(1, args.pairs // 2)) + [""]
        lines.append("Command: `python benchmarks/compare_scale.py --part %s --pairs %d`." % (args.part, args.pairs))
        _results.show("compare_scale_%s" % args.part, "## Compare at scale (benchmarks/compare_scale.py, part %s)\n\n%s"
                      % (args.part, "\n".join(lines)), write=not args.no_write)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
