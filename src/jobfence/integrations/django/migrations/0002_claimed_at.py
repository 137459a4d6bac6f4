"""Inbox schema version 2: the inbox table gets the ``claimed_at`` column (when the current
attempt was claimed), NULL in the rows already there. Reversed: nothing to undo (a version-1
jobfence ignores the column)."""

from __future__ import annotations

from django.db import migrations

from jobfence.integrations.django import schema


class Migration(migrations.Migration):
    dependencies: list[tuple[str, str]] = [("jobfence", "0001_initial")]
    operations = [
        migrations.RunPython(schema.upgrade_forward, migrations.RunPython.noop, elidable=False),
    ]
