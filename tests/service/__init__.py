"""Service tests: the daemon run in-process against the test's own database."""
