"""``python -m jobsd``: the same as the ``jobsd`` command."""

from jobsd.cli import main

main()
