"""jobsd.contrib.sqlalchemy without a database: a Session on another driver is refused.

Enqueueing in a Session's transaction is tested on Postgres in tests/db/test_db_sqla.py."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from jobsd import ConfigError
from jobsd.contrib import sqlalchemy as sqla


def test_a_session_on_another_driver_is_a_config_error() -> None:
    engine = sa.create_engine("sqlite://")
    with Session(engine) as session, pytest.raises(ConfigError, match="psycopg"):
        sqla.enqueue(session, "t", {}, org_id="o")
