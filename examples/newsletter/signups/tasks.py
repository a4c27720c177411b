"""The site's tasks: Django's @task, run by jobsd's daemon (`manage.py jobsd run`)."""

from django.utils import timezone

try:
    from django.tasks import task
except ImportError:  # Django before 6.0: the django-tasks backport
    from django_tasks import task

from signups.models import Subscriber


@task(priority=10)
def send_welcome(subscriber_id: int) -> dict[str, str]:
    """Mail the welcome message (here: note that it was sent) and say to whom."""
    subscriber = Subscriber.objects.get(pk=subscriber_id)
    subscriber.welcomed_at = timezone.now()
    subscriber.save(update_fields=["welcomed_at"])
    return {"sent_to": subscriber.email}


@task
def weekly_digest(plan: str) -> int:
    """Count the subscribers of a plan the digest goes to (a low-priority batch)."""
    return Subscriber.objects.filter(plan=plan).count()
