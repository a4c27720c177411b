"""A view that enqueues in its transaction, and the task run to a result Django reads."""

import json


def subscribe(client, **body):
    return client.post("/subscribe", json.dumps(body), content_type="application/json")


def test_a_subscription_enqueues_the_welcome_mail_with_its_row(client, jobsd_db):
    answer = subscribe(client, email="ada@example.com")

    assert answer.status_code == 201
    from signups.models import Subscriber  # models load once Django is set up (conftest)

    subscriber = Subscriber.objects.get(email="ada@example.com")
    jobsd_db.assert_enqueued(
        "signups.tasks.send_welcome",
        {"args": [subscriber.pk], "kwargs": {}},
        priority=-10,  # Django's priority 10: sooner
    )


def test_a_declined_card_leaves_neither_the_subscriber_nor_the_mail(client, jobsd_db):
    answer = subscribe(client, email="bob@example.com", plan="pro", card="declined")

    assert answer.status_code == 402
    from signups.models import Subscriber

    assert not Subscriber.objects.exists()
    assert jobsd_db.enqueued_jobs() == []


def test_the_welcome_mail_runs_to_a_result_read_through_django(client, jobsd_worker):
    welcome = subscribe(client, email="cy@example.com").json()["welcome"]

    [ran] = jobsd_worker.drain()

    assert ran.status == "succeeded"
    answer = client.get(f"/welcome/{welcome}").json()
    assert answer == {
        "status": "SUCCESSFUL",
        "attempts": 1,
        "return_value": {"sent_to": "cy@example.com"},
    }
    from signups.models import Subscriber

    assert Subscriber.objects.get(email="cy@example.com").welcomed_at is not None


def test_the_status_of_no_welcome_mail_is_404(client, jobsd_db):
    answer = client.get("/welcome/0190a0a0-0000-7000-8000-000000000000")

    assert answer.status_code == 404
