"""Named fault points: the daemon exits hard there, for crash tests and ``jobsd demo crash``.

``JOBSD_FAULT`` names one point (refused unless ``JOBSD_ALLOW_FAULTS=1``):

- ``after_publish``: a handler returned (its side effect is done), its outcome is not
  written yet.
- ``after_outcome_sent``: the outcome's UPDATE has been sent and executed inside its
  transaction, the COMMIT not yet: the database rolls it back when the connection
  drops, so the job is left ``running`` under a dead owner, as when a commit's answer
  is lost and it did not happen.

The process leaves with ``os._exit(FAULT_EXIT_CODE)``: no cleanup, no outcome written,
no lock released but by the connection's end, as with kill -9.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Literal, NoReturn

__all__ = ["FAULT_EXIT_CODE", "FaultPoint", "crash_at"]

log = logging.getLogger(__name__)

FaultPoint = Literal["after_publish", "after_outcome_sent"]
FAULT_EXIT_CODE = 70


def crash_at(point: str, job_ids: list[str]) -> NoReturn:
    """Exit the process at once, saying where."""
    log.critical("fault.injected", extra={"point": point, "job_ids": job_ids})
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(FAULT_EXIT_CODE)
