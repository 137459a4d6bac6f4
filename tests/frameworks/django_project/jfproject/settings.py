"""A minimal Django project for jobfence's tests, configured by environment variables.

``JF_DJ_VENDOR``: ``postgresql``, ``mysql`` or ``sqlite``; ``JF_DJ_NAME``: the database name
(PostgreSQL on 127.0.0.1 as user postgres, MySQL/MariaDB on 127.0.0.1 as root) or the SQLite
file. ``JF_DJ_INBOX_TABLE`` /
``JF_DJ_FENCE_TABLE``: non-default table names for jobfence's app. The alias ``other`` is a
second connection to the same database (a competing transaction in the tests).
"""

import os

SECRET_KEY = "jobfence-tests-only"
USE_TZ = True
DEBUG = False
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["jobfence.integrations.django", "shop"]

_vendor = os.environ["JF_DJ_VENDOR"]
_name = os.environ["JF_DJ_NAME"]
if _vendor == "postgresql":
    _db = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _name,
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "5432",
    }
elif _vendor == "sqlite":
    # a short busy timeout: a write behind another connection's write fails fast with
    # "database is locked"
    _db = {"ENGINE": "django.db.backends.sqlite3", "NAME": _name, "OPTIONS": {"timeout": 0.2}}
elif _vendor == "mysql":
    # PyMySQL standing in for mysqlclient (Django checks the MySQLdb version it reports)
    import pymysql

    pymysql.version_info = (2, 2, 1, "final", 0)
    pymysql.install_as_MySQLdb()
    _db = {
        "ENGINE": "django.db.backends.mysql",
        "NAME": _name,
        "USER": "root",
        "HOST": "127.0.0.1",
        "PORT": "3306",
    }
else:
    raise RuntimeError(f"JF_DJ_VENDOR must be postgresql, sqlite or mysql, got {_vendor!r}")

DATABASES = {"default": _db, "other": dict(_db)}

if os.environ.get("JF_DJ_INBOX_TABLE"):
    JOBFENCE_INBOX_TABLE = os.environ["JF_DJ_INBOX_TABLE"]
if os.environ.get("JF_DJ_FENCE_TABLE"):
    JOBFENCE_FENCE_TABLE = os.environ["JF_DJ_FENCE_TABLE"]
