"""Dashboard sessions that end on the server: logout, token revocation, expiry.

A login is a row of ``jobsd.ui_sessions``; the cookie carries its id (signed). Every
request checks that the row is live and its token not revoked, so a copy of the
cookie (a stolen one, another tab, another API process) stops working the moment
the session ends, not 8 hours later.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import psycopg
import pytest
from apikit import http_settings, running_api, settings_for, ui_login
from click.testing import CliRunner
from psycopg.conninfo import make_conninfo
from support.jobs import job_row, make_job
from support.tokens import stored_token

from jobsd.admin.roles import ROLE_KINDS, RoleNames, create_roles, drop_roles
from jobsd.cli import main as jobsd_main
from jobsd.http.ui.session import COOKIE_NAME, SessionSigner
from jobsd.ops.tokens import hash_token
from jobsd.store import migrate

pytestmark = pytest.mark.anyio

SECRET = "one-key-for-every-process-here"


async def logged_in(client: httpx.AsyncClient) -> bool:
    """Say whether the client's cookie opens the overview (else: sent to the login)."""
    answer = await client.get("/ui")
    assert answer.status_code in (200, 303), answer.text
    return answer.status_code == 200


def sessions(db_url: str) -> list[dict[str, Any]]:
    """Return every row of jobsd.ui_sessions (as the superuser), oldest first."""
    with psycopg.connect(db_url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT id, token_id, ended_at IS NOT NULL AS ended, "
            "  extract(epoch FROM expires_at - created_at) AS ttl_s "
            "FROM jobsd.ui_sessions ORDER BY created_at, id"
        )
        cols = [c.name for c in cur.description or []]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def token_id(db_url: str, token: str) -> uuid.UUID:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT id FROM jobsd.api_tokens WHERE token_hash = %s", (hash_token(token),)
        ).fetchone()
    assert row is not None
    return uuid.UUID(str(row[0]))


def second_client(api: Any) -> httpx.AsyncClient:
    """Return another browser on the same app (a cookie jar of its own)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api.app), base_url="http://api.test")


async def test_a_login_is_a_live_session_row_that_the_cookie_names(
    db_url: str, token_a: str
) -> None:
    async with running_api(settings_for(db_url), http_settings(ui_session_ttl=600.0)) as api:
        await ui_login(api.client, token_a)
        rows = sessions(db_url)
        assert len(rows) == 1
        row = rows[0]
        assert row["token_id"] == token_id(db_url, token_a) and not row["ended"]
        assert float(row["ttl_s"]) == pytest.approx(600.0, abs=2.0)
        cookie = api.client.cookies[COOKIE_NAME]
        assert token_a not in cookie
        session = SessionSigner(None, 1.0)  # another key: the cookie is not its
        assert session.read(cookie) is None


async def test_logout_ends_the_session_for_every_copy_of_the_cookie(
    db_url: str, token_a: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        queued = make_job(conn, org_id="acme")
    async with running_api(settings_for(db_url)) as api, second_client(api) as thief:
        csrf = await ui_login(api.client, token_a)
        thief.cookies.set(COOKIE_NAME, api.client.cookies[COOKIE_NAME], path="/ui")
        assert await logged_in(thief)  # a copy of the cookie works while the session lives
        out = await api.client.post("/ui/logout", data={"csrf": csrf})
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
        assert [r["ended"] for r in sessions(db_url)] == [True]

        assert not await logged_in(thief)
        for path in ("/ui/jobs", f"/ui/jobs/{queued}", f"/ui/jobs/{queued}/live"):
            answer = await thief.get(path)
            assert answer.status_code == 303, path
        refused = await thief.post(f"/ui/jobs/{queued}/cancel", data={"csrf": csrf})
        assert refused.status_code == 401
        again = await thief.post("/ui/logout", data={"csrf": csrf})
        assert again.status_code == 401
        with psycopg.connect(db_url, autocommit=True) as conn:
            assert job_row(conn, queued)["status"] == "queued"  # type: ignore[index]

        # a new login is a new session (the ended one is pruned), the copy stays dead
        await ui_login(api.client, token_a)
        assert [r["ended"] for r in sessions(db_url)] == [False]
        assert not await logged_in(thief)


async def test_logout_ends_only_its_own_session(db_url: str, token_a: str) -> None:
    async with running_api(settings_for(db_url)) as api, second_client(api) as other:
        csrf = await ui_login(api.client, token_a)
        await ui_login(other, token_a)  # the same token in another browser
        assert (await api.client.post("/ui/logout", data={"csrf": csrf})).status_code == 303
        assert await logged_in(other)
        assert sorted(r["ended"] for r in sessions(db_url)) == [False, True]


async def test_revoking_the_token_ends_all_its_sessions_at_once(
    db_url: str, token_a: str, token_b: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        running_api(settings_for(db_url)) as api,
        second_client(api) as tab,
        second_client(api) as globex,
    ):
        await ui_login(api.client, token_a)
        await ui_login(tab, token_a)
        await ui_login(globex, token_b)
        monkeypatch.setenv("JOBSD_DATABASE_URL", db_url)
        revoked = CliRunner().invoke(
            jobsd_main, ["token", "revoke", str(token_id(db_url, token_a))]
        )
        assert revoked.exit_code == 0, revoked.output
        assert not await logged_in(api.client)
        assert not await logged_in(tab)
        assert await logged_in(globex)  # another token's session lives on
        ended = {r["token_id"]: r["ended"] for r in sessions(db_url)}
        assert ended == {token_id(db_url, token_a): True, token_id(db_url, token_b): False}
        # and the revoked token cannot open a new one
        answer = await api.client.post("/ui/login", data={"token": token_a})
        assert answer.status_code == 401
        assert len(sessions(db_url)) == 3


async def test_an_expired_session_is_refused_and_pruned_at_the_next_login(
    db_url: str, token_a: str, token_b: str
) -> None:
    async with running_api(settings_for(db_url)) as api, second_client(api) as globex:
        await ui_login(api.client, token_a)
        await ui_login(globex, token_b)
        expired = token_id(db_url, token_a)
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE jobsd.ui_sessions SET created_at = now() - interval '2 hours', "
                "  expires_at = now() - interval '1 second' WHERE token_id = %s",
                (expired,),
            )
        assert not await logged_in(api.client)
        assert await logged_in(globex)
        assert len(sessions(db_url)) == 2  # refused, not yet pruned
        await ui_login(api.client, token_a)
        rows = sessions(db_url)
        assert len(rows) == 2 and not any(r["ended"] for r in rows)
        assert sorted(str(r["token_id"]) for r in rows) == sorted(
            str(t) for t in (expired, token_id(db_url, token_b))
        )
        assert await logged_in(api.client)


async def test_a_deleted_token_takes_its_sessions_with_it(db_url: str, token_a: str) -> None:
    async with running_api(settings_for(db_url)) as api:
        await ui_login(api.client, token_a)
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("DELETE FROM jobsd.api_tokens WHERE id = %s", (token_id(db_url, token_a),))
        assert sessions(db_url) == []
        assert not await logged_in(api.client)


async def test_a_signed_cookie_needs_a_live_session_of_its_own_token(
    db_url: str, token_a: str, token_b: str
) -> None:
    signer = SessionSigner(SECRET, 3600)
    async with running_api(settings_for(db_url), http_settings(ui_secret=SECRET)) as api:
        # signed with the right key, but no session: the shape of an older cookie, a
        # session id that was never made, another token's session
        for cookie in (
            signer.make(hash_token(token_a)),
            signer.make(hash_token(token_a), session_id=uuid.uuid4()),
        ):
            api.client.cookies.set(COOKIE_NAME, cookie, path="/ui")
            assert not await logged_in(api.client)
        api.client.cookies.clear()
        await ui_login(api.client, token_a)
        own = signer.read(api.client.cookies[COOKIE_NAME])
        assert own is not None and own.session_id is not None
        borrowed = signer.make(hash_token(token_b), session_id=own.session_id)
        api.client.cookies.set(COOKIE_NAME, borrowed, path="/ui")
        assert not await logged_in(api.client)


async def test_a_session_ended_in_one_process_is_refused_by_another(
    db_url: str, token_a: str
) -> None:
    http = http_settings(ui_secret=SECRET)
    async with (
        running_api(settings_for(db_url), http) as one,
        running_api(settings_for(db_url), http) as two,
    ):
        csrf = await ui_login(one.client, token_a)
        cookie = one.client.cookies[COOKIE_NAME]
        two.client.cookies.set(COOKIE_NAME, cookie, path="/ui")
        assert await logged_in(two.client)
        assert (await one.client.post("/ui/logout", data={"csrf": csrf})).status_code == 303
        assert not await logged_in(two.client)


@pytest.mark.parametrize("kind", ["api", "read"])
async def test_sessions_work_under_the_least_privilege_roles(
    db_url: str, roles: RoleNames, kind: str
) -> None:
    token, other = stored_token(db_url, "acme"), stored_token(db_url, "acme")
    url = make_conninfo(db_url, user=getattr(roles, kind))
    async with running_api(settings_for(url)) as api, second_client(api) as tab:
        csrf = await ui_login(api.client, token)
        await ui_login(tab, other)
        assert [r["ended"] for r in sessions(db_url)] == [False, False]
        stolen = api.client.cookies[COOKIE_NAME]
        assert (await api.client.post("/ui/logout", data={"csrf": csrf})).status_code == 303
        api.client.cookies.set(COOKIE_NAME, stolen, path="/ui")
        assert not await logged_in(api.client)

        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE jobsd.api_tokens SET revoked_at = now() WHERE token_hash = %s",
                (hash_token(other),),
            )
        assert not await logged_in(tab)
    assert [r["ended"] for r in sessions(db_url)] == [True, True]


def test_no_role_reads_or_writes_sessions_but_through_the_functions(
    db_url: str, roles: RoleNames
) -> None:
    stored_token(db_url, "acme")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobsd.ui_sessions (token_id, expires_at) "
            "SELECT id, now() + interval '1 hour' FROM jobsd.api_tokens"
        )
    # the read role's SELECT on every table shows no row (row-level security, no policy)
    with psycopg.connect(make_conninfo(db_url, user=roles.read), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM jobsd.ui_sessions").fetchone() == (0,)

    for kind in ("api", "enqueue", "read"):
        url = make_conninfo(db_url, user=getattr(roles, kind))
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in (
                "UPDATE jobsd.ui_sessions SET ended_at = NULL",
                "DELETE FROM jobsd.ui_sessions",
                "INSERT INTO jobsd.ui_sessions (token_id, expires_at) "
                "SELECT id, now() + interval '1 day' FROM jobsd.api_tokens",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement)
            if kind != "read":
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute("SELECT count(*) FROM jobsd.ui_sessions")
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM jobsd.ui_sessions").fetchone() == (1,)


def test_roles_made_before_the_sessions_may_open_them_after_the_upgrade(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade: the roles that look tokens up serve the dashboard without a new
    `roles create` (and `roles create` on an older schema grants no session function)."""
    shipped = migrate.load_migrations()
    monkeypatch.setattr(migrate, "load_migrations", lambda: [m for m in shipped if m.version < 26])
    migrate.migrate_sync(empty_db_url)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    names = RoleNames.for_prefix(prefix)
    create_roles(empty_db_url, prefix=prefix)
    try:
        monkeypatch.undo()
        assert "0026_ui_sessions" in migrate.migrate_sync(empty_db_url)
        functions = (
            "jobsd.ui_session_start(bytea, double precision)",
            "jobsd.ui_session_lookup(uuid, bytea)",
            "jobsd.ui_session_end(uuid, bytea)",
        )
        with psycopg.connect(empty_db_url, autocommit=True) as conn:
            for kind in ROLE_KINDS:
                allowed = [
                    conn.execute(
                        "SELECT has_function_privilege(%s, %s, 'EXECUTE')",
                        (getattr(names, kind), f),
                    ).fetchone()
                    for f in functions
                ]
                expected = kind in ("api", "enqueue", "read")
                assert allowed == [(expected,)] * 3, kind
            assert conn.execute(
                "SELECT has_function_privilege('public', %s, 'EXECUTE')", (functions[0],)
            ).fetchone() == (False,)
    finally:
        drop_roles(empty_db_url, prefix=prefix)
