"""The open recordings of this process, and the daemon thread that spills those whose recording thread is idle.

A process that stops recording (a worker waiting for its next action while the
trainer updates, a trainer in a long update) is spilled by a daemon thread of
its own, a tenth of an interval after the spill its recording thread did not
make (``IdleSpiller``): the events in memory are copied, written to a segment
and kept in memory until the recording thread's next spill lets go of them, so
that nothing is written twice and the step path takes no lock.

``reschedule()`` tells the core when the recordings of this process next want
attention: the deadline at which a recording call returns True and its wrapper
calls ``hooks.attend()``.
"""

from typing import Any

import math
import os
import threading
import time

from stepledger import core
from stepledger.format import storage

OPEN: dict[int, Any] = {}  # id -> Recording, for the exit handlers; strong refs so nothing is lost to GC
# Reentrant: the SIGTERM handler runs in the main thread between two bytecodes, maybe while that
# thread holds it (a LedgerEnv being built or closed), and closes every recording, taking it again.
LOCK = threading.RLock()
BUSY = object()  # Recording.idle_spill(): another thread holds the recording (it is writing)


class IdleSpiller:
    """This process's daemon thread that spills recordings whose recording thread has gone idle.

    Started at the first event a process records after it has an open
    recording (the core's deadline is set to now until then, so the first
    recording call returns True and calls attend()): a process that only builds
    ledgers, as Gymnasium's AsyncVectorEnv does in the parent for the spaces,
    starts no thread before it forks. It ends when no recording of the process
    is open. Threads do not survive fork: a child starts its own.
    """
    cond = threading.Condition()
    running = False
    failed = False  # could not start a thread (interpreter shutting down): spills stay step-driven

    @classmethod
    def start(cls):
        with cls.cond:
            if cls.running or cls.failed:
                return
            try:
                threading.Thread(target=cls._run, name="stepledger-idle-spill", daemon=True).start()
            except RuntimeError:
                cls.failed = True
                return
            cls.running = True

    @classmethod
    def wake(cls):
        """A recording opened or closed: look at the due times again."""
        with cls.cond:
            cls.cond.notify()

    @classmethod
    def _run(cls):
        cond = cls.cond
        while True:
            with cond:
                open_here = mine()
                if not open_here:
                    cls.running = False
                    return
                now = time.monotonic()
                wake = min(rec.idle_due() for rec in open_here)
                if wake > now:
                    cond.wait(min(wake - now, 60.0))
                    continue
            busy = False
            for rec in open_here:
                if now >= rec.idle_due():
                    busy |= rec.idle_spill() is BUSY
            reschedule()
            if busy:  # another thread is writing it: look again in a moment, not in a busy loop
                with cond:
                    cond.wait(0.005)


def mine():
    """The open recordings of this process (a forked child's inherited ones are not)."""
    pid = os.getpid()
    return [rec for rec in list(OPEN.values()) if rec.pid == pid and not rec.closed]


def reschedule():
    """Tell the core when the recordings of this process next want attention."""
    open_here = mine()
    if not open_here:
        core.set_deadline(math.inf)
        return
    if not IdleSpiller.running and not IdleSpiller.failed:
        core.set_deadline(0.0)  # the next event calls attend(), which starts the idle spiller
        return
    now = time.monotonic()
    backing_off = any(rec.retry_at > now or rec.failing() for rec in open_here)
    due = [max(rec.due, rec.retry_at) for rec in open_here if not rec.failing()]
    if any(rec.let_go_due for rec in open_here):
        due.append(0.0)  # the spiller wrote: the recording thread's next call lets go of those events
    core.set_deadline(min(due, default=math.inf), hold=backing_off)


def forget_parent_recordings():
    """In a forked child: the parent's recordings are not this process's, its idle spiller is not
    running here, and the locks may have been held at the fork (hooks.py calls this first)."""
    global LOCK
    LOCK = threading.RLock()
    IdleSpiller.cond, IdleSpiller.running = threading.Condition(), False
    for key, rec in list(OPEN.items()):
        if rec.pid != os.getpid():
            OPEN.pop(key, None)


def same_path(path):
    """What ``path`` names, for telling two recordings of one file apart: an absolute local path, or the URL."""
    return path if storage.is_remote(path) else os.path.abspath(path)


def open_recording(path):
    """Another open recording of this process at ``path`` that has recorded, or was given its index
    after construction (LedgerEnv.set_index), else None."""
    target = same_path(path)
    for rec in mine():
        if same_path(rec.path) == target and (rec.n_events() or rec.deferred):
            return rec
    return None

