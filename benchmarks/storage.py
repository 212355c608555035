"""What a ledger costs in memory and on disk, how long it takes to write and to
compare, and that its memory stays bounded however long the run: each set
against the specification's figures or approach, in one run.

Part 1, bytes an event. A SyncVectorEnv of 16 Pendulum-v1 with LedgerEnv on
each env and LedgerVectorEnv around it, pre-generated random actions, with
and without keep_values. In memory: the bytes the core counts (27 an event by
design, plus the kept values) and the growth of the process's RSS, over the
events both sides recorded. On disk: the env files and the trainer file, over
their events, episode and step counters included.

Part 2, RSS over a long run. 100M events (--events) through the core: a
VectorRecorder over 16 streams fed as LedgerVectorEnv feeds it, spilling past
the memory limit. RSS is sampled every tenth of the run; the bound printed is
the RSS before recording plus the memory limit. The spill files are deleted
afterwards, without writing a final file.

Part 3, writing a 16M-event trainer ledger. 16 envs x 1M events recorded
through a real Recording and core.VectorRecorder, then close() is timed, and
the specification's approach for the same columns: np.savez_compressed.

Part 4, comparing 16 envs x 1M events a side. The env-side files are written
from the trainer ledger's streams (stepledger.read, then
ledgerfile.write_ledger with side "env"), so the sides agree and every event
is read. Timed: stepledger.compare, and the specification's approach: np.load
of savez_compressed columns (one column at a time, its leanest use), then
np.flatnonzero(a != b) per stream.

Parts 2 to 4 record the batches of a real 16-env Pendulum-v1 rollout (obs
float32, rewards float64, truncation every 200 steps, so next-step resets
happen), cycled; the rollout is long enough that no digest or reward repeats
within deflate's 32 KB window. Every measurement runs in a fresh process, which
reports its own time and peak RSS (VmHWM, which counts that process alone), so
that one part's freed memory cannot hide another's.

    python benchmarks/storage.py            # the full run: about 4 minutes on a
                                            # busy 2-core machine; writes RESULTS.md
    python benchmarks/storage.py --quick    # a smoke run (about 10 s), writes nothing
    python benchmarks/storage.py --profile --no-write
                                            # also where close() and compare spend
                                            # their time; prints only

The full run needs about 3 GB free in the temporary directory (--tmpdir) for
part 2's spill files, and about 1 GB of memory.
"""

import argparse
import cProfile
import json
import os
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = {"memory": 27, "disk": 20, "disk_values": 35}  # the specification's bytes an event
TARGETS = {"close_s": 2.0, "disk_bytes": 21.0, "compare_s": 2.0, "compare_mb": 256}
MB = 1 << 20


# ---------------------------------------------------------------- measuring a process

def vm(key):
    """This process's VmRSS or VmHWM in bytes (ru_maxrss where there is no /proc)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class PeakRSS:
    """Samples this process's RSS in a thread; ``peak`` is the largest seen."""

    def __init__(self, every=0.005):
        self.every, self.peak = every, vm("VmRSS")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, vm("VmRSS"))
            time.sleep(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, vm("VmRSS"))


def in_fresh_process(part, *args):
    """Run ``part`` of this script in a new interpreter: its JSON result, plus its wall time."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--part", part] + [str(a) for a in args],
                          stdout=subprocess.PIPE, text=True)
    if proc.returncode:
        raise SystemExit("part %s failed (exit %d)" % (part, proc.returncode))
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.perf_counter() - t0
    return result


def timed(fn, profile=False):
    """fn()'s result, its wall time and, if asked, the functions that took the most time of their own in it."""
    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    try:
        result = fn()
    finally:
        if prof:
            prof.disable()
    seconds = time.perf_counter() - t0
    top = []
    if prof:
        by_own_time = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])
        for (path, line, name), (_, _, own, _, _) in by_own_time[:8]:
            top.append((name if path == "~" else "%s:%d(%s)" % (os.path.basename(path), line, name), own))
    return result, seconds, top


def du(path):
    """Bytes of a file, or of the .npz files in a directory."""
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".npz"))
    return os.path.getsize(path)


def log(text):
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- part 1: bytes an event

def bytes_per_event(n_envs, steps, keep_values, tmp):
    import gymnasium as gym

    from stepledger import LedgerEnv, LedgerVectorEnv, read
    from stepledger import core
    d = tempfile.mkdtemp(prefix="bytes-", dir=tmp)
    trainer = os.path.join(d, "trainer.npz")
    # no periodic spills either (flush_interval=inf): everything recorded is in memory when counted
    envs = gym.vector.SyncVectorEnv([lambda i=i: LedgerEnv(gym.make("Pendulum-v1"), d, index=i, keep_values=keep_values,
                                                           flush_interval=float("inf"))
                                     for i in range(n_envs)])
    envs = LedgerVectorEnv(envs, trainer, keep_values=keep_values, flush_interval=float("inf"))
    actions = np.random.default_rng(0).uniform(-2, 2, (steps, n_envs, 1)).astype(np.float32)
    core.set_memory_limit(1 << 62)  # no spill: all that was recorded is in memory when counted
    used0, rss0 = core.memory_in_use(), vm("VmRSS")
    envs.reset(seed=0)
    for a in actions:
        envs.step(a)
    used, grown = core.memory_in_use() - used0, vm("VmRSS") - rss0
    envs.close()
    with read(d) as env_side, read(trainer) as trainer_side:
        n_env, n_tr = env_side.n_events(), trainer_side.n_events()
    trainer_bytes = du(trainer)
    env_bytes = du(d) - trainer_bytes
    shutil.rmtree(d, ignore_errors=True)
    return {"memory": used / (n_env + n_tr), "rss": grown / (n_env + n_tr), "disk_env": env_bytes / n_env,
            "disk_trainer": trainer_bytes / n_tr, "events": n_env}


# ---------------------------------------------------------------- a Pendulum stream through the core

class Pool:
    """The batches of a real SyncVectorEnv rollout of Pendulum-v1, to be cycled."""

    def __init__(self, n_envs, steps, seed=0):
        import gymnasium as gym

        from stepledger.format.spaces import LeafLayout
        envs = gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1") for _ in range(n_envs)])
        self.obs_layout = LeafLayout(envs.single_observation_space)
        self.act_layout = LeafLayout(envs.single_action_space)
        self.actions = np.random.default_rng(seed).uniform(-2, 2, (steps, n_envs, 1)).astype(np.float32)
        self.reset_obs, _ = envs.reset(seed=seed)
        self.obs = np.empty((steps, n_envs, 3), np.float32)
        self.rewards = np.empty((steps, n_envs), np.float64)
        self.terminated = np.empty((steps, n_envs), np.bool_)
        self.truncated = np.empty((steps, n_envs), np.bool_)
        for t in range(steps):
            o, r, te, tr, _ = envs.step(self.actions[t])
            self.obs[t], self.rewards[t], self.terminated[t], self.truncated[t] = o, r, te, tr
        envs.close()
        self.n_envs, self.steps = n_envs, steps


def record(path, pool, events_per_env, samples=0, on_sample=None):
    """Record ``events_per_env`` events a stream through Recording + VectorRecorder, as
    LedgerVectorEnv does under NEXT_STEP (spilling when a call says the limit is passed);
    ``on_sample(events so far)`` is called ``samples`` times along the way."""
    from stepledger import core
    from stepledger.recording import Recording, spill_everything
    rec = Recording(path, "trainer", range(pool.n_envs), pool.obs_layout, pool.act_layout, np.float32, False,
                    {"autoreset_mode": "next_step"})
    vr = core.VectorRecorder(rec.buffers, pool.obs_layout, pool.act_layout, True)
    actions, obs, rew, te, tr, P = pool.actions, pool.obs, pool.rewards, pool.terminated, pool.truncated, pool.steps
    if vr.reset(pool.reset_obs):
        spill_everything()
    calls = events_per_env - 1
    blocks = max(samples, 1)
    k = 0
    for b in range(blocks):
        stop = calls * (b + 1) // blocks
        while k < stop:
            j = k % P
            vr.actions(actions[j])
            if vr.step_next(obs[j], rew[j], te[j], tr[j]):
                spill_everything()
            k += 1
        if on_sample:
            on_sample((k + 1) * pool.n_envs)
    return rec


def discard(rec):
    """Drop a recording without writing its final file, and delete its spill files."""
    from stepledger.format.ledgerfile import spill_dir
    rec.discard()
    shutil.rmtree(spill_dir(rec.path), ignore_errors=True)


# ---------------------------------------------------------------- part 2: RSS over a long run

def long_run(n_envs, events, pool_steps, tmp):
    from stepledger import core
    pool = Pool(n_envs, pool_steps)
    baseline = vm("VmRSS")
    samples = []
    t0 = time.perf_counter()

    def sample(n):
        samples.append((n, vm("VmRSS"), core.memory_in_use(), time.perf_counter() - t0))
        log("%14s events: RSS %.0f MB" % (f"{n:,}", samples[-1][1] / MB))

    with PeakRSS(every=0.02) as peak:
        rec = record(os.path.join(tmp, "long", "trainer.npz"), pool, events // n_envs, samples=10, on_sample=sample)
    seconds = time.perf_counter() - t0
    segments = rec.spills
    discard(rec)
    return {"baseline": baseline, "samples": samples, "peak": peak.peak, "seconds": seconds,
            "segments": segments, "limit": core.memory_limit()}


# ---------------------------------------------------------------- part 3: writing a long trainer ledger

def write_trainer(n_envs, events_per_env, pool_steps, directory, profile):
    """Record, then close(); then np.savez_compressed of the same columns. Leaves both files."""
    from stepledger import core
    pool = Pool(n_envs, pool_steps)
    trainer = os.path.join(directory, "trainer.npz")
    t0 = time.perf_counter()
    rec = record(trainer, pool, events_per_env)
    record_s = time.perf_counter() - t0
    segments = rec.spills
    before = vm("VmRSS")
    with PeakRSS() as peak:
        _, close_s, top = timed(rec.close, profile)
    with np.load(trainer) as z:
        columns = {name: z[name] for name in z.files if name != "meta"}
    t0 = time.perf_counter()
    np.savez_compressed(os.path.join(directory, "spec-trainer.npz"), **columns)
    spec_s = time.perf_counter() - t0
    return {"record_s": record_s, "segments": segments, "close_s": close_s, "close_peak": peak.peak - before,
            "spec_s": spec_s, "limit": core.memory_limit(), "profile": top}


def write_env_side(directory):
    """The 16 env files from the trainer ledger's streams, in both forms."""
    from stepledger import read
    from stepledger.format.ledgerfile import Segment, write_ledger
    env_dir, spec_dir = os.path.join(directory, "env"), os.path.join(directory, "spec-env")
    os.makedirs(env_dir)
    os.makedirs(spec_dir)
    ours_s = spec_s = 0.0
    with read(os.path.join(directory, "trainer.npz")) as ledger:
        meta = dict(ledger.meta, side="env")
        meta.pop("autoreset_mode", None)  # LedgerEnv's meta has none
        for i, stream in ledger.streams.items():
            cols = stream.columns
            t0 = time.perf_counter()
            write_ledger(os.path.join(env_dir, "env-%d.npz" % i), meta, [i], [Segment({i: cols})])
            t1 = time.perf_counter()
            np.savez_compressed(os.path.join(spec_dir, "env-%d.npz" % i), **cols)
            spec_s += time.perf_counter() - t1
            ours_s += t1 - t0
    return {"env_ours_s": ours_s, "env_spec_s": spec_s}


# ---------------------------------------------------------------- part 4: comparing

def compare_stepledger(directory):
    from stepledger import compare
    return bool(compare(os.path.join(directory, "env"), os.path.join(directory, "trainer.npz")))


def compare_specification(directory):
    """np.load the savez_compressed columns, one column of each side at a time; NumPy per stream."""
    from stepledger.format.schema import EVENT_COLUMN_NAMES
    first = {}
    with np.load(os.path.join(directory, "spec-trainer.npz")) as trainer:
        ids, offsets = trainer["env_index"], trainer["offsets"]
        for name in EVENT_COLUMN_NAMES:
            col = trainer[name]
            for k, i in enumerate(ids):
                with np.load(os.path.join(directory, "spec-env", "env-%d.npz" % i)) as env:
                    a = env[name]
                b = col[offsets[k]:offsets[k + 1]]
                n = min(len(a), len(b))
                diff = np.flatnonzero(a[:n] != b[:n])
                if diff.size or len(a) != len(b):
                    first[int(i)] = min(first.get(int(i), n), int(diff[0]) if diff.size else n)
            del col
    return not first


def timed_compare(which, directory, profile):
    baseline = vm("VmRSS")
    fn = compare_stepledger if which == "stepledger" else compare_specification
    ok, seconds, top = timed(lambda: fn(directory), profile)
    return {"seconds": seconds, "peak": vm("VmHWM"), "baseline": baseline, "ok": ok, "profile": top}


# ---------------------------------------------------------------- the run

def run_part(part, args):
    """Runs in a fresh interpreter; prints the part's result as JSON."""
    if part == "bytes":
        n, steps, keep, tmp = args
        out = bytes_per_event(int(n), int(steps), keep == "True", tmp)
    elif part == "long":
        n, events, pool, tmp = args
        out = long_run(int(n), int(events), int(pool), tmp)
    elif part == "write":
        n, events, pool, directory, profile = args
        out = write_trainer(int(n), int(events), int(pool), directory, profile == "True")
        out.update(write_env_side(directory))
    else:
        out = timed_compare(part, args[0], args[1] == "True")
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--steps", type=int, default=20_000, help="part 1: vector steps on Pendulum, per keep_values setting")
    p.add_argument("--events", type=int, default=100_000_000, help="part 2: events through the core, all streams")
    p.add_argument("--events-per-env", type=int, default=1_000_000, help="parts 3 and 4: events a stream")
    p.add_argument("--pool", type=int, default=8192, help="vector steps of the Pendulum rollout that is cycled")
    p.add_argument("--memory-limit-mb", type=float, default=None,
                   help="the memory limit before spilling (default: the library's, 64 MB)")
    p.add_argument("--tmpdir", default=None, help="where ledgers and spill files go (default: the system's)")
    p.add_argument("--profile", action="store_true",
                   help="also profile close() and compare (cProfile, in the timed call) and print where the time went")
    p.add_argument("--no-write", action="store_true", help="print the tables only, leave RESULTS.md alone")
    p.add_argument("--quick", action="store_true", help="a smoke run: small sizes, 1 MB limit, no RESULTS.md")
    if len(sys.argv) > 2 and sys.argv[1] == "--part":
        return run_part(sys.argv[2], sys.argv[3:])
    args = p.parse_args()
    if args.quick:
        args.steps, args.events_per_env, args.events, args.pool, args.memory_limit_mb = 300, 20_000, 2_000_000, 512, 1
    if args.memory_limit_mb is not None:  # the fresh processes read it at import
        os.environ["STEPLEDGER_MEMORY_LIMIT"] = str(int(args.memory_limit_mb * MB))
    sys.path.insert(0, HERE)
    from _results import machine, show

    n = args.num_envs
    tmp = tempfile.mkdtemp(prefix="stepledger-storage-", dir=args.tmpdir)
    started = time.perf_counter()
    try:
        out = ["## Storage (benchmarks/storage.py)", "", "%s." % machine(), ""]
        out += bytes_table(args, n, tmp)
        out += long_table(args, n, tmp)
        out += write_compare_tables(args, n, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out += ["", "Each part ran in a fresh process; the whole run took %.0f s." % (time.perf_counter() - started)]
    show("storage", "\n".join(out), write=not (args.quick or args.no_write))


def bytes_table(args, n, tmp):
    rows = ["Bytes an event (one reset or step of one env): SyncVectorEnv of %d Pendulum-v1, LedgerEnv on each env "
            "and LedgerVectorEnv, %d vector steps of pre-generated actions." % (n, args.steps), "",
            "| keep_values | in memory (counted) | RSS growth | on disk, env files | on disk, trainer file "
            "| specification (memory; disk) |",
            "| --- | --- | --- | --- | --- | --- |"]
    for keep in (False, True):
        r = in_fresh_process("bytes", n, args.steps, keep, tmp)
        spec = ("%d + values; %d" % (SPEC["memory"], SPEC["disk_values"]) if keep
                else "%d; %d" % (SPEC["memory"], SPEC["disk"]))
        rows.append("| %s | %.1f | %.1f | %.2f | %.2f | %s |" % (
            keep, r["memory"], r["rss"], r["disk_env"], r["disk_trainer"], spec))
        log(rows[-1])
    rows += ["", "In memory: the core's count of event bytes (27 by design; keep_values adds the float32 obs of 3 and "
             "action of 1, 16 bytes) and the growth of the process's RSS, over the events both sides recorded "
             "(%s a side). On disk: file bytes over events." % f"{r['events']:,}", ""]
    return rows


def long_table(args, n, tmp):
    r = in_fresh_process("long", n, args.events, args.pool, tmp)
    base, limit, samples = r["baseline"], r["limit"], r["samples"]
    bound = base + limit
    rows = ["RSS while %s events go through the core (a VectorRecorder over %d streams; %.0f s, %d spill segments, "
            "deleted afterwards). RSS before recording %.0f MB, memory limit %.0f MB, bound = before + limit = %.0f MB:"
            % (f"{samples[-1][0]:,}", n, r["seconds"], r["segments"], base / MB, limit / MB, bound / MB), "",
            "| events | RSS | above before | event bytes held | seconds |", "| --- | --- | --- | --- | --- |"]
    for events, rss, used, s in samples:
        rows.append("| %s | %.0f MB | %+.0f MB | %.0f MB | %.0f |" % (f"{events:,}", rss / MB, (rss - base) / MB,
                                                                     used / MB, s))
    drift = samples[-1][1] - samples[0][1]
    rows += ["", "RSS moved by %+.1f MB from the first sample to the last; the peak (sampled every 20 ms) was %.0f MB, "
             "%s the bound by %.0f MB." % (drift / MB, r["peak"] / MB, "within" if r["peak"] <= bound else "over",
                                           abs(bound - r["peak"]) / MB), ""]
    return rows


def write_compare_tables(args, n, tmp):
    events = args.events_per_env
    total = n * events
    d = os.path.join(tmp, "big")
    os.makedirs(d)
    w = in_fresh_process("write", n, events, args.pool, d, args.profile)
    ours_b, spec_b = du(os.path.join(d, "trainer.npz")) / total, du(os.path.join(d, "spec-trainer.npz")) / total
    log("close() %.2f s, np.savez_compressed %.2f s" % (w["close_s"], w["spec_s"]))
    ours = in_fresh_process("stepledger", d, args.profile)
    spec = in_fresh_process("specification", d, False)
    if not (ours["ok"] and spec["ok"]):
        raise SystemExit("the two sides should agree: stepledger %s, specification %s" % (ours["ok"], spec["ok"]))
    rows = ["Writing a trainer ledger of %d envs x %s events (%s events, recorded in %.1f s through Recording and "
            "VectorRecorder, %d spill segments at a %.0f MB limit):"
            % (n, f"{events:,}", f"{total:,}", w["record_s"], w["segments"], w["limit"] / MB), "",
            "| | seconds | bytes an event on disk | peak RSS above before |",
            "| --- | --- | --- | --- |",
            "| stepledger `close()`, from the spilled segments | %.2f | %.2f | %.0f MB |" % (
                w["close_s"], ours_b, w["close_peak"] / MB),
            "| specification: `np.savez_compressed` of the same columns | %.2f | %.2f | (every column in memory) |"
            % (w["spec_s"], spec_b),
            "| stepledger against the specification | %.2fx the time | %.2fx the bytes | |" % (
                w["close_s"] / w["spec_s"], ours_b / spec_b), "",
            "Targets: `close()` at most %.0f s (measured %.2f s); at most %.0f bytes an event on disk (measured %.2f)."
            % (TARGETS["close_s"], w["close_s"], TARGETS["disk_bytes"], ours_b), "",
            "Comparing %d envs x %s events a side; the sides agree, so every event is read. The env files were "
            "written from the trainer ledger's streams (stepledger: %.1f s for the 16 files, "
            "`np.savez_compressed`: %.1f s). Seconds from the call to the result, loading included; peak RSS of "
            "the process (VmHWM), with its RSS after imports in brackets:"
            % (n, f"{events:,}", w["env_ours_s"], w["env_spec_s"]), "",
            "| | seconds | process wall time | peak RSS |",
            "| --- | --- | --- | --- |",
            "| `stepledger.compare` | %.2f | %.2f | %.0f MB (%.0f) |" % (
                ours["seconds"], ours["process_seconds"], ours["peak"] / MB, ours["baseline"] / MB),
            "| specification: `np.load` of `savez_compressed` columns, NumPy per stream | %.2f | %.2f | %.0f MB (%.0f) |"
            % (spec["seconds"], spec["process_seconds"], spec["peak"] / MB, spec["baseline"] / MB),
            "| stepledger against the specification | %.2fx the time | | %.2fx the peak |" % (
                ours["seconds"] / spec["seconds"], ours["peak"] / spec["peak"]), "",
            "Targets: compare at most %.0f s including loading (measured %.2f s); peak at most %d MB (measured %.0f MB)."
            % (TARGETS["compare_s"], ours["seconds"], TARGETS["compare_mb"], ours["peak"] / MB)]
    for what, r, seconds in (("`close()`", w, w.get("close_s")), ("`stepledger.compare`", ours, ours["seconds"])):
        if r["profile"]:
            rows += ["", "Where the time of %s went (cProfile, the functions with the most time of their own):" % what,
                     "", "| function | seconds | share |", "| --- | --- | --- |"]
            rows += ["| `%s` | %.2f | %.0f%% |" % (name, own, 100 * own / seconds) for name, own in r["profile"]]
    return rows


if __name__ == "__main__":
    main()
