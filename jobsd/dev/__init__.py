"""The embedded throwaway Postgres and ``jobsd dev`` (also used by tests and bench)."""
