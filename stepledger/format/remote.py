"""Ledgers at a URL while they are recorded: staged on local disk, uploaded in the background, never lost.

A ``Recording`` at a URL (``s3://...``) keeps one ``RemoteLedger``. It owns:

- the stage: a local directory ``$TMPDIR/stepledger-stage-{pid}-{random}`` where
  the spill segments and the final file are written before they are uploaded.
  It is removed on every way out that can remove it (close, discard, exit, a
  failed upload, whose files are first moved to the keep directory). One left
  by a killed process is found by ``leftover_stages()`` (``stepledger show``
  names them) and cleared by the next writer in the same TMPDIR, but only
  once its owning process is dead: the files it had not uploaded are moved to
  the keep directory first, so they can still be published.
- the uploads of spill segments (and of flushes with ``wait=False``): queued
  for one background thread per process, so that the step that spilled never
  waits for the network. At most ``QUEUE_SIZE`` uploads wait in the queue; a
  ledger's further segments wait on local disk, in order, until there is
  room. Each upload is tried on a bounded schedule (``RETRY_DELAYS``). When
  one fails for good, the ledger warns once (a ``StorageWarning``), uploads
  nothing more in the background (its segments in storage stay a gap-free
  partial ledger, which ``read`` reports as partial) and recording goes on
  locally: the final file at ``close()`` holds every event.
- the final file at ``close()``: published synchronously. If that fails too,
  the ledger is moved to the keep directory (``keep_dir()``: the variable
  ``STEPLEDGER_UNPUBLISHED``, or ``~/.local/share/stepledger/unpublished``),
  at the path that mirrors its URL (``s3/bucket/run-1/env-0.npz``), and one
  line says where and how to publish it: ``stepledger push LOCAL URL``.
  ``close()`` does not raise for it: in a worker process a raise would be a
  traceback and no ledger; here it is a line and a complete local ledger.
"""

import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import warnings
from typing import Any

from stepledger.format import processes
from stepledger.format import storage
from stepledger.errors import LedgerError
from stepledger.format.ledgerfile import spill_dir
from stepledger.format.place import LedgerPlace

QUEUE_SIZE = 8  # uploads waiting for the background thread, all ledgers of the process together
RETRY_DELAYS = (0.5, 2.0)  # seconds before the 2nd and 3rd attempts of a background upload
STAGE_PREFIX = "stepledger-stage-"
_OWNER = "owner.json"
_UPLOADED = ".uploaded"  # marker next to a staged file that storage already has


class StorageWarning(RuntimeWarning):
    """Storage failed; the ledger is safe on local disk (the message says where)."""


def say(message):
    """One line on stderr through the warnings machinery (filterable by StorageWarning), with no source line."""
    warnings.warn_explicit(message, StorageWarning, filename="stepledger", lineno=0, registry={})


def keep_dir():
    """Where ledgers and segments that could not be uploaded are kept, mirroring their URLs."""
    configured = os.environ.get("STEPLEDGER_UNPUBLISHED")
    if configured:
        return os.path.abspath(configured)
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "stepledger", "unpublished")


def push_command(local, url):
    return "stepledger push %s %s" % (local, url)


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


# ---------------------------------------------------------------- the background thread

class _Uploader:
    """One thread per process that runs upload jobs from a bounded queue, in order."""

    def __init__(self):
        self.pid = os.getpid()
        self.jobs: queue.Queue[Any] = queue.Queue(QUEUE_SIZE)
        self.thread = threading.Thread(target=self._run, name="stepledger-upload", daemon=True)
        self.thread.start()

    def offer(self, job):
        """Queue ``job`` if there is room; never waits."""
        try:
            self.jobs.put_nowait(job)
            return True
        except queue.Full:
            return False

    def _run(self):
        while True:
            job = self.jobs.get()
            try:
                job()
            except BaseException:  # a job handles its own errors; nothing may end this thread
                pass


_UPLOADER = None
_UPLOADER_LOCK = threading.RLock()  # reentrant: the SIGTERM handler may run while the main thread holds it


def _after_fork_in_child():
    # The parent's thread is not in the child, and its lock may have been held at the fork.
    global _UPLOADER, _UPLOADER_LOCK
    _UPLOADER, _UPLOADER_LOCK = None, threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _uploader():
    global _UPLOADER
    with _UPLOADER_LOCK:
        if _UPLOADER is None or _UPLOADER.pid != os.getpid():  # a forked child has no thread of its own yet
            _UPLOADER = _Uploader()
        return _UPLOADER


# ---------------------------------------------------------------- one ledger

# ---------------------------------------------------------------- closing before the executors stop

# id(RemoteLedger) -> (pid, callback): what must run while uploads can still run
_AT_EXIT: dict[int, tuple[int, Any]] = {}
_HOOKED: list[Any] = []


def _close_before_executors_stop():
    for pid, callback in list(_AT_EXIT.values()):
        if pid == os.getpid():
            try:
                callback()
            except Exception as exc:  # at exit there is no caller to raise to
                say("could not write a ledger at exit: %s" % exc)


def _hook_exit():
    """At interpreter exit, the atexit handlers run after concurrent.futures has stopped taking work, and the
    backends (aiobotocore) need an executor to upload: close ledgers at a URL before that, from the hook
    threading runs first. Registered once s3fs and friends are imported, so that it runs before theirs."""
    if not _HOOKED and hasattr(threading, "_register_atexit"):
        _HOOKED.append(True)
        threading._register_atexit(_close_before_executors_stop)


class RemoteLedger(LedgerPlace):
    """The stage, the background uploads and the final publish of one ledger at a URL: the remote
    ``LedgerPlace`` (place.py).

    ``on_exit`` (the Recording's close) is called at interpreter exit if the ledger is still open then.
    """

    def __init__(self, url, on_exit=None):
        self.url = url
        storage.check_writable(url)
        if on_exit is not None:
            _AT_EXIT[id(self)] = (os.getpid(), on_exit)
            _hook_exit()
        # Segments of an earlier run at this URL, looked for once now: if there are none, writing the
        # final file needs no listing to remove them (one request less at close()).
        self.earlier_segments = bool(storage.listdir(url + ".spill"))
        self.mirror = storage.mirror(url)
        self.stage: str | None = None
        self._lock = threading.Condition()
        self._pending = []  # [(local, url)] segments waiting, in order, for room in the queue
        self._queued = 0  # jobs of this ledger in the queue or running
        self._stopped = False  # close() began: queued jobs are dropped
        self.failed = None  # why the background uploads stopped, once they have
        self.uploaded = []  # segment URLs storage has, in order
        self.published = True  # False once the final file could not be uploaded (it is kept locally)
        self._flushes = 0  # final files staged for a background upload (write(wait=False)), for their names

    # ---- claiming the path: storage has no lock files; nothing killed writers left to clean here
    # (dead processes' stages are cleared when a stage is made)

    def claim(self, path, owner, holder, alive, beside):
        return path

    def clean_leftovers(self, path):
        pass

    # ---- the stage

    def stage_path(self, name):
        """A path in the stage for ``name`` (``seg-000000.npz``, ``ledger.npz``); the stage is made on first use."""
        if self.stage is None:
            clear_dead_stages()
            self.stage = tempfile.mkdtemp(prefix="%s%d-" % (STAGE_PREFIX, os.getpid()))
            with open(os.path.join(self.stage, _OWNER), "w") as f:
                json.dump({"pid": os.getpid(), "start": processes.own_start(), "url": self.url}, f)
        return os.path.join(self.stage, name)

    def remove_stage(self):
        """Closed for good: remove the stage, and forget the exit callback."""
        _AT_EXIT.pop(id(self), None)
        if self.stage is not None:
            shutil.rmtree(self.stage, ignore_errors=True)
            self.stage = None

    # ---- spill segments, in the background

    def stage_segment(self, path, name):
        """Staged locally, kept there to assemble the final file, and uploaded in the background (so that a
        reader finds this run's events on the storage even if the process is killed)."""
        return storage.join(spill_dir(path), name), self.stage_path(name)

    def merge_group(self, segments):
        """Never: at a URL each merge would be another upload of what is uploaded already."""
        return None

    def upload_segment(self, local, dest, before=None, remove=False):
        """Queue the staged file ``local`` for the URL ``dest``, after this ledger's earlier ones; never waits.

        ``before`` (a callable) runs first, in the thread; with ``remove`` the local file
        is deleted once the job is over (a flush's snapshot, which nothing else needs).
        """
        with self._lock:
            if self.failed is not None or self._stopped:
                # storage gave up on this ledger: a segment stays staged, and the final file will hold it
                if remove:
                    _unlink(local)
                return
            self._pending.append((local, dest, before, remove))
        self._pump()

    def _pump(self):
        """Move this ledger's waiting segments into the queue, in order, while there is room."""
        up = _uploader()
        with self._lock:
            while self._pending and self.failed is None and not self._stopped:
                job = self._pending[0]
                if not up.offer(lambda job=job: self._run_job(*job)):
                    break
                self._pending.pop(0)
                self._queued += 1

    def _run_job(self, local, url, before, remove):
        try:
            with self._lock:
                if self._stopped or self.failed is not None:
                    return
            error = None
            for delay in (0.0,) + RETRY_DELAYS:
                if delay:
                    time.sleep(delay)
                with self._lock:
                    if self._stopped:
                        return
                try:
                    if before is not None:
                        before()
                        before = None
                    storage.publish(local, url)
                    error = None
                    break
                except Exception as exc:
                    error = exc
            if error is None:
                if not remove:
                    try:
                        open(local + _UPLOADED, "wb").close()
                    except OSError:
                        pass
                with self._lock:
                    self.uploaded.append(url)
            else:
                self._give_up(error)
        finally:
            if remove:
                _unlink(local)
            with self._lock:
                self._queued -= 1
                self._lock.notify_all()
            self._pump()

    def _give_up(self, exc):
        with self._lock:
            if self.failed is not None:
                return
            self.failed = exc
            self._pending = []
        say("%s: uploads to storage failed (%s); recording goes on locally, and the ledger in storage is "
            "incomplete (%d spilled segments there) until close() publishes it"
            % (self.url, getattr(exc, "reason", str(exc)), len(self.uploaded)))

    def stop(self, timeout=60.0):
        """Drop the queued uploads and wait for the one running: the final file supersedes them."""
        with self._lock:
            self._stopped = True
            for local, _, _, remove in self._pending:
                if remove:
                    _unlink(local)
            self._pending = []
            deadline = time.monotonic() + timeout
            while self._queued > 0 and time.monotonic() < deadline:
                self._lock.wait(0.1)

    def wait(self, timeout=120.0):
        """Wait until every segment handed over so far is uploaded or given up on (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._pump()
            with self._lock:
                if (not self._pending or self.failed is not None) and self._queued == 0:
                    return
                self._lock.wait(0.05)

    # ---- the final file

    def stage_final(self, path, wait):
        target = self.stage_path("ledger.npz" if wait else "flush-%d.npz" % self._flushes)
        self._flushes += 1
        return target

    def publish(self, local, path, wait):
        """Published before this returns (kept on local disk if that fails), or with ``wait`` false uploaded in
        the background, its staged copy removed once the upload is over (a flush's snapshot)."""
        if wait:
            self.published = self.publish_final(local)
            return True
        self.upload_segment(local, path, remove=True)
        return False

    def written_stat(self, local):
        return None

    def publish_final(self, local):
        """Publish the staged final file ``local`` now. On failure keep it (and say where) and return False."""
        try:
            storage.publish(local, self.url)
            return True
        except LedgerError as exc:
            kept = self.keep(local, self.mirror)
            reason = getattr(exc, "reason", str(exc))
            say("%s: not published (%s); the complete ledger is kept at %s; publish it later with: %s"
                % (self.url, reason, kept, push_command(kept, self.url)))
            return False

    # ---- removing

    def remove(self, path):
        try:
            storage.remove(path)
        except Exception:
            pass

    def mapped_part(self, path, writer, stream_ids, capacity, meta):
        return None  # uploads keep their own rules: the events stay in memory, spilled as before

    def remove_stale_maps(self, path, own):
        pass

    def remove_earlier_run(self, path, mine, final):
        """The segments are looked for only if there were any at construction (one listing less at close());
        raises if storage cannot be reached (in the upload thread, the upload is then tried again)."""
        if self.earlier_segments:
            self.earlier_segments = False
            directory = spill_dir(path)
            for name in storage.listdir(directory):
                old = storage.join(directory, name)
                if name.startswith("seg-") and old not in mine:
                    self.remove(old)
        if final and storage.exists(path):
            storage.remove(path)

    def remove_segments(self, path, segments):
        """Everything in the spill directory: also segments of an earlier run that a failed upload left there,
        which would otherwise be read in place of the final file."""
        if not segments:
            return  # write() has just removed whatever an earlier run left in the spill directory
        try:
            directory = spill_dir(path)
            storage.remove_all([storage.join(directory, n) for n in storage.listdir(directory)
                                if n.startswith("seg-")])
        except Exception:
            pass

    def remove_spill_dir(self, path):
        try:
            storage.rmdir(spill_dir(path))
        except Exception:
            pass

    def close(self):
        self.stop()
        self.remove_stage()

    def keep(self, local, relative):
        """Move ``local`` into the keep directory at ``relative``; the new path (``local`` itself if it cannot)."""
        dest = os.path.join(keep_dir(), relative)
        try:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.move(local, dest)
            return dest
        except OSError:
            return local


# ---------------------------------------------------------------- stages left by killed processes

def _stages(tmpdir=None):
    root = tmpdir or tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return []
    return [os.path.join(root, n) for n in sorted(names) if n.startswith(STAGE_PREFIX)]


def _owner(stage):
    try:
        with open(os.path.join(stage, _OWNER)) as f:
            info = json.load(f)
        return int(info["pid"]), info.get("start"), info.get("url")
    except (OSError, ValueError, KeyError, TypeError):
        # no owner file: a stage of an older version, or one killed as it was made; the pid is in the name
        try:
            return int(os.path.basename(stage)[len(STAGE_PREFIX):].split("-")[0]), None, None
        except ValueError:
            return None, None, None


def _not_uploaded(stage):
    """Staged files that storage may not have: (path, name relative to the stage), complete files only."""
    out = []
    for dirpath, _, files in os.walk(stage):
        for name in files:
            path = os.path.join(dirpath, name)
            if name == _OWNER or name.endswith(_UPLOADED) or ".tmp-" in name or os.path.exists(path + _UPLOADED):
                continue
            out.append((path, os.path.relpath(path, stage)))
    return out


def leftover_stages(tmpdir=None):
    """Stages whose owning process is dead: [{"path", "pid", "url", "bytes", "not_uploaded"}]."""
    out = []
    for stage in _stages(tmpdir):
        pid, start, url = _owner(stage)
        if pid is None or processes.running(pid, start):
            continue
        size = 0
        for dirpath, _, files in os.walk(stage):
            for name in files:
                try:
                    size += os.path.getsize(os.path.join(dirpath, name))
                except OSError:
                    pass
        out.append({"path": stage, "pid": pid, "url": url, "bytes": size,
                    "not_uploaded": [rel for _, rel in _not_uploaded(stage)]})
    return out


def _kept_name(url, rel):
    """Where a staged file of the ledger ``url`` goes in the keep directory."""
    mirror = storage.mirror(url)
    if rel == "ledger.npz":
        return mirror
    return os.path.join(mirror + ".spill", rel)  # a spill segment


def clear_dead_stages(tmpdir=None):
    """Remove the stages of dead processes in TMPDIR; their files storage may lack go to the keep directory first."""
    kept = []
    for info in leftover_stages(tmpdir):
        stage, url = info["path"], info["url"]
        if info["not_uploaded"] and url is None:
            continue  # cannot tell where its files belong: leave it for a person (show names it)
        for path, rel in _not_uploaded(stage):
            try:
                dest = os.path.join(keep_dir(), _kept_name(url, rel))
                if not os.path.exists(dest):
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    shutil.move(path, dest)
                    kept.append(dest)
            except (OSError, LedgerError):
                break
        else:
            shutil.rmtree(stage, ignore_errors=True)
    if kept:
        say("files a killed process had not uploaded are kept in %s (%d files); publish them with stepledger push"
            % (keep_dir(), len(kept)))
    return kept


def describe_leftovers(tmpdir=None):
    """Lines for ``stepledger show``: the stages of dead processes, and what they hold."""
    lines = []
    for info in leftover_stages(tmpdir):
        what = "%d files not uploaded" % len(info["not_uploaded"]) if info["not_uploaded"] else "nothing left to upload"
        lines.append("left by process %d, which is gone: %s (%.1f MB, %s%s); the next writer in this TMPDIR "
                     "removes it" % (info["pid"], info["path"], info["bytes"] / 1e6, what,
                                     ", for " + info["url"] if info["url"] else ""))
    return lines


def push(local, url, remove=True, out=sys.stdout):
    """Publish the local ledger file or directory ``local`` at ``url`` (``stepledger push``).

    A directory is published file by file under ``url``, spill segments before
    final files; each file is removed locally once storage has it in full,
    unless ``remove`` is false. Returns the number of files published.
    """
    local = os.path.abspath(local)
    if os.path.isfile(local):
        files = [(local, url)]
    elif os.path.isdir(local):
        files = []
        for dirpath, _, names in os.walk(local):
            for name in sorted(names):
                if name.endswith(".npz") and ".tmp-" not in name:
                    rel = os.path.relpath(os.path.join(dirpath, name), local).replace(os.sep, "/")
                    files.append((os.path.join(dirpath, name), storage.join(url, rel)))
        files.sort(key=lambda f: (".spill/" not in f[1], f[1]))  # segments first: a final file then wins
        if not files:
            raise LedgerError("%s: no ledger files (*.npz) in this directory" % local)
    else:
        raise LedgerError("%s: no such file or directory" % local)
    storage.check_writable(files[0][1])
    for path, dest in files:
        storage.publish(path, dest)
        complete = storage.size(dest) == os.path.getsize(path)
        print("%s -> %s" % (path, dest), file=out)
        if remove and complete:
            os.unlink(path)
    if remove and os.path.isdir(local):
        for dirpath, _, _ in sorted(os.walk(local), reverse=True):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass
    return len(files)
