"""Helpers shared by every tier of the test suite (see tests/README.md).

- ``fixtures``: pytest fixtures for every tier (``anyio_backend``, ``empty_db_url``),
  registered by tests/conftest.py.
- ``waiting``: waits with a deadline, never a bare sleep: ``poll`` / ``wait_until``
  (any condition), ``wait_status`` / ``wait_status_async`` (a job's status).
- ``jobs``: ``make_job`` / ``make_jobs``, jobs in any state made in the database, and
  ``job_row`` / ``fetch_job`` to read one back.
- ``daemon``: an in-process daemon (``running_daemon``) and fast test settings.
- ``history``: the checker of every job's event history.
- ``retention``: jobs of a pinned age for the retention tests.
"""
