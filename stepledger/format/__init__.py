"""The ledger's file format and where files live.

``schema`` holds every fact of the format (columns, meta keys, the token's layout, the version);
``ledgerfile`` writes and reads the ZIP of npy columns, with ``zipwriter`` (its deflate streams);
``spaces`` lays out an observation or action space's leaves for digesting; ``place`` is the one interface
of a recording's file operations, ``local`` and ``remote`` its two places (a local path; a URL, staged and
uploaded); ``storage`` tells paths from fsspec URLs and holds the calls on them; ``processes`` tells whether
a writer is alive.
docs/FORMAT.md has the format.
"""
