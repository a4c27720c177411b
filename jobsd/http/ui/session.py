"""The dashboard's login session: a signed cookie naming a session of the database,
and the CSRF token of each form.

Logging in with an API token (typed into a form, never put in a URL) opens a row of
``jobsd.ui_sessions`` (``jobsd.store.sessions``) and sets a cookie that holds the
row's id, the token's SHA-256, an expiry and a random nonce, signed with
HMAC-SHA256. Every request asks the database whether that session is still live, so
a logout, a revoked token or the session's expiry ends it at once, for every copy
of the cookie. The CSRF token is an HMAC of the session's nonce: a page of another
site cannot read it (the cookie is HttpOnly, SameSite=Strict), and each action's
form carries it back. The key is ``JOBSD_UI_SECRET``, or random per process
(sessions then end when the process restarts).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
import uuid
from dataclasses import dataclass

__all__ = ["COOKIE_NAME", "Session", "SessionSigner"]

COOKIE_NAME = "jobsd_session"
_MAX_COOKIE = 512


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class Session:
    """What a validly signed cookie says: whose token, until when, the CSRF nonce, and
    the session of ``jobsd.ui_sessions`` it names (None in a cookie made before the
    sessions were kept in the database: such a cookie opens nothing)."""

    token_hash: bytes
    expires_at: float
    nonce: str
    session_id: uuid.UUID | None = None


class SessionSigner:
    """Make and check session cookies and CSRF tokens with one key."""

    def __init__(self, secret: str | None, ttl_s: float) -> None:
        key = secret.encode("utf-8") if secret else secrets.token_bytes(32)
        self._key = hashlib.sha256(b"jobsd-ui-session:" + key).digest()
        self.ttl_s = ttl_s

    def _mac(self, purpose: bytes, body: bytes) -> bytes:
        return hmac.new(self._key, purpose + b":" + body, hashlib.sha256).digest()

    def make(
        self,
        token_hash: bytes,
        *,
        session_id: uuid.UUID | None = None,
        now: float | None = None,
    ) -> str:
        """Return a cookie value for the session ``session_id`` of the token with this hash."""
        at = time.time() if now is None else now
        fields: dict[str, object] = {
            "h": token_hash.hex(),
            "e": round(at + self.ttl_s),
            "n": secrets.token_hex(16),
        }
        if session_id is not None:
            fields["s"] = str(session_id)
        body = json.dumps(fields, separators=(",", ":")).encode("ascii")
        return f"{_b64(body)}.{_b64(self._mac(b'session', body))}"

    def read(self, cookie: str | None, *, now: float | None = None) -> Session | None:
        """Return the session of a cookie, or None: missing, forged, malformed or expired.

        Whether the session is still live is the database's to say.
        """
        if not cookie or len(cookie) > _MAX_COOKIE:
            return None
        body_text, _, mac_text = cookie.partition(".")
        try:
            body, mac = _unb64(body_text), _unb64(mac_text)
            if not hmac.compare_digest(mac, self._mac(b"session", body)):
                return None
            data = json.loads(body)
            session_id = uuid.UUID(str(data["s"])) if "s" in data else None
            session = Session(
                bytes.fromhex(data["h"]), float(data["e"]), str(data["n"]), session_id
            )
        except (ValueError, KeyError, TypeError):
            return None
        if session.expires_at <= (time.time() if now is None else now):
            return None
        return session

    def csrf_token(self, session: Session) -> str:
        """Return the CSRF token that this session's forms carry."""
        return _b64(self._mac(b"csrf", session.nonce.encode("ascii")))

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        """Say whether a form's CSRF token belongs to this session (any text may come)."""
        if not isinstance(token, str) or not token or not token.isascii():
            return False
        return hmac.compare_digest(token, self.csrf_token(session))
