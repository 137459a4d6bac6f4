"""The Django app: add ``"jobfence.integrations.django"`` to ``INSTALLED_APPS``."""

from __future__ import annotations

from django.apps import AppConfig


class JobfenceConfig(AppConfig):
    """jobfence's tables as a Django app: ``manage.py migrate`` creates the inbox and fencing
    tables (named by the ``JOBFENCE_INBOX_TABLE`` and ``JOBFENCE_FENCE_TABLE`` settings),
    ``manage.py migrate jobfence zero`` drops them. The app has no models: the tables are
    jobfence's own, written only through ``claim_in``, ``fence`` and the inbox backends."""

    name = "jobfence.integrations.django"
    label = "jobfence"
    verbose_name = "jobfence"
