"""Whether the process that wrote a file is still running: its pid, and its start time.

A pid alone does not tell: after a reboot, or on a busy machine, a dead
writer's pid can belong to another process by the time a reader or a later
writer looks. Files that name their writer (lock files, temporary names, the
meta of every ledger file, the stages of ledgers at URLs) therefore record the
writer's start time with its pid where it can be read (Linux: field 22 of
``/proc/PID/stat``, clock ticks since boot), and a pid whose process started at
another time is a process that is gone. Where the start time cannot be read
(another system) or was not recorded (files of older versions), the pid alone
decides, as it did before.

The one definition of "is this writer alive", for the reader (read.py,
compare.py), the writer (recording.py, ledgerfile.py) and the uploader's stages.
"""

import os
import re
import socket
from typing import Any

from stepledger.format import schema as S

HOST = socket.gethostname()

# the random part is 8 hex digits, maybe all of them digits: a start time is a number followed by another part
_TMP = re.compile(re.escape(S.TMP_INFIX) + r"(\d+)(?:(?:-(\d+))?-[0-9a-f]+)?")
_OWN: list[Any] = [None, None]  # [pid, start time] of this process, read once per process (a forked child reads again)


def start_time(pid):
    """The start time of process ``pid`` in clock ticks since boot (Linux), or None where it cannot be read."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


def own_start():
    """This process's start time (see start_time), read once per process."""
    pid = os.getpid()
    if _OWN[0] != pid:
        _OWN[:] = [pid, start_time(pid)]
    return _OWN[1]


def _stat(pid):
    """(state letter, start time) from /proc/PID/stat, or None. The command name (field 2) may hold spaces
    and parentheses: the fields are read after its last ')'."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError, OverflowError):
        return None


def running(pid, start=None, host=None):
    """Whether the process ``pid`` that started at ``start`` runs on ``host`` (None: this host).

    True, False, or None where it cannot be told (another host). A process that
    was killed and is not yet reaped by its parent (a zombie) is gone; so is a
    pid whose process started at another time than ``start``. With ``start``
    None (a file of an older version) or no start time to read, the pid decides.
    """
    if host not in (None, HOST):
        return None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False  # not a process (0 and negative pids would name process groups)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's live process
    except (OSError, OverflowError):
        return False
    stat = _stat(pid)
    if stat is None:
        return True
    state, now = stat
    if state == b"Z":
        return False
    if not isinstance(start, int) or isinstance(start, bool):
        return True  # not recorded (or not a start time): the pid decides
    return now == start


def tmp_name(path):
    """A temporary name next to ``path``: ``path.tmp-{pid}-{start}-{random}`` (``path.tmp-{pid}-{random}``
    where the start time cannot be read). Its writer's identity tells a later writer whether the file was
    left by a process that is gone; the random part keeps two writers of one path (threads, or a duplicate)
    off each other's file."""
    start = own_start()
    who = "%d" % os.getpid() if start is None else "%d-%d" % (os.getpid(), start)
    return "%s%s%s-%s" % (path, S.TMP_INFIX, who, os.urandom(4).hex())


def tmp_writer(name):
    """(pid, start time or None) of the writer of a temporary name made by tmp_name (or by an older version,
    without the start time); None if ``name`` is not one."""
    m = _TMP.search(name)
    if m is None:
        return None
    return int(m.group(1)), None if m.group(2) is None else int(m.group(2))
