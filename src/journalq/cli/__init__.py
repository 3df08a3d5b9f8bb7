"""The ``journalq`` command line; the entry point is ``journalq.cli.main:main``."""

from journalq.cli.main import cli, main

__all__ = ["cli", "main"]
