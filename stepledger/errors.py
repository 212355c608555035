"""The exceptions stepledger raises, and how an exception it reports is cut to one line."""

from __future__ import annotations


def one_line(exc: BaseException) -> str:
    """What a one-line message quotes of ``exc``: the first line of its text (its type's name if it has
    none), at most 200 characters."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


class LedgerError(Exception):
    """A ledger cannot be read, written or compared.

    The message is one line that names the file or argument and what is wrong.
    The command line reports it and exits with code 2.
    """


class UnsupportedSpaceError(LedgerError, TypeError):
    """A space that stepledger cannot digest, raised when a wrapper is built."""


class SettingsError(LedgerError):
    """The two sides record with different settings (reward dtype, spaces), so their records cannot agree.

    Raised by compare, and by the live check at an env's first token.
    """


class WorkerLost(LedgerError):
    """A worker process or Ray task comparing some of the envs ended before it was done: the comparison is
    not whole, so no report is given (the command line exits 2, as for any comparison it cannot make)."""
