"""docs/schema.md lists every index that exists, as it is defined."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg

SCHEMA_DOC = Path(__file__).resolve().parents[2] / "docs" / "schema.md"
ROW = re.compile(r"^\| `(\w+)` \| `(\w+)` \| `(.+)` \| .*\|$")


def test_the_schema_doc_lists_exactly_the_indexes_of_pg_indexes(
    conn: psycopg.Connection[Any],
) -> None:
    text = SCHEMA_DOC.read_text(encoding="utf-8")
    section = text[text.index("\n## Indexes\n") :]
    documented = {m.groups() for line in section.splitlines() if (m := ROW.match(line))}
    rows = conn.execute(
        "SELECT i.tablename, i.indexname,"
        "       regexp_replace(i.indexdef, '^.* USING btree ', '')"
        " FROM pg_indexes AS i"
        " JOIN pg_class AS c ON c.oid = format('%I.%I', i.schemaname, i.indexname)::regclass"
        " WHERE i.schemaname = 'jobsd' AND NOT c.relispartition"
    ).fetchall()
    actual = {tuple(r) for r in rows}
    assert documented - actual == set(), "documented but not in the database"
    assert actual - documented == set(), "in the database but not documented"
