"""The parameters of ``jobs_claim_batch`` for tests that run the statement by name."""

from __future__ import annotations

from typing import Any


def claim_params(limit: int, worker_id: str = "w", **overrides: Any) -> dict[str, Any]:
    """Return ``jobs_claim_batch``'s parameters: every queue and type, no keys kept, no
    limits, every job free to start (``free`` None), the others reserved for a minute; ``overrides``
    replace any of them."""
    params: dict[str, Any] = {
        "limit": limit,
        "worker_id": worker_id,
        "queues": None,
        "keep_dedup_types": [],
        "limit_types": [],
        "limit_values": [],
        "free": None,
        "types": None,
        "at_most_once_types": [],
        "relaxed_commit": True,
        "reserve_s": 60.0,
    }
    return params | overrides
