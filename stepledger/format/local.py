"""A ledger on local disk while it is recorded: its files written in place, its path claimed, its segments merged.

The local ``LedgerPlace`` (place.py). The files themselves are written by
ledgerfile.py, to a temporary name that is synced and renamed; this module
says where, and owns what is particular to a local path:

- the claim: a lock file ``NAME.lock`` naming the writer (its pid and that
  process's start time, host and writer id; processes.py), taken at the first
  write, so that a second live writer of the path records beside it;
- the leftovers of killed writers (temporary files, an earlier run's segments
  and final file), removed by the next writer;
- merging small segments eight at a time (up to 32 MB), so that a long run
  keeps few files and each event is rewritten a few times at most.
"""

import glob
import json
import os

from stepledger.errors import LedgerError
from stepledger.format import processes
from stepledger.format import schema as S
from stepledger.format.ledgerfile import spill_dir
from stepledger.format.place import LedgerPlace

MERGE = 8  # segments of one size merged into one
MERGE_MAX_BYTES = 32 << 20  # but not into one larger than this: big segments are few already


class LocalLedger(LedgerPlace):
    """The files of one ledger at a local path."""

    def __init__(self):
        self.lock = None  # the lock file this writer holds, once it has claimed the path

    # ---- claiming the path

    def claim(self, path, owner, holder, alive, beside):
        """Claim ``path`` with a lock file naming this process (``holder()``: what it says).

        A claim held by another live process (two envs given the same index):
        ``beside`` names where this one records instead (``NAME.dup-{writer}.npz``),
        so that nothing is overwritten and compare can name both. A claim left by a
        process that is gone is taken over. A file at the path that another recording
        of this run wrote (a second env given the same index, closed since) is not
        replaced either.
        """
        if self.lock is not None:
            return path
        for _ in range(5):
            lock = path + S.LOCK_SUFFIX
            # Written whole under a temporary name, then linked to the lock's name, which fails if
            # it exists: a lock is never seen empty, half written or by two writers at once.
            tmp = processes.tmp_name(lock)
            mine = holder()
            try:
                with open(tmp, "w") as f:
                    json.dump(mine, f)
                os.link(tmp, lock)
            except FileExistsError:
                found = read_lock(lock)
                if found is not None and alive(found) and found.get(S.META_WRITER) != mine[S.META_WRITER]:
                    path = beside(found)
                    continue
                try:
                    os.unlink(lock)  # left by a process that is gone
                except FileNotFoundError:
                    pass
                continue
            except OSError as exc:
                raise LedgerError("%s: cannot write the ledger %s (%s)" % (owner, path, exc.strerror or exc)) \
                    from None
            finally:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            self.lock = lock
            earlier = _same_run_writer(path, mine)
            if earlier is None:
                return path
            # Another recording of this run wrote this file and has closed since: a second env
            # given the same index. Record beside it rather than replace it.
            self._release_claim()
            path = beside(earlier)
        raise LedgerError("%s: could not claim %s (its lock file keeps changing)" % (owner, path))

    def _release_claim(self):
        if self.lock is not None:
            try:
                os.unlink(self.lock)
            except OSError:
                pass
            self.lock = None

    def clean_leftovers(self, path):
        """Temporary files of writes cut short by writers that are gone; this process's own writes in
        progress (the spiller thread's) stay."""
        for tmp in glob.glob(glob.escape(path) + S.TMP_INFIX + "*") + \
                glob.glob(os.path.join(glob.escape(spill_dir(path)), "*" + S.TMP_INFIX + "*")):
            writer = processes.tmp_writer(tmp)
            if writer is not None and not processes.running(*writer):
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    # ---- spill segments

    def stage_segment(self, path, name):
        os.makedirs(spill_dir(path), exist_ok=True)
        dest = os.path.join(spill_dir(path), name)
        return dest, dest

    def upload_segment(self, local, dest, before=None):
        """Written in place already: nothing to carry. The earlier run's pieces go only now, with this run's
        first segment in place: a reader meanwhile finds the earlier run's ledger and this one's segment, and
        takes the recording that began last, never nothing."""
        if before is not None:
            before()

    def merge_group(self, segments):
        """The last MERGE segments while they are of one size and small: few files, each event rewritten rarely."""
        if len(segments) < MERGE or len({s.level for s in segments[-MERGE:]}) != 1:
            return None
        group = segments[-MERGE:]
        if sum(_size(s.local) for s in group) > MERGE_MAX_BYTES:
            return None
        return group

    def wait(self):
        pass

    # ---- the final file

    def stage_final(self, path, wait):
        return path

    def publish(self, local, path, wait):
        return True

    def written_stat(self, local):
        try:
            st = os.stat(local)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    # ---- removing

    def remove(self, path):
        try:
            os.unlink(path)
        except Exception:
            pass

    def remove_earlier_run(self, path, mine, final):
        for old in glob.glob(os.path.join(glob.escape(spill_dir(path)), "seg-*")):  # also writes cut short
            if old not in mine:
                self.remove(old)
        if not mine:
            try:
                os.rmdir(spill_dir(path))  # an earlier run's, empty now
            except OSError:
                pass
        if final:
            self.remove(path)

    def remove_segments(self, path, segments):
        for seg in segments:
            self.remove(seg)

    def remove_spill_dir(self, path):
        try:
            os.rmdir(spill_dir(path))
        except Exception:
            pass

    # ---- the end

    def stop(self):
        pass

    def close(self):
        self._release_claim()


def read_lock(path):
    """What the lock file at ``path`` says of its holder (a dict), or None if it cannot be read."""
    try:
        with open(path) as f:
            holder = json.load(f)
        return holder if isinstance(holder, dict) else None
    except (OSError, ValueError):
        return None


def _same_run_writer(path, holder):
    """The meta of the file at ``path`` if another recording of the run ``holder`` names wrote it, else None.

    Or if another recording wrote it while this one was recording (since ``holder``'s start), where one of the
    two was never linked to a run: a second LedgerEnv of the index that no trainer side linked (an evaluation
    env built from the training env's factory, docs/INDICES.md), before or after the one it linked. A file of
    another run written meanwhile (two runs one after the other in one process) is replaced as before.
    """
    run, writer = holder.get(S.META_RUN), holder.get(S.META_WRITER)
    if not os.path.exists(path):
        return None
    try:
        from stepledger.format.ledgerfile import LedgerFile
        lf = LedgerFile(path, verify=False)
    except Exception:
        return None
    try:
        meta = lf.meta
    finally:
        lf.close()
    if meta.get(S.META_WRITER) in (None, writer):
        return None
    if run is not None and meta.get(S.META_RUN) == run:
        return meta
    updated, started = meta.get(S.META_UPDATED), holder.get(S.META_STARTED)
    meanwhile = isinstance(updated, (int, float)) and isinstance(started, (int, float)) and updated >= started
    if meanwhile and (run is None or meta.get(S.META_RUN) is None):
        return meta
    return None


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
