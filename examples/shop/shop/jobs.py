"""The shop's jobs, run by the jobsd daemon: ``JOBSD_HANDLERS=shop.jobs jobsd run``."""

from __future__ import annotations

import jobsd

from shop import mailer


@jobsd.handler(
    "send_receipt",
    retry=jobsd.RetryPolicy(3, backoff=30, retry_on=(mailer.MailError,)),
)
def send_receipt(ctx: jobsd.JobContext) -> dict[str, str]:
    """Mail the receipt of an order; payload ``{"order_id", "email", "items"}``."""
    order = ctx.payload
    lines = "\n".join(f"- {item}" for item in order["items"])
    message_id = mailer.send(
        order["email"],
        f"Your receipt for order {order['order_id']}",
        f"Thank you for your order:\n{lines}\n",
    )
    return {"message_id": message_id}
