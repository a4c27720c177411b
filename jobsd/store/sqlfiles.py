"""Find the shipped SQL files: numbered migrations and named queries.

In a wheel the ``sql/`` folder is packaged as ``jobsd/sql``; in a checkout it sits
beside the package.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from jobsd.errors import ConfigError

__all__ = ["Migration", "load_migrations", "load_named", "load_queries", "sql_dir"]

_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered migration file."""

    version: int
    name: str
    sql: str


def sql_dir() -> Path:
    """Return the folder holding ``migrations/`` and ``queries/``."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "sql", package.parent / "sql"):
        if (candidate / "migrations").is_dir():
            return candidate
    raise ConfigError(f"jobsd's SQL files are missing (looked in {package}/sql and beside it)")


@functools.cache
def load_named(folder: str) -> dict[str, str]:
    """Read every ``-- name:`` block of ``sql/<folder>/*.sql``, without comment lines."""
    blocks: dict[str, str] = {}
    for path in sorted((sql_dir() / folder).glob("*.sql")):
        text = path.read_text(encoding="utf-8")
        marks = list(_NAME_LINE.finditer(text))
        for mark, following in zip(marks, [*marks[1:], None], strict=True):
            end = following.start() if following else len(text)
            body = _strip_comment_lines(text[mark.end() : end])
            name = mark.group(1)
            if name in blocks:
                raise ConfigError(f"query {name!r} is defined twice (second time in {path.name})")
            blocks[name] = body
    return blocks


def load_queries() -> dict[str, str]:
    """Read every ``-- name:`` block of ``sql/queries/*.sql``."""
    return load_named("queries")


def load_migrations() -> list[Migration]:
    """Read ``sql/migrations/NNNN_name.sql`` in version order."""
    migrations = []
    for path in sorted((sql_dir() / "migrations").glob("*.sql")):
        match = _MIGRATION_FILE.match(path.name)
        if match is None:
            raise ConfigError(f"migration file name {path.name!r} is not NNNN_name.sql")
        migrations.append(
            Migration(int(match.group(1)), path.stem, path.read_text(encoding="utf-8"))
        )
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions):
        raise ConfigError("two migration files share a version number")
    return migrations


def _strip_comment_lines(body: str) -> str:
    lines = [line for line in body.strip().splitlines() if not line.lstrip().startswith("--")]
    return "\n".join(lines).strip()
