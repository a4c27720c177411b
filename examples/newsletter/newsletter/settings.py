"""Settings of the newsletter site: a Django project whose tasks run on jobsd."""

import os

from psycopg.conninfo import conninfo_to_dict

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "only-for-the-example")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
ROOT_URLCONF = "newsletter.urls"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "jobsd.contrib.django",  # `manage.py jobsd ...` and jobsd's schema in `migrate`
    "signups",
]

# one PostgreSQL database for the site's tables and jobsd's jobs (DATABASE_URL, a libpq
# URL: postgresql://user:password@host:port/dbname)
_db = conninfo_to_dict(os.environ.get("DATABASE_URL", "postgresql:///newsletter"))
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.pop("dbname", "newsletter"),
        "USER": _db.pop("user", ""),
        "PASSWORD": _db.pop("password", ""),
        "HOST": _db.pop("host", ""),
        "PORT": _db.pop("port", ""),
        "OPTIONS": _db,
    }
}

# every @task runs on jobsd: enqueued in the request's transaction, run by
# `manage.py jobsd run`
TASKS = {
    "default": {
        "BACKEND": "jobsd.contrib.django.JobsdBackend",
        "OPTIONS": {"ORG_ID": "newsletter"},
    }
}
