"""A training script that ends in a chosen way, run in its own process by test_runs_that_end_badly.py,
and the helpers every test of a killed script uses (``kill_group_when_ready``, ``wait_for``, ``on_disk``,
``reap``).

    python -c "import ending_harness as H; H.main(HARNESS, ENDING, DIRECTORY)"

HARNESS: async-fork, async-forkserver, async-spawn, sync, subproc, dummy.
ENDING:
- close: steps, then close() as documented;
- no-close: steps, then the script ends without close();
- exception: steps, then an error escapes the training loop;
- wait: steps until a signal from outside ends it (Ctrl-C to the process group,
  SIGTERM to the trainer, SIGKILL to a worker);
- idle: steps for a while, then neither the trainer nor its workers record (the
  trainer is busy in a long update) until a signal from outside ends it (SIGKILL
  to every process).

It prints ``ready STEPS PID...`` (vector steps so far and the worker pids) once it
has stepped for a while, or ``idle STEPS EVENTS PID...`` as it stops stepping (EVENTS:
the trainer side's recorded events), so the test knows when to act, and which
processes to wait for afterwards.
"""

import functools
import os
import signal
import sys
import time

import gymnasium as gym
import numpy as np

from stepledger import LedgerEnv, LedgerError, LedgerVectorEnv, read

N_ENVS = 2
FLUSH_INTERVAL = float(os.environ.get("ENDING_HARNESS_FLUSH", "0.3"))  # crash_harness.py spills more often
KEEP_VALUES = os.environ.get("ENDING_HARNESS_KEEP_VALUES") == "1"  # keep_values=True on both sides


def on_disk(path):
    """{stream: events} of the ledger at ``path`` (a file, or a directory of env ledgers) that a reader finds
    now, while its writers go on; {} while there is nothing whole to read yet."""
    try:
        with read(path) as led:
            return {i: len(s) for i, s in led.streams.items()}
    except (LedgerError, OSError):
        return {}


def wait_for(condition, timeout=60.0):
    """Until ``condition()`` holds: as soon as a busy machine has run what makes it true (spills go by time)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within %.0f s" % timeout
        time.sleep(0.01)


def kill_group_when_ready(proc, written, timeout, meanwhile=None):
    """Wait for the script's ``ready`` line (then run ``meanwhile()``), then until ``written()`` holds (what the
    test needs the periodic spills to have put on disk, however long a busy machine takes), then SIGKILL its
    whole process group (the trainer and its env workers, with no warning) and wait for the trainer to die."""
    line = proc.stdout.readline()
    assert line.startswith("ready"), proc.stderr.read()[-3000:]
    if meanwhile is not None:
        meanwhile()
    wait_for(written, timeout)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout)


def reap(proc):
    """However the test went: nothing of a script started in its own session is left running, and its
    pipes are closed."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    proc.stdout.close()
    proc.stderr.close()


def make_env(index, directory):
    return LedgerEnv(gym.make("CartPole-v1"), directory, index=index, flush_interval=FLUSH_INTERVAL,
                     keep_values=KEEP_VALUES)


def build(harness, directory, make=None):
    """The harness's vector env, both ledgers in: ``make(i, directory)`` gives env i's function (make_env's)."""
    fns = [make(i, directory) if make else functools.partial(make_env, i, directory) for i in range(N_ENVS)]
    trainer = os.path.join(directory, "trainer.npz")
    if harness.startswith("async-"):
        venv = gym.vector.AsyncVectorEnv(fns, context=harness.split("-", 1)[1])
        pids = [p.pid for p in venv.processes]
        return LedgerVectorEnv(venv, trainer, flush_interval=FLUSH_INTERVAL, keep_values=KEEP_VALUES), pids, "gym"
    if harness == "sync":
        return LedgerVectorEnv(gym.vector.SyncVectorEnv(fns), trainer, flush_interval=FLUSH_INTERVAL,
                               keep_values=KEEP_VALUES), [], "gym"
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from stepledger.sb3 import LedgerVecEnv
    if harness == "subproc":
        venv = SubprocVecEnv(fns, start_method="fork")
        pids = [p.pid for p in venv.processes]
    else:
        venv = DummyVecEnv(fns)
        pids = []
    return LedgerVecEnv(venv, trainer, flush_interval=FLUSH_INTERVAL, keep_values=KEEP_VALUES), pids, "sb3"


def main(harness, ending, directory, steps=400):
    envs, pids, kind = build(harness, directory)
    print("workers", *pids, flush=True)
    actions = np.random.default_rng(0).integers(0, 2, size=(100_000, N_ENVS))
    if kind == "gym":
        envs.reset(seed=0)
        step = envs.step
    else:
        envs.seed(0)
        envs.reset()
        step = envs.step
    started = time.monotonic()
    announced = False
    t = 0
    while True:
        step(actions[t % len(actions)])
        t += 1
        if ending not in ("wait", "idle") and t == steps:
            break
        if ending == "idle" and t >= steps and time.monotonic() - started > 1.0:
            # the trainer side's events: what the idle spillers of every process must bring to the disk
            print("idle", t, envs.ledger.recording.n_events(), *pids, flush=True)
            time.sleep(120)  # a long update: nothing is recorded anywhere until the test kills every process
            break
        if ending == "wait" and not announced and t >= steps and time.monotonic() - started > 1.0:
            print("ready", t, *pids, flush=True)
            announced = True
        if announced:
            time.sleep(0.001)  # keep stepping, at a pace the signal can find it mid-run
    if ending == "close":
        envs.close()
    elif ending == "exception":
        raise RuntimeError("the training loop failed")
    # no-close: the script just ends
    print("done", t, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
