"""The report: reading ledgers and comparing them.

``read`` opens a ledger (local, shared or in object storage, whole or still being written); ``compare`` pairs
the env-side and trainer-side streams and finds each one's first difference; ``base`` is what every report
shares; ``jsonout`` and ``junit`` write it for machines; ``episodes`` checks a trainer's episode log against
the env-side record. Every line a report prints is worded in ``stepledger.wording``.
"""
