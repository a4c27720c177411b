"""The exceptions a task's result names when jobsd, not the task's code, ended its job."""

from __future__ import annotations

__all__ = ["JobCancelled", "JobEnded"]


class JobEnded(Exception):
    """The job failed without the task raising: it ran out of time, its daemon shut
    down on its last attempt, no daemon knew its task, ... (the traceback text says)."""


class JobCancelled(JobEnded):
    """The job was cancelled (``jobsd cancel``, the API or the dashboard)."""
