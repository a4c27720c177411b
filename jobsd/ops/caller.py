"""Who asks for an operation: the org it acts for, whether it is an operator, and the
name its changes carry in a job's history."""

from __future__ import annotations

from dataclasses import dataclass

from jobsd.store.tokens import TokenGrant

__all__ = ["Caller"]


@dataclass(frozen=True, slots=True)
class Caller:
    """The one description of a caller every front end builds.

    An operator acts for no org and sees every org's jobs: the database's own URL
    (the CLI, a client without an org) or an admin token of no org. Anyone else acts
    for exactly one org: an org's token, whatever its ``admin`` flag (a token made
    ``--admin`` for an org is an org's token everywhere).
    """

    org_id: str | None
    """The org the caller acts for; None for an operator."""
    operator: bool
    actor: str
    """Who the history names for the caller's changes (``api``, ``cli:alice``, ...)."""

    def __post_init__(self) -> None:
        if self.operator and self.org_id is not None:
            raise ValueError("an operator acts for no org")
        if not self.operator and not self.org_id:
            raise ValueError("a caller that is not an operator acts for one org (non-empty)")
        if not self.actor:
            raise ValueError("a caller needs an actor (who asks)")

    @classmethod
    def as_operator(cls, actor: str) -> Caller:
        """Return an operator: every org, queues, tokens."""
        return cls(None, True, actor)

    @classmethod
    def for_org(cls, org_id: str, actor: str) -> Caller:
        """Return a caller acting for ``org_id`` only."""
        return cls(org_id, False, actor)

    @classmethod
    def of_org_or_operator(cls, org_id: str | None, actor: str) -> Caller:
        """Return a caller for ``org_id``, or an operator when it is None (the client's
        ``org_id=`` arguments)."""
        return cls.as_operator(actor) if org_id is None else cls.for_org(org_id, actor)

    @classmethod
    def of_grant(cls, grant: TokenGrant, actor: str) -> Caller:
        """Return the caller a token stands for: an operator only for an admin token of
        no org; any token of an org acts for that org."""
        if grant.org_id is None:
            if not grant.admin:  # no such token can be made; refuse rather than guess
                raise ValueError("a token of no org must be an admin token")
            return cls.as_operator(actor)
        return cls.for_org(grant.org_id, actor)

    @property
    def scope(self) -> str | None:
        """Return the org whose jobs the caller sees, or None: every org's."""
        return self.org_id

    def org_to_read(self, org_id: str | None) -> tuple[bool, str | None]:
        """Return whether the caller may read what a filter by ``org_id`` asks for, and
        the org to read (None: every org's): an operator reads what it asks for, an
        org's caller its own org, and nothing of another org (an empty answer, as for
        an org with no jobs)."""
        if self.operator:
            return True, org_id
        if org_id is not None and org_id != self.org_id:
            return False, None
        return True, self.org_id
