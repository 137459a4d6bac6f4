#!/usr/bin/env python
"""The test project's manage.py (settings from environment variables: jfproject/settings.py)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jfproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
