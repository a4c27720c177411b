"""``jobsd migrate --sql``: the script printed without a database, and its options."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import jobsd
from jobsd.cli import main as jobsd_main
from jobsd.store.migrate import migration_script
from jobsd.store.sqlfiles import load_migrations

NO_DATABASE = {"JOBSD_DATABASE_URL": None}


def test_sql_prints_the_script_without_a_database() -> None:
    result = CliRunner().invoke(jobsd_main, ["migrate", "--sql"], env=NO_DATABASE)

    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"-- jobsd {jobsd.__version__} schema migrations")
    assert result.stdout == migration_script()
    assert [line for line in result.stdout.splitlines() if line.startswith("-- migration ")] == [
        f"-- migration {m.name}" for m in load_migrations()
    ]


def test_the_script_has_the_lock_the_bookkeeping_and_no_transaction() -> None:
    lines = [line.strip().upper() for line in migration_script().splitlines()]

    assert "SELECT PG_ADVISORY_XACT_LOCK(7669456938180897127);" in lines
    assert any("CREATE TABLE IF NOT EXISTS JOBSD.SCHEMA_MIGRATIONS" in line for line in lines)
    assert not {"BEGIN;", "COMMIT;", "ROLLBACK;"} & set(lines)


def test_after_prints_only_the_later_migrations() -> None:
    shipped = load_migrations()
    after = shipped[-2].version

    result = CliRunner().invoke(
        jobsd_main, ["migrate", "--sql", "--after", str(after)], env=NO_DATABASE
    )

    assert result.exit_code == 0, result.output
    printed = [line for line in result.stdout.splitlines() if line.startswith("-- migration ")]
    assert printed == [f"-- migration {shipped[-1].name}"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--sql", "--after", "-1"], "'--after'"),
        (["--sql", "--after", "x"], "'--after'"),
        (["--after", "3"], "--after goes with --sql"),
    ],
)
def test_a_bad_after_is_a_usage_error(args: list[str], says: str) -> None:
    result = CliRunner().invoke(jobsd_main, ["migrate", *args], env=NO_DATABASE)

    assert result.exit_code == 2, result.output
    assert says in result.output
    assert "-- jobsd" not in result.output
