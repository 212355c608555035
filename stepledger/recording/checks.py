"""The checks of a ledger's arguments at construction: one clear line naming the argument and what is wrong.

Shared by the env side, the trainer side and every library's adapters, so that a
wrong path, directory, reward dtype or flush interval fails when the wrapper is
built, not after the run.
"""

import os
import tempfile
import warnings

import numpy as np

from stepledger.errors import LedgerError
from stepledger.format import schema as S
from stepledger.format import storage


def flush_interval(value, owner):
    """Seconds between periodic spills: ``value``, else $STEPLEDGER_FLUSH_INTERVAL, else the default."""
    if value is None:
        text = os.environ.get(S.ENV_FLUSH_INTERVAL)
        if not text:
            return S.DEFAULT_FLUSH_INTERVAL
        try:
            value = float(text)
        except ValueError:
            raise ValueError("%s: %s must be a number of seconds, got %r" % (owner, S.ENV_FLUSH_INTERVAL, text)) from None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not value > 0:
        raise ValueError("%s: flush_interval must be a positive number of seconds (math.inf: only on memory "
                         "and at the end), got %r" % (owner, value))
    return float(value)


def check_writable(path, owner):
    """A one-line error now, not after the run, if a ledger file cannot be written at ``path``."""
    if os.path.isdir(path):
        raise LedgerError("%s: %s is a directory; give the ledger's file name, for example %s"
                          % (owner, path, os.path.join(path, "trainer.npz")))
    parent = os.path.dirname(os.path.abspath(path))
    check_directory(parent, owner)


def check_directory(directory, owner):
    """Create ``directory`` if needed; a one-line error if it is a file or cannot be created or written."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise LedgerError("%s: %s is a file, not a directory" % (owner, directory))
    try:
        os.makedirs(directory, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise LedgerError("%s: cannot create the directory %s: part of its path is a file" % (owner, directory)) \
            from None
    except OSError as exc:
        raise LedgerError("%s: cannot create the directory %s (%s)" % (owner, directory, exc.strerror or exc)) \
            from None
    try:  # a real write: permissions, a read-only mount and a full disk all show here, not after the run
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".stepledger-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise LedgerError("%s: cannot write in the directory %s (%s)" % (owner, directory, exc.strerror or exc)) \
            from None


def check_reward_dtype(reward_dtype, owner):
    """The reward dtype as a numpy dtype; float32 or float64, else a one-line error."""
    try:
        dtype = np.dtype(reward_dtype)
    except TypeError:
        dtype = None
    if dtype is None or dtype.name not in S.REWARD_DTYPES:
        raise ValueError("%s: reward_dtype must be np.float32 or np.float64, got %r" % (owner, reward_dtype))
    return dtype


def check_path(path, owner, what):
    """A path as a string: a local path, a file:// URL made local, or another fsspec URL as given."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError("%s: %s must be a path or URL, got %r" % (owner, what, path))
    return storage.local_path(os.fspath(path))


_WARNED_MEMORY: list[bool] = []


def check_remote(url, stacklevel=2):
    """One-line error now, not at close, if the URL cannot be used; warn about memory:// in a child process
    (``stacklevel`` as warnings.warn's, from the caller of this function)."""
    storage.check(url)
    if not _WARNED_MEMORY and storage.protocol(url) == "memory":
        import multiprocessing
        if multiprocessing.parent_process() is not None:
            _WARNED_MEMORY.append(True)
            warnings.warn("stepledger: %s is in this process's memory only; a ledger written there from a worker "
                          "process is not visible to the trainer's process" % url, RuntimeWarning,
                          stacklevel=stacklevel + 1)
