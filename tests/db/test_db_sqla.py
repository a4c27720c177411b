"""jobsd.contrib.sqlalchemy: enqueue in a Session's transaction; tables match the schema."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from dbcheck import count_jobs, history
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from jobsd import JobStatus, UnknownQueue
from jobsd.contrib import sqlalchemy as sqla
from jobsd.errors import PayloadTooLarge


def _sqla_url(db_url: str) -> URL:
    params: dict[str, Any] = dict(conninfo_to_dict(db_url))
    port = params.pop("port", None)
    return URL.create(
        "postgresql+psycopg",
        username=params.pop("user", None),
        password=params.pop("password", None),
        host=params.pop("host", None),
        port=int(port) if port else None,
        database=params.pop("dbname", None),
        query={k: str(v) for k, v in params.items()},
    )


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(_sqla_url(db_url))
    yield eng
    eng.dispose()


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[uuid.UUID]


def test_enqueue_in_a_rolled_back_session_leaves_nothing(
    engine: sa.Engine, conn: psycopg.Connection[Any]
) -> None:
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        job = sqla.enqueue(session, "import_csv", {"file": "a.csv"}, org_id="acme")
        session.add(Order(id=1, job_id=job.id))
        session.flush()
        # the job is part of the Session's transaction, readable through the tables
        status = session.execute(
            sa.select(sqla.jobs.c.status).where(sqla.jobs.c.id == job.id)
        ).scalar_one()
        assert status == "queued"
        assert count_jobs(conn) == 0
        session.rollback()

    assert count_jobs(conn) == 0
    assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)


def test_enqueue_in_a_committed_session_creates_the_job(
    engine: sa.Engine, conn: psycopg.Connection[Any]
) -> None:
    Base.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        job = sqla.enqueue(session, "import_csv", {"file": "a.csv"}, org_id="acme", dedup_key="a")
        same = sqla.enqueue(session, "import_csv", {"file": "b.csv"}, org_id="acme", dedup_key="a")
        session.add(Order(id=1, job_id=job.id))

    assert same.id == job.id
    assert job.status is JobStatus.QUEUED
    assert job.payload == {"file": "a.csv"}
    assert conn.execute("SELECT id, org_id, dedup_key FROM jobsd.jobs").fetchall() == [
        (job.id, "acme", "a")
    ]
    assert conn.execute("SELECT job_id FROM orders").fetchall() == [(job.id,)]
    assert history(conn, job.id) == [(None, "queued", 0, None, None)]
    with Session(engine) as session:
        joined = session.execute(
            sa.select(Order.id, sqla.jobs.c.type, sqla.all_job_events.c.to_status)
            .join(sqla.jobs, sqla.jobs.c.id == Order.job_id)
            .join(sqla.all_job_events, sqla.all_job_events.c.job_id == sqla.jobs.c.id)
        ).all()
    assert [tuple(r) for r in joined] == [(1, "import_csv", "queued")]


def test_errors_in_a_session(engine: sa.Engine, conn: psycopg.Connection[Any]) -> None:
    with Session(engine) as session:
        with pytest.raises(UnknownQueue):
            sqla.enqueue(session, "t", {}, org_id="o", queue="nope")
        with pytest.raises(PayloadTooLarge, match="over the limit of 50 bytes"):
            sqla.enqueue(session, "t", {"x": "y" * 100}, org_id="o", max_payload_bytes=50)
        # the Session's transaction is still usable
        job = sqla.enqueue(session, "t", {}, org_id="o")
        session.commit()
    assert conn.execute("SELECT id FROM jobsd.jobs").fetchall() == [(job.id,)]


def _compiled(type_: Any) -> str:
    return str(type_.compile(dialect=postgresql.dialect()))


@pytest.mark.parametrize("table", sorted(sqla.metadata.tables.values(), key=lambda t: t.name))
def test_tables_match_the_database(engine: sa.Engine, table: sa.Table) -> None:
    inspector = sa.inspect(engine)
    name, schema = table.name, "jobsd"

    real = {c["name"]: c for c in inspector.get_columns(name, schema=schema)}
    assert list(real) == [c.name for c in table.columns]  # same columns, same order
    for column in table.columns:
        found = real[column.name]
        assert _compiled(found["type"]) == _compiled(column.type), column.name
        assert found["nullable"] == column.nullable, column.name
        has_default = found["default"] is not None or found.get("identity") is not None
        declared = column.server_default is not None or column.identity is not None
        assert has_default == declared, column.name

    pk = inspector.get_pk_constraint(name, schema=schema)
    assert pk["constrained_columns"] == [c.name for c in table.primary_key.columns]

    real_fks = {
        (
            fk["name"],
            tuple(fk["constrained_columns"]),
            fk["referred_schema"],
            fk["referred_table"],
            tuple(fk["referred_columns"]),
            fk["options"].get("ondelete"),
        )
        for fk in inspector.get_foreign_keys(name, schema=schema)
    }
    assert real_fks == {
        (
            fk.name,
            tuple(c.name for c in fk.columns),
            fk.referred_table.schema,
            fk.referred_table.name,
            tuple(e.column.name for e in fk.elements),
            fk.ondelete,
        )
        for fk in table.foreign_key_constraints
    }

    real_uniques = {
        (u["name"], tuple(u["column_names"]))
        for u in inspector.get_unique_constraints(name, schema=schema)
    }
    assert real_uniques == {
        (u.name, tuple(u.columns.keys()))
        for u in table.constraints
        if isinstance(u, sa.UniqueConstraint)
    }

    real_checks = {c["name"] for c in inspector.get_check_constraints(name, schema=schema)}
    assert real_checks == {c.name for c in table.constraints if isinstance(c, sa.CheckConstraint)}

    real_indexes = {
        (
            i["name"],
            tuple(i["column_names"]),
            tuple(sorted(i.get("column_sorting", {}))),
            i["dialect_options"].get("postgresql_where") is not None,
        )
        for i in inspector.get_indexes(name, schema=schema)
        if not i.get("duplicates_constraint")  # the index behind a UNIQUE constraint
    }
    assert real_indexes == {_index_shape(i) for i in table.indexes}


def _index_shape(index: sa.Index) -> tuple[Any, ...]:
    names, descending = [], []
    for expr in index.expressions:
        if isinstance(expr, sa.UnaryExpression):  # col.desc()
            descending.append(expr.element.name)  # type: ignore[attr-defined]
            expr = expr.element
        names.append(expr.name)  # type: ignore[union-attr]
    where = index.dialect_options["postgresql"].get("where")
    return (index.name, tuple(names), tuple(sorted(descending)), where is not None)


def test_the_declared_tables_are_the_host_app_tables(engine: sa.Engine) -> None:
    real = set(sa.inspect(engine).get_table_names(schema="jobsd"))
    declared = {t.name for t in sqla.metadata.tables.values()}
    assert declared == {"jobs", "job_events", "queues"}
    assert declared <= real
