"""jobsd's schema, applied by ``manage.py migrate``.

It applies jobsd's schema migrations up to ``SCHEMA_VERSION``, exactly as ``jobsd
migrate`` does (same bookkeeping, same lock: running both is harmless), on each
database a jobsd task backend writes to, and does nothing on the others. A jobsd
release that adds a schema migration adds a Django migration here too, reaching it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

SCHEMA_VERSION = 27


def apply_jobsd_schema(apps: Any, schema_editor: Any) -> None:
    from jobsd.contrib.django.schema import apply_schema

    apply_schema(schema_editor.connection, up_to=SCHEMA_VERSION)


class Migration(migrations.Migration):  # type: ignore[misc]
    # each jobsd migration commits on its own, as with `jobsd migrate`
    atomic = False
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [
        migrations.RunPython(apply_jobsd_schema, elidable=False),
    ]
