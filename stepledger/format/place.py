"""Where one ledger's files go while it is recorded: the one interface of local and remote writing.

A ``Recording`` (recording/recording.py) holds one ``LedgerPlace`` and writes
through it without asking which one it has, as fsspec's users call one
file-system interface whatever the storage behind it:

- ``LocalLedger`` (local.py): a plain path. Files are written in place (to a
  temporary name, synced and renamed, by ledgerfile.py), the path is claimed
  with a lock file, small segments are merged, leftovers of killed writers are
  removed.
- ``RemoteLedger`` (remote.py): an fsspec URL. Files are staged in a local
  directory, segments uploaded in the background, the final file published
  at the end, kept on local disk when storage fails.

The Recording decides what to write and when; the place says where the bytes
go and carries them there. Paths are the ledger's (``path``: a local path or
the URL) and, for files the Recording writes itself, the local file it writes
(``local``: the same path on local disk, a file in the stage at a URL).

A place is built by the Recording (``Recording.__init__`` picks it by the
path, as fsspec's ``url_to_fs`` does by protocol) after the location has been
checked; everything else is these methods.
"""


class LedgerPlace:
    """The file operations a Recording asks of the place its ledger is written to."""

    #: The local directory where files wait before they reach their place; None where they are written in place.
    stage: str | None = None
    #: False once the final file could not be published (it is kept on local disk, and a line said where).
    published = True

    # ---- claiming the path

    def claim(self, path, owner, holder, alive, beside):
        """Before the first write: make ``path`` this writer's, and return the path to record at.

        ``holder`` is what a lock file says of this writer (pid, host, writer id, ...);
        ``alive(holder)`` whether the writer a lock names is recording still; ``beside(found)``
        is called with another live writer's holder (or the meta of the file another recording of
        this run wrote) and returns the path to record at instead. A LedgerError if it cannot.
        """
        raise NotImplementedError

    def clean_leftovers(self, path):
        """Before the first write, once claimed: remove what killed writers of ``path`` left."""
        raise NotImplementedError

    # ---- spill segments

    def stage_segment(self, path, name):
        """(where the segment ``name`` of the ledger ``path`` goes, the local file to write it to)."""
        raise NotImplementedError

    def upload_segment(self, local, dest, before=None):
        """The segment written to ``local`` is to reach ``dest``; never waits for the network.

        ``before`` (a callable: the removal of an earlier run's pieces) runs once this is the
        ledger's first segment: after the segment is in place, or before it is uploaded.
        """
        raise NotImplementedError

    def merge_group(self, segments):
        """The last few of ``segments`` (written in order) to merge into one now, or None."""
        raise NotImplementedError

    def wait(self):
        """Wait until every segment handed over so far is in its place (or given up on)."""
        raise NotImplementedError

    # ---- the final file

    def stage_final(self, path, wait):
        """The local file to write the final file of ``path`` to (``wait``: it is published before
        write() returns; else in the background, a periodic flush)."""
        raise NotImplementedError

    def publish(self, local, path, wait):
        """The final file was written to ``local``: bring it to ``path``. True once it is settled there
        (or kept on local disk, ``published`` False), False while it is on its way in the background."""
        raise NotImplementedError

    def written_stat(self, local):
        """(inode, mtime in ns) of the final file just written, to tell another writer's file from it, or None."""
        raise NotImplementedError

    # ---- removing

    def remove(self, path):
        """Remove one file (a merged-away segment); never raises."""
        raise NotImplementedError

    def remove_earlier_run(self, path, mine, final):
        """Remove the spill segments of ``path`` other than ``mine`` (a set of this recording's
        segment paths) that an earlier run left, and with ``final`` the file at ``path``."""
        raise NotImplementedError

    def mapped_part(self, path, writer, stream_ids, capacity, meta):
        """The mapped part of a recording at ``path`` (format/mapped.py's LiveMap), or None where the place
        keeps none (object storage: uploads keep their own rules). Raises OSError without room for it."""
        raise NotImplementedError

    def remove_stale_maps(self, path, own):
        """Remove the mapped parts at ``path`` that earlier recordings left (their process gone), but ``own``."""
        raise NotImplementedError

    def remove_segments(self, path, segments):
        """At the end, the final file in place: remove the spill segments (``segments``: this recording's)."""
        raise NotImplementedError

    def remove_spill_dir(self, path):
        """Remove the spill directory of ``path`` if it is empty; never raises."""
        raise NotImplementedError

    # ---- the end

    def stop(self):
        """Drop what is waiting to be uploaded and wait for what is under way: the final file supersedes it."""
        raise NotImplementedError

    def close(self):
        """Closed for good: give up the claim, remove the stage."""
        raise NotImplementedError
