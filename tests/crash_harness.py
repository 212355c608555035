"""A training script killed at a random moment by tests/recording/test_kills.py and benchmarks/kill_soak.py,
and what they check afterwards: every event the test knows was recorded is read back, and nothing else.

    python -c "import crash_harness as K; K.main(HARNESS, MODE, DIRECTORY, STEPS)"

HARNESS: as tests/ending_harness.py (async-fork, async-forkserver, async-spawn, sync, subproc, dummy).
MODE:
- run: steps until killed. After each vector step it writes ``s T N0 N1`` to stdout (a pipe: once written,
  the test has it, whatever then happens to this process): T vector steps, N_i the trainer side's events of
  env i so far. Every env side has recorded at least as many (it records before it returns), so those are the
  events the test knows were recorded, on both sides;
- close: steps STEPS vector steps, prints ``closing N0 N1``, then closes (the test kills it during the close);
- segv: as run, but env 1's step number STEPS (counted from the start, all episodes) dies of a segfault raised
  through ctypes inside ``env.step``, under LedgerEnv;
- reference: steps STEPS vector steps and closes: the streams every killed run's must be prefixes of.

Spills every CRASH_FLUSH seconds (0.05 by default), so that kills land in spills and merges too.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np

os.environ.setdefault("ENDING_HARNESS_FLUSH", os.environ.get("CRASH_FLUSH", "0.05"))
import ending_harness as H  # noqa: E402

from stepledger import LedgerEnv, read  # noqa: E402

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 120


class SegfaultAt(gym.Wrapper):
    """Dies of SIGSEGV in its step number ``at`` (a read of address 0 through ctypes: the env's own code)."""

    def __init__(self, env, at):
        super().__init__(env)
        self.at, self.steps = at, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.at:
            ctypes.string_at(0)  # a segfault, as a simulator's C code gives one
        return self.env.step(action)


def make_segv_env(index, directory, at):
    env = gym.make("CartPole-v1")
    if index == 1:
        env = SegfaultAt(env, at)
    return LedgerEnv(env, directory, index=index, flush_interval=H.FLUSH_INTERVAL, keep_values=H.KEEP_VALUES)


def main(harness, mode, directory, steps):
    steps = int(steps)
    make = None
    if mode == "segv":
        import functools
        make = lambda i, d: functools.partial(make_segv_env, i, d, steps)  # noqa: E731
    envs, pids, kind = H.build(harness, directory, make)
    print("workers", *pids, flush=True)
    actions = np.random.default_rng(0).integers(0, 2, size=(100_000, H.N_ENVS))
    if kind == "gym":
        envs.reset(seed=0)
    else:
        envs.seed(0)
        envs.reset()
    counts = envs.ledger._rec.counts
    out = sys.stdout
    t = 0
    while mode in ("run", "segv") or t < steps:
        envs.step(actions[t % len(actions)])
        t += 1
        if mode in ("run", "segv"):
            out.write("s %d %s\n" % (t, " ".join(str(int(c)) for c in counts)))
            out.flush()
    print("closing", *(int(c) for c in counts), flush=True)
    envs.close()
    print("done", t, flush=True)


def streams(path):
    """{env index: columns} of the ledger at ``path`` (a file or an env directory)."""
    with read(path) as led:
        return {i: {k: np.asarray(v) for k, v in s.columns.items()} for i, s in led.streams.items()}, dict(led.meta)


def kept_values(path):
    """{env index: {member: array}} of the kept values (keep_values=True) the ledger at ``path`` holds."""
    with read(path) as led:
        return {i: {k: np.asarray(v) for k, v in s.values.items()} for i, s in led.streams.items()}


def check_prefix(got, reference, known):
    """Events lost (those known recorded and not read back) per stream, after asserting that what was read
    is the reference's first events, nothing else (no event of another, no half-written one)."""
    lost = {}
    for i, need in known.items():
        cols = got.get(i)
        n = 0 if cols is None else len(cols["kind"])
        ref = reference[i]
        assert n <= len(ref["kind"]), "stream %d: %d events, more than the reference's %d" % (i, n, len(ref["kind"]))
        for name in ("kind", "h_obs", "h_act", "h_rew", "terminated", "truncated"):
            if n:
                bad = np.flatnonzero(cols[name] != ref[name][:n])
                assert not bad.size, "stream %d: %s differs from the reference at event %d of %d" % (
                    i, name, int(bad[0]), n)
        lost[i] = max(0, need - n)
    return lost


# ---------------------------------------------------------------- the killing side

def _env(flush, keep_values=False):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_") or k == "STEPLEDGER_MAPPED_BYTES"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, env.get("PYTHONPATH")) if p)
    # the interval itself, not this process's ENDING_HARNESS_FLUSH (importing this module set it to the default)
    env["CRASH_FLUSH"] = env["ENDING_HARNESS_FLUSH"] = str(flush)
    env["ENDING_HARNESS_KEEP_VALUES"] = "1" if keep_values else "0"
    return env


def start(harness, mode, directory, steps, flush=0.05, keep_values=False):
    script = "import crash_harness as K; K.main(%r, %r, %r, %d)" % (harness, mode, directory, steps)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(flush, keep_values), start_new_session=True)


def finish(proc, timeout=TIMEOUT):
    """Wait for the script's end (it was killed, or it ends by itself; after ``timeout`` s it is killed), every
    process of its group gone; returns the lines it wrote and its stderr."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SB3's SubprocVecEnv waits forever for a worker that died: the user kills it, as they would
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:  # the workers too
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    return out.splitlines(), err


def kill_at(proc, target, rng):
    """SIGKILL the whole group once the script reports ``target`` vector steps (and a random moment more)."""
    for line in proc.stdout:
        if line.startswith("s ") and int(line.split()[1]) >= target:
            time.sleep(float(rng.uniform(0, 0.01)))
            os.killpg(proc.pid, signal.SIGKILL)
            return [line.rstrip("\n")]
    return []


def known_counts(lines):
    """{env: events} of the last whole ``s`` (or ``closing``) line: what both sides had recorded by then."""
    last = [ln.split() for ln in lines if ln.startswith(("s ", "closing")) and ln.endswith(tuple("0123456789"))]
    if not last:
        return {}
    fields = last[-1]
    counts = fields[2:] if fields[0] == "s" else fields[1:]
    return {i: int(c) for i, c in enumerate(counts)}


