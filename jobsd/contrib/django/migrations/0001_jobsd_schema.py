"""jobsd's schema, applied by ``manage.py migrate``.

It applies every pending migration jobsd ships, exactly as ``jobsd migrate`` does
(same bookkeeping, same lock: running both is harmless). A jobsd release that adds a
schema migration adds a Django migration here too, so that ``manage.py migrate`` keeps
the schema current; ``SCHEMA_VERSION`` says which jobsd migration each one reaches.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

SCHEMA_VERSION = 27


def apply_jobsd_schema(apps: Any, schema_editor: Any) -> None:
    from jobsd.store.migrate import apply_pending

    connection = schema_editor.connection
    connection.ensure_connection()
    apply_pending(connection.connection)


class Migration(migrations.Migration):  # type: ignore[misc]
    # each jobsd migration commits on its own, as with `jobsd migrate`
    atomic = False
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [migrations.RunPython(apply_jobsd_schema, elidable=False)]
