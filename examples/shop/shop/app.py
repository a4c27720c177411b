"""The shop's web app: ``uvicorn shop.app:app``, with ``JOBSD_DATABASE_URL`` set."""

from __future__ import annotations

import uuid

import jobsd
from fastapi import FastAPI
from pydantic import BaseModel, Field

ORG = "shop"
"""the org the shop's jobs belong to (jobsd keeps each org's jobs apart)"""

app = FastAPI(title="shop")


class Order(BaseModel):
    email: str
    items: list[str] = Field(min_length=1)


class OrderCreated(BaseModel):
    order_id: str
    receipt_job_id: str


@app.post("/orders", status_code=201)
async def create_order(order: Order) -> OrderCreated:
    """Take an order and enqueue the mail of its receipt."""
    order_id = uuid.uuid4().hex[:12]
    # A real shop stores the order first, and enqueues in the same transaction
    # (jobsd.enqueue(..., conn=conn)): the receipt job exists if and only if the order does.
    job = await jobsd.enqueue(
        "send_receipt",
        {"order_id": order_id, "email": order.email, "items": order.items},
        org_id=ORG,
        dedup_key=f"receipt:{order_id}",
    )
    return OrderCreated(order_id=order_id, receipt_job_id=str(job.id))
