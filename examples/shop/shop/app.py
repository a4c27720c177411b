"""The shop's web app: ``uvicorn shop.app:app``, with ``JOBSD_DATABASE_URL`` set."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from fastapi import FastAPI
from pydantic import BaseModel, Field

from shop.jobs import Receipt, send_receipt

ORG = "shop"
"""the org the shop's jobs belong to (a single-tenant app may set JOBSD_DEFAULT_ORG)"""

app = FastAPI(title="shop")


class Order(BaseModel):
    email: str
    items: list[str] = Field(min_length=1)


class OrderCreated(BaseModel):
    order_id: uuid.UUID
    receipt_job_id: uuid.UUID


@app.post("/orders", status_code=201)
async def create_order(order: Order) -> OrderCreated:
    """Take an order and enqueue the mail of its receipt."""
    order_id = uuid.uuid4()
    # A real shop stores the order first, and enqueues in the same transaction
    # (send_receipt.enqueue(..., conn=conn)): the receipt job exists if and only if the
    # order does.
    receipt = Receipt(
        order_id=order_id, email=order.email, items=order.items, ordered_at=datetime.now(UTC)
    )
    job = await send_receipt.enqueue(receipt, org_id=ORG, dedup_key=f"receipt:{order_id}")
    return OrderCreated(order_id=order_id, receipt_job_id=job.id)
