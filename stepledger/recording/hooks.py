"""What keeps this process's ledgers through signals, exits and forks, and what the wrappers call when a spill is due.

- A process that exits without ``close()`` writes its ledgers from an atexit
  handler and from a ``multiprocessing.util.Finalize`` callback: worker
  processes leave through ``os._exit``, which skips atexit but not those.
- SIGTERM writes every ledger of the process, then gets its usual effect (the
  previous handler, or death by SIGTERM). A SIGTERM that arrives during a
  write is acted on when the write is done (``writing()``), and so is a Ctrl-C
  in the main thread.
- A forked child forgets its parent's recordings: it never writes or spills them.
- ``attend()``: a recording call returned True (a spill is due, by time or by
  memory); ``spill_everything()`` spills every recording of the process now.
"""

from typing import Any

import atexit
import contextlib
import math
import multiprocessing.util as mp_util
import os
import signal
import sys
import threading
import time
import warnings

from stepledger import core
from stepledger.format import schema as S
from stepledger.recording.spiller import IdleSpiller, forget_parent_recordings, mine, reschedule


class _Process:
    """This process's state: set up once per process (a forked child starts again)."""
    pid: Any = None
    writing = 0            # writes under way (a SIGTERM then waits for them)
    pending_signal: Any = None  # a SIGTERM that arrived during a write
    previous_sigterm: Any = None
    held_sigint: Any = None     # the SIGINT handler set aside while the main thread writes (see _hold_sigint)
    pending_sigint: Any = None  # (signum, frame) of a Ctrl-C that came meanwhile


def _close_all(state):
    for rec in mine():
        try:
            rec.close(state=state)
        except Exception as exc:  # at exit or on a signal there is no caller to raise to
            warnings.warn("stepledger could not write %s: %s" % (rec.path, exc), RuntimeWarning)


def _close_all_at_exit():
    # An exception that ended the program (a Ctrl-C in the training loop): Python sets sys.last_type before it
    # runs the exit handlers, and the ledgers say what cut the run.
    last = getattr(sys, "last_type", None)
    if isinstance(last, type):
        for rec in mine():
            if rec.interrupted_by is None:
                rec.interrupted_by = last.__name__
    _close_all(S.STATE_EXIT)


def _on_sigterm(signum, frame):
    if _Process.writing:
        _Process.pending_signal = signum  # a write is under way: finish it, then act
        return
    _end_by_signal(signum, frame)


def _end_by_signal(signum, frame):
    previous = _Process.previous_sigterm
    if callable(previous):
        # The program handles SIGTERM itself and may go on: write the ledgers, keep recording.
        for rec in mine():
            try:
                rec.write(state=S.STATE_SIGNAL)
            except Exception as exc:
                warnings.warn("stepledger could not write %s on SIGTERM: %s" % (rec.path, exc), RuntimeWarning)
        previous(signum, frame)
        return
    _close_all(S.STATE_SIGNAL)
    _end_daemonic_children()
    try:
        signal.signal(signum, signal.SIG_DFL)
    except ValueError:  # not the main thread: the default action is all that is left
        pass
    os.kill(os.getpid(), signum)


def _end_daemonic_children(timeout=30.0):
    """Terminate this process's daemonic children (vector env workers), as Python does at any exit.

    Death by SIGTERM skips multiprocessing's exit handler, which would have done
    it: SB3's workers would then wait forever on pipes their siblings hold open.
    Terminated, each writes its own ledgers (its SIGTERM handler) before it goes.
    """
    import multiprocessing
    try:
        children = [p for p in multiprocessing.active_children() if p.daemon]
    except Exception:
        return
    for p in children:
        try:
            p.terminate()
        except Exception:
            pass
    deadline = time.monotonic() + timeout
    for p in children:
        try:
            p.join(max(0.0, deadline - time.monotonic()))
        except Exception:
            pass


@contextlib.contextmanager
def writing():
    """A write, or a change of what is in memory against what the segments hold: a SIGTERM waits for
    its end, and so does a Ctrl-C in the main thread. A KeyboardInterrupt raised between writing a
    segment and letting go of its events would leave them both in the segment and in memory (written
    twice), or let go of without their count (lost)."""
    holding = _hold_sigint()
    try:
        _Process.writing += 1
        try:
            yield
        finally:
            _Process.writing -= 1
            if _Process.writing == 0 and _Process.pending_signal is not None:
                signum, _Process.pending_signal = _Process.pending_signal, None
                if threading.current_thread() is threading.main_thread():
                    _end_by_signal(signum, None)
                else:
                    # The write was another thread's (the idle spiller's): the signal goes back to the process,
                    # so that the main thread acts on it, as Python runs handlers. Acted on here, the program's
                    # own handler would run in this thread, late, while the main thread records on past the
                    # ledgers the SIGTERM wrote.
                    os.kill(os.getpid(), signum)
    finally:
        if holding:
            _let_sigint_through()


def _hold_sigint():
    """In the main thread, where Python raises KeyboardInterrupt, with a Python handler for SIGINT: set it
    aside until _let_sigint_through(). True if this call did (not already held, not another thread)."""
    if _Process.held_sigint is not None or threading.current_thread() is not threading.main_thread():
        return False
    try:
        previous = signal.getsignal(signal.SIGINT)
        if not callable(previous):
            return False  # ignored, the system's default, or set outside Python: nothing raised meanwhile
        signal.signal(signal.SIGINT, _sigint_held)
    except (ValueError, OSError, TypeError):
        return False
    _Process.held_sigint, _Process.pending_sigint = previous, None
    return True


def _sigint_held(signum, frame):
    _Process.pending_sigint = (signum, frame)


def _let_sigint_through():
    """Put the SIGINT handler back; a Ctrl-C that came meanwhile is handled now (KeyboardInterrupt)."""
    previous, _Process.held_sigint = _Process.held_sigint, None
    pending, _Process.pending_sigint = _Process.pending_sigint, None
    try:
        signal.signal(signal.SIGINT, previous)
    except (ValueError, OSError, TypeError):
        pass
    if pending is not None:
        previous(*pending)


def hook_process():
    """Exit handlers for this process, once: a Finalize for worker processes, SIGTERM for all."""
    pid = os.getpid()
    if _Process.pid == pid:
        return
    _Process.pid = pid
    mp_util.Finalize(None, _close_all_at_exit, exitpriority=100)
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        previous = signal.getsignal(signal.SIGTERM)
        if previous is _on_sigterm or previous is None or previous == signal.SIG_IGN:
            return  # ours already (inherited through fork), set outside Python, or ignored on purpose
        signal.signal(signal.SIGTERM, _on_sigterm)
        _Process.previous_sigterm = previous
    except (ValueError, OSError):
        pass


def _forget_parent_recordings():
    # A forked child inherits the parent's recordings: never write or spill
    # them from here, and start this process's memory count afresh. The parent's
    # idle spiller is not running here, and its locks may have been held at the fork.
    forget_parent_recordings()
    core.set_memory_in_use(0)
    core.set_deadline(math.inf)
    _Process.writing, _Process.pending_signal = 0, None
    if _Process.held_sigint is not None:  # forked by another thread while the main one was writing
        _Process.pending_sigint = None  # the parent's Ctrl-C, not this process's
        _let_sigint_through()


atexit.register(_close_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_recordings)


def attend():
    """A recording call returned True: spill what is due (memory over its limit, or an interval past).

    Called by the wrappers on their step path; never raises.
    """
    if not IdleSpiller.running:
        IdleSpiller.start()  # the process's first event: spills go on while it is idle
    now = time.monotonic()
    over = core.memory_in_use() > core.memory_limit()
    filling = core.map_pressure(clear=True)  # a mapped ring half full: spilled now, in the background
    open_here = mine()
    handed = False
    for rec in open_here:
        if rec.let_go_due:
            rec.let_go_written()  # the spiller wrote them: no write here, only memory given back
        if rec.failing():
            continue  # its write failed: the idle spiller tries again, with a back-off, never a step
        if now >= rec.retry_at and (over or now >= rec.due or (filling and rec.filling())):
            if not over and rec.can_hand_off() and not (filling and rec.nearly_full()):
                rec.hand_off(now)  # due by time: the spiller writes, the step goes on
                handed = True
            else:
                # over the memory limit (memory must come back now), no spiller thread, or a mapped ring about
                # to overflow before the spiller thread wrote it (that step waits for the write)
                rec.tick(now)
    if handed:
        IdleSpiller.wake()
    if core.memory_in_use() > core.memory_limit():
        # Buffers not owned by any open recording (closed, or inherited): do not
        # count them, or every later event would spill again.
        core.set_memory_in_use(sum(rec.nbytes for rec in open_here))
    reschedule()


def spill_everything():
    """Spill every recording of this process now (what attend() does when memory is over)."""
    if not IdleSpiller.running:
        IdleSpiller.start()
    core.map_pressure(clear=True)  # every ring is let go of here
    open_here = mine()
    for rec in open_here:
        rec.spill()
    if core.memory_in_use() > core.memory_limit():
        core.set_memory_in_use(sum(rec.nbytes for rec in open_here))  # as attend() does
    reschedule()
