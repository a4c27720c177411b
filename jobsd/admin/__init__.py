"""Operator operations off the hot path: queues, roles, retention, snapshots."""
