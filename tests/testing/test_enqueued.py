"""``assert_enqueued`` and ``enqueued_jobs``: what a test enqueued, matched by type, a
subset of the payload and any other field; a failure says what was enqueued instead."""

from __future__ import annotations

from unittest.mock import ANY

import pytest

import jobsd
from jobsd.testing import JobsdDB

pytestmark = pytest.mark.timeout(30)


def test_a_job_matches_on_its_type_a_subset_of_its_payload_and_its_fields(
    jobsd_db: JobsdDB,
) -> None:
    job = jobsd.enqueue_sync(
        "send_receipt",
        {"order_id": "A17", "email": "ada@example.com", "items": ["tea"]},
        org_id="shop",
        queue="default",
        priority=2,
    )

    assert jobsd_db.assert_enqueued("send_receipt") == job
    assert jobsd_db.assert_enqueued("send_receipt", {"order_id": "A17"}) == job
    assert jobsd_db.assert_enqueued(payload={"email": ANY, "items": ["tea"]}, org_id="shop") == job
    assert jobsd_db.assert_enqueued(priority=2, status="queued", count=1) == job


def test_enqueued_jobs_lists_the_matching_jobs_oldest_first(jobsd_db: JobsdDB) -> None:
    assert jobsd_db.enqueued_jobs() == []
    first = jobsd.enqueue_sync("mail", {"to": "a"}, org_id="acme")
    second = jobsd.enqueue_sync("mail", {"to": "b"}, org_id="acme")
    other = jobsd.enqueue_sync("sms", {"to": "a"}, org_id="acme")

    assert [j.id for j in jobsd_db.enqueued_jobs()] == [first.id, second.id, other.id]
    assert [j.id for j in jobsd_db.enqueued_jobs("mail")] == [first.id, second.id]
    assert [j.id for j in jobsd_db.enqueued_jobs(payload={"to": "a"})] == [first.id, other.id]
    assert jobsd_db.enqueued_jobs("mail", {"to": "c"}) == []


def test_the_failure_lists_what_was_enqueued_and_how_each_job_differs(
    jobsd_db: JobsdDB,
) -> None:
    jobsd.enqueue_sync(
        "send_receipt", {"order_id": "A17", "email": "ada@example.com"}, org_id="shop"
    )
    jobsd.enqueue_sync("restock", {"sku": "tea"}, org_id="shop", queue="default")

    with pytest.raises(AssertionError) as failure:
        jobsd_db.assert_enqueued("send_receipt", {"order_id": "B2", "gift": True}, org_id="shop")

    assert str(failure.value) == (
        "no job enqueued in this test matches type='send_receipt', payload containing "
        "{'order_id': 'B2', 'gift': True}, org_id='shop'; enqueued in this test (2):\n"
        "  - send_receipt (org_id='shop', queue='default', status='queued') "
        "payload={'email': 'ada@example.com', 'order_id': 'A17'}\n"
        "      payload['order_id'] is 'A17', not 'B2'; payload has no 'gift'\n"
        "  - restock (org_id='shop', queue='default', status='queued') payload={'sku': 'tea'}\n"
        "      type is 'restock', not 'send_receipt'; payload has no 'order_id'; "
        "payload has no 'gift'"
    )


def test_the_failure_says_when_nothing_was_enqueued(jobsd_db: JobsdDB) -> None:
    with pytest.raises(AssertionError) as failure:
        jobsd_db.assert_enqueued("send_receipt", {"order_id": "A17"})

    assert str(failure.value) == (
        "no job enqueued in this test matches type='send_receipt', payload containing "
        "{'order_id': 'A17'}: no job was enqueued in this test"
    )


def test_count_asks_for_exactly_that_many(jobsd_db: JobsdDB) -> None:
    for _ in range(2):
        jobsd.enqueue_sync("mail", {"to": "a"}, org_id="acme")

    assert jobsd_db.assert_enqueued("mail", count=2).type == "mail"
    with pytest.raises(AssertionError, match=r"^expected 1 job matching type='mail', found 2;"):
        jobsd_db.assert_enqueued("mail", count=1)
    with pytest.raises(ValueError, match="count must be at least 1"):
        jobsd_db.assert_enqueued("mail", count=0)


def test_an_unknown_field_is_a_type_error_naming_the_fields(jobsd_db: JobsdDB) -> None:
    with pytest.raises(TypeError, match=r"no such job field: colour \(fields: attempts, "):
        jobsd_db.assert_enqueued("mail", colour="red")
