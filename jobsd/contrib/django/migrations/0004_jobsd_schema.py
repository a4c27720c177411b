"""jobsd's schema up to version 33 (a plain enqueue writes less),
applied by ``manage.py migrate``.

As ``0001_jobsd_schema`` does, it applies jobsd's schema migrations up to
``SCHEMA_VERSION`` exactly as ``jobsd migrate`` does, on each database a jobsd task
backend writes to, and does nothing on the others.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

SCHEMA_VERSION = 33


def apply_jobsd_schema(apps: Any, schema_editor: Any) -> None:
    from jobsd.contrib.django.schema import apply_schema

    apply_schema(schema_editor.connection, up_to=SCHEMA_VERSION)


class Migration(migrations.Migration):  # type: ignore[misc]
    # each jobsd migration commits on its own, as with `jobsd migrate`
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = [("jobsd", "0003_jobsd_schema")]
    operations: ClassVar[list[Any]] = [
        migrations.RunPython(apply_jobsd_schema, elidable=False),
    ]
