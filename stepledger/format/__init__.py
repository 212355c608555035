"""The ledger's file format and where files live.

``schema`` holds every fact of the format (columns, meta keys, the token's layout, the version);
``ledgerfile`` writes and reads the ZIP of npy columns, with ``zipwriter`` (its deflate streams);
``spaces`` lays out an observation or action space's leaves for digesting; ``storage`` and ``remote`` hold
the file operations on local disks and on object storage; ``processes`` tells whether a writer is alive.
docs/FORMAT.md has the format.
"""
