"""Where ledgers live: plain local paths, or fsspec URLs (``s3://``, ``memory://``, ...).

A plain path (and a ``file://`` URL, which is turned into one) takes the
local code path of the rest of the package unchanged: files are written to a
temporary name, synced and renamed, and read in place. This module is only
consulted to tell the two apart; it imports fsspec only for a URL.

For any other URL (``s3://bucket/ledgers``, ``gcs://...``, ``memory://run1``,
chained URLs such as ``simplecache::s3://...``), fsspec is needed (the
optional extra ``plugrl-stepledger[remote]``) and:

- the location is checked when a ledger is created (``check_writable``): a
  bucket that does not exist is an error (it is never created), and so are
  refused credentials and unreachable storage, found by writing and removing
  a small probe object.
- every file (a final ledger or a spill segment) is first written completely
  to a local file, then uploaded (``publish``). On an object store (a
  filesystem with buckets: s3fs, gcsfs, adlfs) it is put under its own name:
  an object appears only once it is complete. Elsewhere it is uploaded as
  ``NAME.tmp-{pid}`` and moved to ``NAME``. Either way a reader sees the
  previous complete file or the new one, never a partial file under the
  real name. Readers ignore ``*.tmp-*`` names. A failed upload leaves the
  local file where it was: the caller keeps it (see format/remote.py).
- a ledger is read by copying it (and its spill segments, if any) to a local
  temporary directory first (``fetch``), then reading the copy with the
  local reader. Memory stays bounded (large objects are copied in ranged
  reads, ``FETCH_BLOCK`` bytes at a time); the copy takes disk space. Every
  query asks the storage afresh: the backend's cached listings are dropped
  first, so a file published a moment ago, by this process or another, is
  seen.

Uploads in the background, their retries and what is kept on local disk when
storage fails are format/remote.py's job.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import uuid
from typing import TypeVar

from stepledger.errors import LedgerError, one_line

_T = TypeVar("_T")

EXTRA_HINT = "pip install 'plugrl-stepledger[remote]'"

# scheme://... or chained proto::proto://...; a scheme of two letters or more, so that
# a Windows drive ("C://x") is not taken for one.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+(::[A-Za-z][A-Za-z0-9+.\-]+)*://")
_LOCAL_SCHEMES = ("file://", "local://")


class StorageError(LedgerError):
    """A storage call failed: ``url``, what was tried and ``reason``, in one line."""

    def __init__(self, url, what, reason):
        super().__init__("%s: %s: %s" % (url, what, reason))
        self.url, self.reason = url, reason


class RemoteUnavailable(LedgerError, ImportError):
    """A URL was given but fsspec (the ``remote`` extra) is not installed."""


def local_path(path: _T) -> _T | str:
    """A ``file://`` (or ``local://``) URL as a plain local path; anything else unchanged."""
    if isinstance(path, str) and path[:8].lower().startswith(_LOCAL_SCHEMES):
        rest = path.split("://", 1)[1]
        if rest.lower().startswith("localhost/"):
            rest = rest[len("localhost"):]
        if re.match(r"^/[A-Za-z]:[/\\]", rest):  # file:///C:/x on Windows
            rest = rest[1:]
        return rest or "."
    return path


def is_remote(path):
    """True for a URL that needs fsspec: one with a scheme other than ``file://``."""
    return (isinstance(path, str) and "://" in path and _URL.match(path) is not None
            and not path[:8].lower().startswith(_LOCAL_SCHEMES))


def join(base, name):
    """``base/name``: os.path.join for a local path, a ``/`` for a URL."""
    if not is_remote(base):
        return os.path.join(base, name)
    return (base if base.endswith("/") else base + "/") + name


def _fsspec(url):
    try:
        import fsspec
    except ImportError:
        raise RemoteUnavailable("%s: a URL needs fsspec, which is not installed; install the extra: %s"
                                % (url, EXTRA_HINT)) from None
    return fsspec


def filesystem(url):
    """(fsspec filesystem, path within it) of a URL; a one-line LedgerError if it cannot be opened."""
    fsspec = _fsspec(url)
    try:
        return fsspec.core.url_to_fs(url)
    except Exception as exc:  # ImportError "Install s3fs to access S3", ValueError "Protocol not known", ...
        raise LedgerError("%s: cannot open this URL (%s)" % (url, one_line(exc))) from None


def check(url):
    """Fail now, with one line, if ``url`` cannot be used (no fsspec, unknown protocol, missing backend)."""
    filesystem(url)


def protocol(url):
    fs, _ = filesystem(url)
    proto = fs.protocol
    return proto if isinstance(proto, str) else proto[0]


def _fresh(fs):
    """Drop the backend's cached listings (s3fs, gcsfs keep them per instance), so the next query asks the storage."""
    try:
        fs.invalidate_cache()
    except Exception:
        pass


def is_object_store(fs):
    """True for a filesystem of buckets and objects (s3fs, gcsfs, adlfs: each has ``split_path``)."""
    return callable(getattr(fs, "split_path", None))


def _ask(url, question):
    """fs.exists or fs.isdir on ``url``: False when it is not there, a LedgerError when unreachable."""
    fs, p = filesystem(url)
    _fresh(fs)
    try:
        return getattr(fs, question)(p)
    except FileNotFoundError:
        return False
    except Exception as exc:
        raise LedgerError("%s: cannot reach (%s)" % (url, one_line(exc))) from None


def exists(url):
    return _ask(url, "exists")


def isdir(url):
    return _ask(url, "isdir")


def listdir(url):
    """Names (not paths) in the directory ``url``; [] if there is none."""
    return sorted(listing(url))


def listing(url):
    """{name: size in bytes, None for a directory} of the directory ``url``, in one listing; {} if there is none."""
    fs, p = filesystem(url)
    _fresh(fs)
    try:
        entries = fs.ls(p, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except Exception as exc:
        raise LedgerError("%s: cannot list (%s)" % (url, one_line(exc))) from None
    own = p.rstrip("/")
    out = {}
    for e in entries:
        name = e["name"].rstrip("/") if isinstance(e, dict) else str(e).rstrip("/")
        if name != own:
            kind = e.get("type") if isinstance(e, dict) else None
            out[posixpath.basename(name)] = None if kind == "directory" else e.get("size")
    return out


def remove(url):
    """Remove a file; a missing one is not an error."""
    fs, p = filesystem(url)
    try:
        fs.rm(p)
    except FileNotFoundError:
        pass


def remove_all(urls):
    """Remove files of one filesystem in one call (object stores delete them in batches); missing ones are fine."""
    if not urls:
        return
    fs, _ = filesystem(urls[0])
    paths = [filesystem(u)[1] for u in urls]
    try:
        fs.rm(paths)
    except FileNotFoundError:
        for p in paths:
            try:
                fs.rm(p)
            except FileNotFoundError:
                pass


def size(url):
    """The size in bytes of the file at ``url``, asked afresh; None if there is none."""
    fs, p = filesystem(url)
    _fresh(fs)
    try:
        return fs.size(p)
    except FileNotFoundError:
        return None
    except Exception as exc:
        raise LedgerError("%s: cannot reach (%s)" % (url, one_line(exc))) from None


def rmdir(url):
    """Remove an empty directory if the store has directories; never fails."""
    try:
        fs, p = filesystem(url)
        fs.rmdir(p)
    except Exception:
        pass


def _reason(exc):
    """Why a storage call failed, in a few words and the backend's first line."""
    if isinstance(exc, PermissionError):
        return "the storage refused these credentials, or they may not write here (%s)" % one_line(exc)
    return one_line(exc)


def check_writable(url):
    """Fail now, with one line, unless a file can be written at the ledger URL ``url``.

    On an object store the bucket must exist (it is never created: a typo would
    otherwise make a new one). Then a small probe object is written next to
    ``url`` and removed: refused credentials and unreachable storage show here,
    before the run, not at ``close()``.
    """
    fs, p = filesystem(url)
    parent = posixpath.dirname(p.rstrip("/"))
    if is_object_store(fs):
        try:
            bucket = fs.split_path(p)[0]
        except Exception as exc:
            raise LedgerError("%s: not a valid location (%s)" % (url, one_line(exc))) from None
        _fresh(fs)
        try:
            fs.info(bucket)
        except FileNotFoundError:
            raise LedgerError("%s: the bucket %r does not exist; create it first (stepledger never creates one)"
                              % (url, bucket)) from None
        except PermissionError as exc:
            raise LedgerError("%s: %s" % (url, _reason(exc))) from None
        except Exception as exc:
            raise LedgerError("%s: cannot reach the storage (%s)" % (url, one_line(exc))) from None
    probe = "%s/.stepledger-probe-%d-%s" % (parent, os.getpid(), uuid.uuid4().hex[:8])
    try:
        if parent and not is_object_store(fs):
            fs.makedirs(parent, exist_ok=True)
        fs.pipe_file(probe, b"")
    except Exception as exc:
        raise LedgerError("%s: cannot write there: %s" % (url, _reason(exc))) from None
    try:
        fs.rm_file(probe)
    except Exception:
        pass


def publish(local, url):
    """Upload the finished local file ``local`` to ``url``; a one-line LedgerError if it fails.

    On an object store the object is put under its name (it appears whole or
    not at all); elsewhere under ``url.tmp-{pid}``, then moved. The local file
    is left in place either way: the caller removes it, or keeps it when the
    upload failed.
    """
    fs, p = filesystem(url)
    direct = is_object_store(fs)
    tmp = p if direct else "%s.tmp-%d" % (p, os.getpid())
    try:
        parent = posixpath.dirname(p)
        if parent and not direct:
            fs.makedirs(parent, exist_ok=True)  # stores with real directories need them
        fs.put_file(local, tmp)
        if not direct:
            fs.mv(tmp, p)
    except Exception as exc:
        if not direct:
            try:
                fs.rm(tmp)
            except Exception:
                pass
        raise StorageError(url, "cannot write", _reason(exc)) from None


def mirror(url):
    """The relative local path that stands for ``url`` in a local copy of storage: ``s3/bucket/run/env-0.npz``."""
    fs, p = filesystem(url)
    proto = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    parts = [q for q in p.replace("\\", "/").split("/") if q not in ("", ".", "..")]
    return os.path.join(proto, *parts)


#: An object is copied from an object store in ranged reads of this many bytes, unless it is known to be at
#: most WHOLE_FETCH_MAX bytes, when it is fetched whole (with others, concurrently): s3fs's get_file takes an
#: object of more than its block size (50 MB) in parts, ten at once, each held in memory (a trainer ledger of
#: 200 MB took 455 MB; a trainer ledger grows with the number of envs), where ranged reads hold about one block.
FETCH_BLOCK = 16 << 20
WHOLE_FETCH_MAX = 16 << 20


def fetch(url, local):
    """Copy the file ``url`` to the local path ``local``, in bounded memory; False if there is no such file."""
    fs, p = filesystem(url)
    os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
    _fresh(fs)
    try:
        if is_object_store(fs):
            _copy_in_blocks(fs, p, local)
        else:
            fs.get_file(p, local)
        return True
    except (FileNotFoundError, IsADirectoryError):
        try:
            os.unlink(local)
        except OSError:
            pass
        return False
    except Exception as exc:
        raise LedgerError("%s: cannot read (%s)" % (url, one_line(exc))) from None


def _copy_in_blocks(fs, path, local):
    with fs.open(path, "rb", block_size=FETCH_BLOCK, cache_type="none") as src, open(local, "wb") as out:
        shutil.copyfileobj(src, out, FETCH_BLOCK)


def fetch_all(copies):
    """``fetch`` for each (URL, local path, size or None) of one filesystem, in one call where the backend batches
    them (s3fs and gcsfs download concurrently): on an object store, those known to be small
    (WHOLE_FETCH_MAX), the others one by one in ranged reads, so that memory does not grow with a file's size.
    A file removed meanwhile is skipped, as ``fetch`` skips it."""
    if not copies:
        return
    fs, _ = filesystem(copies[0][0])
    if is_object_store(fs):
        small = []
        for url, local, size in copies:
            if size is not None and size <= WHOLE_FETCH_MAX:
                small.append((url, local, size))
            else:
                fetch(url, local)  # large, or of a size not known: in ranged reads
        copies = small
    if len(copies) <= 1:
        for url, local, _ in copies:
            fetch(url, local)
        return
    for _, local, _ in copies:
        os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
    _fresh(fs)
    try:
        fs.get([filesystem(url)[1] for url, _, _ in copies], [local for _, local, _ in copies])
        return
    except FileNotFoundError:
        pass  # one of them is gone: copy the others one by one
    except Exception as exc:
        raise LedgerError("%s: cannot read (%s)" % (copies[0][0], one_line(exc))) from None
    for url, local, _ in copies:
        fetch(url, local)
