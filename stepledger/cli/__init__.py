"""The command line: ``stepledger compare|show|check|episodes|demo|docs|...`` (also ``python -m stepledger``)."""

from stepledger.cli.main import main

__all__ = ["main"]
