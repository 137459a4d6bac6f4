"""Create jobfence's inbox and fencing tables; reversed, drop them."""

from __future__ import annotations

from django.db import migrations

from jobfence.integrations.django import schema


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [
        migrations.RunPython(schema.migrate_forward, schema.migrate_backward, elidable=False),
    ]
