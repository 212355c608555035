"""The exceptions stepledger raises."""


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
