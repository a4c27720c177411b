"""jobsd as a backend of Django's tasks framework.

In settings.py::

    INSTALLED_APPS = [..., "jobsd.contrib.django"]
    TASKS = {"default": {"BACKEND": "jobsd.contrib.django.JobsdBackend"}}

Every ``@task`` then runs on jobsd: ``.enqueue()`` writes its job on Django's own
connection, in the request's transaction; ``manage.py jobsd run`` runs them;
``manage.py migrate`` creates jobsd's schema. See docs/django.md.
"""

from __future__ import annotations

from jobsd.contrib.django.backend import JobsdBackend
from jobsd.contrib.django.errors import JobCancelled, JobEnded

__all__ = ["JobCancelled", "JobEnded", "JobsdBackend"]
