"""Mail to customers. This sample prints each message; a real shop calls its mail
provider here."""

from __future__ import annotations

import uuid


class MailError(Exception):
    """The mail provider refused the message or did not answer: worth another try."""


def send(to: str, subject: str, body: str) -> str:
    """Send one message; return the provider's id for it."""
    message_id = f"msg-{uuid.uuid4().hex[:12]}"
    print(f"mail {message_id} to {to}: {subject}\n{body}")
    return message_id
