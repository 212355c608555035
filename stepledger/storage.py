"""Where ledgers live: plain local paths, or fsspec URLs (``s3://``, ``memory://``, ...).

A plain path (and a ``file://`` URL, which is turned into one) takes the
local code path of the rest of the package unchanged: files are written to a
temporary name, synced and renamed, and read in place. This module is only
consulted to tell the two apart; it imports fsspec only for a URL.

For any other URL (``s3://bucket/ledgers``, ``gcs://...``, ``memory://run1``,
chained URLs such as ``simplecache::s3://...``), fsspec is needed (the
optional extra ``plugrl-stepledger[remote]``) and:

- every file (a final ledger or a spill segment) is first written completely
  to a local temporary file, then uploaded under a temporary name
  ``NAME.tmp-{pid}`` next to its destination and moved to ``NAME``
  (``publish``). On object stores a move is a copy then a delete, not an
  atomic rename, but an object appears only once it is complete: a reader
  sees the previous complete file, the new complete file or, on some stores
  for a moment, no file; never a partial file under the real name. Readers
  ignore ``*.tmp-*`` names.
- a ledger is read by copying it (and its spill segments, if any) to a local
  temporary directory first (``fetch``), then reading the copy with the
  local reader. Memory stays bounded; the copy takes disk space.
"""

import os
import posixpath
import re

from .errors import LedgerError

EXTRA_HINT = "pip install 'plugrl-stepledger[remote]'"

# scheme://... or chained proto::proto://...; a scheme of two letters or more, so that
# a Windows drive ("C://x") is not taken for one.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+(::[A-Za-z][A-Za-z0-9+.\-]+)*://")
_LOCAL_SCHEMES = ("file://", "local://")


class RemoteUnavailable(LedgerError, ImportError):
    """A URL was given but fsspec (the ``remote`` extra) is not installed."""


def local_path(path):
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


def _short(exc):
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


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
        raise LedgerError("%s: cannot open this URL (%s)" % (url, _short(exc))) from None


def check(url):
    """Fail now, with one line, if ``url`` cannot be used (no fsspec, unknown protocol, missing backend)."""
    filesystem(url)


def protocol(url):
    fs, _ = filesystem(url)
    proto = fs.protocol
    return proto if isinstance(proto, str) else proto[0]


def _ask(url, question):
    """fs.exists or fs.isdir on ``url``: False when it is not there, a LedgerError when unreachable."""
    fs, p = filesystem(url)
    try:
        return getattr(fs, question)(p)
    except FileNotFoundError:
        return False
    except Exception as exc:
        raise LedgerError("%s: cannot reach (%s)" % (url, _short(exc))) from None


def exists(url):
    return _ask(url, "exists")


def isdir(url):
    return _ask(url, "isdir")


def listdir(url):
    """Names (not paths) in the directory ``url``; [] if there is none."""
    fs, p = filesystem(url)
    try:
        entries = fs.ls(p, detail=False)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except Exception as exc:
        raise LedgerError("%s: cannot list (%s)" % (url, _short(exc))) from None
    own = p.rstrip("/")
    names = []
    for e in entries:
        e = e.rstrip("/")
        if e != own:
            names.append(posixpath.basename(e))
    return sorted(set(names))


def remove(url):
    """Remove a file; a missing one is not an error."""
    fs, p = filesystem(url)
    try:
        fs.rm(p)
    except FileNotFoundError:
        pass


def rmdir(url):
    """Remove an empty directory if the store has directories; never fails."""
    try:
        fs, p = filesystem(url)
        fs.rmdir(p)
    except Exception:
        pass


def publish(local, url, keep=False):
    """Upload the finished local file ``local`` to ``url``: under ``url.tmp-{pid}``, then moved.

    The local file is removed afterwards, uploaded or not, unless ``keep``. A move on an
    object store is a copy then a delete: readers never see a partial file
    under ``url``, but may, on some stores, briefly see none.
    """
    fs, p = filesystem(url)
    tmp = "%s.tmp-%d" % (p, os.getpid())
    try:
        parent = posixpath.dirname(p)
        if parent:
            try:
                fs.makedirs(parent, exist_ok=True)  # stores with real directories need them
            except Exception:
                pass  # object stores: no directories; put_file says if the place is unusable
        fs.put_file(local, tmp)
        fs.mv(tmp, p)
    except Exception as exc:
        try:
            fs.rm(tmp)
        except Exception:
            pass
        raise LedgerError("%s: cannot write (%s)" % (url, _short(exc))) from None
    finally:
        if not keep:
            try:
                os.unlink(local)
            except OSError:
                pass


def fetch(url, local):
    """Copy the file ``url`` to the local path ``local``; False if there is no such file."""
    fs, p = filesystem(url)
    os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
    try:
        fs.get_file(p, local)
        return True
    except (FileNotFoundError, IsADirectoryError):
        try:
            os.unlink(local)
        except OSError:
            pass
        return False
    except Exception as exc:
        raise LedgerError("%s: cannot read (%s)" % (url, _short(exc))) from None
