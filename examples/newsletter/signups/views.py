import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

try:
    from django.tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
except ImportError:  # Django before 6.0: the django-tasks backport
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch

from signups.models import Subscriber
from signups.tasks import send_welcome


class PaymentDeclined(Exception):
    pass


def charge(plan: str, card: str) -> None:
    """Charge the plan's first month (here: a card named "declined" is declined)."""
    if plan != "free" and card == "declined":
        raise PaymentDeclined(card)


@csrf_exempt
@require_POST
def subscribe(request: HttpRequest) -> JsonResponse:
    """Create the subscriber, enqueue its welcome mail, then charge: a declined card
    rolls all three back, so no mail goes to someone who is not subscribed."""
    body = json.loads(request.body)
    plan = body.get("plan", "free")
    try:
        with transaction.atomic():
            subscriber = Subscriber.objects.create(email=body["email"], plan=plan)
            welcome = send_welcome.enqueue(subscriber.pk)
            charge(plan, body.get("card", ""))
    except PaymentDeclined:
        return JsonResponse({"error": "payment declined"}, status=402)
    return JsonResponse({"subscriber": subscriber.pk, "welcome": welcome.id}, status=201)


@require_GET
def welcome_status(request: HttpRequest, result_id: str) -> JsonResponse:
    """Say where the welcome mail is, through Django's own result API."""
    try:
        result = send_welcome.get_result(result_id)
    except (TaskResultDoesNotExist, TaskResultMismatch):
        return JsonResponse({"error": "no such welcome mail"}, status=404)
    answer = {"status": str(result.status), "attempts": result.attempts}
    if result.is_finished and not result.errors:
        answer["return_value"] = result.return_value
    return JsonResponse(answer)
