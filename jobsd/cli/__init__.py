"""The ``jobsd`` command line: one module per command (group), named after it."""

from jobsd.cli.app import main

__all__ = ["main"]
