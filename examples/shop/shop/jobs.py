"""The shop's jobs, run by the jobsd daemon: ``jobsd run shop.jobs``."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

import jobsd
from pydantic import BaseModel, Field

from shop import mailer


class Receipt(BaseModel):
    """What a receipt needs: validated when it is enqueued and again before it runs."""

    order_id: UUID
    email: str
    items: list[str] = Field(min_length=1)
    ordered_at: datetime


@jobsd.handler(
    "send_receipt",
    retry=jobsd.RetryPolicy(3, backoff=30, retry_on=(mailer.MailError,)),
)
def send_receipt(ctx: jobsd.JobContext, receipt: Receipt) -> dict[str, str]:
    """Mail the receipt of an order."""
    lines = "\n".join(f"- {item}" for item in receipt.items)
    message_id = mailer.send(
        receipt.email,
        f"Your receipt for order {receipt.order_id}",
        f"Thank you for your order of {receipt.ordered_at:%d %B %Y}:\n{lines}\n",
    )
    return {"message_id": message_id}
