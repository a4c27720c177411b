"""End-to-end tests: ``python -m jobsd`` as subprocesses, with real signals."""
