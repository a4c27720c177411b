"""Who may do what: the one answer every front end asks.

Jobs are seen and changed within the caller's scope (``Caller.scope``): a job of
another org is not found, never forbidden, so a tenant learns nothing of it. What
reaches beyond one org (queues, tokens, other orgs' types, counts and daemons) is an
operator's.
"""

from __future__ import annotations

import enum

from jobsd.errors import Forbidden
from jobsd.ops.caller import Caller

__all__ = ["Act", "may", "require"]


class Act(enum.StrEnum):
    """What a caller may ask for; the value reads in a refusal ("only an operator may ...")."""

    READ_JOBS = "read jobs"
    CHANGE_JOBS = "cancel, retry or resolve jobs"
    SEE_EVERY_ORG = "see every org's jobs, types and daemons"
    ADMINISTER_QUEUES = "administer queues and schedules"
    MANAGE_TOKENS = "manage tokens"


# what only an operator may do; the rest any caller may, within its scope
_OPERATOR_ONLY = frozenset({Act.SEE_EVERY_ORG, Act.ADMINISTER_QUEUES, Act.MANAGE_TOKENS})


def may(caller: Caller, act: Act) -> bool:
    """Say whether ``caller`` may ``act`` (on jobs: within its scope)."""
    return caller.operator or act not in _OPERATOR_ONLY


def require(caller: Caller, act: Act) -> None:
    """Raise Forbidden unless ``caller`` may ``act``."""
    if not may(caller, act):
        raise Forbidden(str(act))
