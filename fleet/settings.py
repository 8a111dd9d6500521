"""Fleetwatch settings: one module, everything from the environment.

Nothing set gives the embedded default — SQLite in ``var/``, Celery tasks run eagerly in the web
process, artifacts on local disk — so a fresh checkout runs with no services. Production sets
``DATABASE_URL`` (PostgreSQL through psycopg 3), ``CELERY_BROKER_URL`` (Redis) and a real
``SECRET_KEY``. See README.md for the full list.
"""

from __future__ import annotations

from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from fleet.env import env_bool, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("FLEETWATCH_DATA_DIR") or BASE_DIR / "var")

DEV_SECRET_KEY = "fleetwatch-development-secret-not-for-production"
DEBUG = env_bool("DEBUG", True)
SECRET_KEY = env_str("SECRET_KEY", DEV_SECRET_KEY)
if not DEBUG and SECRET_KEY == DEV_SECRET_KEY:
    raise ImproperlyConfigured(
        "DEBUG is false but SECRET_KEY is the development secret: set SECRET_KEY to a long random "
        "value (python -c 'import secrets; print(secrets.token_urlsafe(50))')"
    )

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework_api_key",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "fleet",
    "ingest",
    "analysis",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # A database down answers 503 + Retry-After, a full disk 507, not a 500.
    "fleet.middleware.UnavailableMiddleware",
    # A NUL in a query parameter answers 400 with the reason, before any filter runs.
    "fleet.middleware.QueryTextMiddleware",
    # A chunked body with no length answers 411 with the reason (WSGI cannot read it).
    "fleet.middleware.BodyLengthMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "fleet.urls"
WSGI_APPLICATION = "fleet.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "fleet.context.culprit_palette",
            ],
        },
    },
]

# --- Database --------------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    if not DATABASE_URL.startswith(("postgres://", "postgresql://", "sqlite:")):
        raise ImproperlyConfigured(
            f"DATABASE_URL must be postgres://… or sqlite:…, got {DATABASE_URL.split(':')[0]}:…"
        )
    DATABASES = {
        "default": dj_database_url.parse(
            DATABASE_URL,
            conn_max_age=env_int("DB_CONN_MAX_AGE", 60, minimum=0),
            # A persistent connection outlives a database restart: check it before reusing it,
            # so the first request after the restart gets a fresh one instead of an error.
            conn_health_checks=True,
        )
    }
else:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "fleetwatch.sqlite3",
            # The web process and eager tasks share one file: wait for a lock, don't fail.
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# While the database is unreachable the API answers 503 with this Retry-After (seconds).
FLEETWATCH_RETRY_AFTER_SECONDS = env_int("FLEETWATCH_RETRY_AFTER_SECONDS", 5, minimum=1)

# --- Cache (rate limits, debounce); Redis when configured ------------------------------------
REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            # A Redis that is down or black-holed must not hang a request (rate limits fail open).
            "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- Auth ------------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "overview"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# --- Static files and artifact storage -------------------------------------------------------
STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
# WhiteNoise serves collected files in production; the folder must exist even before that.
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
MEDIA_ROOT = DATA_DIR / "artifacts"

S3_BUCKET = env_str("FLEETWATCH_S3_BUCKET")
if S3_BUCKET:
    # Any S3-compatible store (AWS, MinIO, Ceph): credentials come from the usual AWS_* variables.
    ARTIFACT_STORAGE = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": S3_BUCKET,
            "endpoint_url": env_str("FLEETWATCH_S3_ENDPOINT_URL") or None,
            "region_name": env_str("FLEETWATCH_S3_REGION") or None,
            "location": env_str("FLEETWATCH_S3_PREFIX", "artifacts"),
            "file_overwrite": False,
            "default_acl": None,
        },
    }
else:
    ARTIFACT_STORAGE = {
        # FileSystemStorage that writes a blob whole or not at all (a full disk leaves nothing).
        "BACKEND": "ingest.storage.ArtifactFileSystemStorage",
        "OPTIONS": {"location": MEDIA_ROOT},
    }
STORAGES = {
    "default": ARTIFACT_STORAGE,
    "artifacts": ARTIFACT_STORAGE,
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# --- Uploads ---------------------------------------------------------------------------------
# Largest artifact accepted, compressed size; gzip is also bounded after decompression.
FLEETWATCH_MAX_UPLOAD_BYTES = env_int("FLEETWATCH_MAX_UPLOAD_BYTES", 256 * 1024 * 1024, minimum=1)
FLEETWATCH_MAX_INFLATED_BYTES = env_int(
    "FLEETWATCH_MAX_INFLATED_BYTES", 4 * 1024 * 1024 * 1024, minimum=1
)
# How far the request itself inflates a gzip upload to check it (about half a second of zlib on
# a busy core); the parse in the worker reads past it (ingest.services._scan).
FLEETWATCH_REQUEST_INFLATE_BYTES = env_int(
    "FLEETWATCH_REQUEST_INFLATE_BYTES", 256 * 1024 * 1024, minimum=1
)
# Django keeps small uploads in memory and spools larger ones to a temporary file.
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
FILE_UPLOAD_TEMP_DIR = env_str("FLEETWATCH_UPLOAD_TMP") or None

# --- Celery ----------------------------------------------------------------------------------
CELERY_TASK_ALWAYS_EAGER = not env_str("CELERY_BROKER_URL")
# Eager mode never touches a broker; naming the in-memory one keeps kombu from warning.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL") or "memory://"
CELERY_TASK_EAGER_PROPAGATES = env_bool("CELERY_TASK_EAGER_PROPAGATES", False)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True  # a worker killed mid-task leaves the message for another
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"

# Two queues so that parsing and analysis scale (and back up) independently: a burst of uploads
# never waits behind a weekly report, and classification never waits behind 2,000 parses.
# A worker without -Q consumes both; `celery -A fleet worker -Q ingest` or `-Q analysis` one.
# Each queue has an exchange and routing key of its own: a queue declared by name alone is bound
# to the default exchange and key, and every message would then land in both queues.
from kombu import Exchange, Queue  # noqa: E402

CELERY_TASK_QUEUES = tuple(
    Queue(name, Exchange(name), routing_key=name) for name in ("ingest", "analysis")
)
CELERY_TASK_DEFAULT_QUEUE = "analysis"
CELERY_TASK_DEFAULT_EXCHANGE = "analysis"
CELERY_TASK_DEFAULT_ROUTING_KEY = "analysis"
CELERY_TASK_ROUTES = {
    "ingest.tasks.*": {"queue": "ingest"},
    "analysis.tasks.*": {"queue": "analysis"},
    "fleet.tasks.*": {"queue": "analysis"},  # notification deliveries: short, I/O-bound
}

# The broker may be down when an upload commits. A publish then fails fast — a few quick
# retries, bounded connect and socket timeouts (a black-holed Redis would otherwise hang the
# request) — and is logged and dropped: the committed row is the record, and the sweeper below
# re-enqueues it once the broker is back.
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.2,
}
CELERY_BROKER_CONNECTION_TIMEOUT = 2.0
# Redis re-delivers a message a killed worker had taken (acks_late) only after the visibility
# timeout. It must exceed the longest task and the longest countdown (the settle window), or a
# healthy, slow task is delivered twice (harmless: claims and idempotent writes, but wasted).
FLEETWATCH_BROKER_VISIBILITY_TIMEOUT = env_int(
    "FLEETWATCH_BROKER_VISIBILITY_TIMEOUT", 1800, minimum=1
)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": FLEETWATCH_BROKER_VISIBILITY_TIMEOUT,
    "socket_connect_timeout": 2.0,
    "socket_timeout": 5.0,  # Redis answers in microseconds; BRPOP polls every second
    "socket_keepalive": True,
}

# The sweeper (ingest.tasks.uploads_sweep; beat, and whenever a worker starts) re-enqueues what
# has no live message: uploads still received after the grace (their publish failed, or the
# broker lost the message), claims whose lease ran out, and attempts parsed but never
# classified. A re-enqueued upload whose message was only queued costs one no-op claim.
# A claim is a lease its worker renews every third of the lease while the work runs (a parse,
# a classification: fleet.celery.lease_renewed); a claim not renewed belongs to a worker that
# died, and the next sweep hands its work to another. A dead worker's work is taken over within
# a lease plus a sweep interval (30 + 30 s), not the broker's visibility timeout.
FLEETWATCH_PARSE_LEASE_SECONDS = env_float("FLEETWATCH_PARSE_LEASE_SECONDS", 30.0, minimum=1.0)
FLEETWATCH_CLASSIFY_LEASE_SECONDS = env_float(
    "FLEETWATCH_CLASSIFY_LEASE_SECONDS", 30.0, minimum=1.0
)
# Seconds one parse may run (a 4 GiB log parses in well under a minute here): past it the parse
# is failed with the reason, and a worker stuck where Python cannot stop it is killed 5 s later.
FLEETWATCH_PARSE_TIME_LIMIT = env_int("FLEETWATCH_PARSE_TIME_LIMIT", 600, minimum=1)
FLEETWATCH_SWEEP_SECONDS = env_float("FLEETWATCH_SWEEP_SECONDS", 30.0, minimum=1.0)
FLEETWATCH_SWEEP_GRACE_SECONDS = env_float("FLEETWATCH_SWEEP_GRACE_SECONDS", 120.0, minimum=0.0)
FLEETWATCH_SWEEP_BATCH = env_int("FLEETWATCH_SWEEP_BATCH", 500, minimum=1)
# Work the sweep re-published is not re-published again for this long: its message may be
# queued behind a backlog (workers down or slow), and sending it every sweep only grows the
# queue. A message the broker lost meanwhile waits this long for its second re-publish.
FLEETWATCH_SWEEP_REPUBLISH_SECONDS = env_float(
    "FLEETWATCH_SWEEP_REPUBLISH_SECONDS", 300.0, minimum=0.0
)

# Seconds to wait after the last upload of an attempt before classifying it, so that the logs of
# every rank join one verdict instead of one per upload. The embedded default (eager Celery)
# waits too, on a timer thread in the server process (fleet.celery.EagerCountdowns).
FLEETWATCH_SETTLE_SECONDS = env_float("FLEETWATCH_SETTLE_SECONDS", 10.0, minimum=0.0)
if FLEETWATCH_SETTLE_SECONDS >= FLEETWATCH_BROKER_VISIBILITY_TIMEOUT:
    # A countdown longer than the visibility timeout is re-delivered again and again.
    raise ImproperlyConfigured(
        f"FLEETWATCH_BROKER_VISIBILITY_TIMEOUT={FLEETWATCH_BROKER_VISIBILITY_TIMEOUT} must exceed "
        f"FLEETWATCH_SETTLE_SECONDS={FLEETWATCH_SETTLE_SECONDS}"
    )

# --- Fleet memory ----------------------------------------------------------------------------
# Days of incidents and attempts that recurrence scores read (older evidence also decays).
FLEETWATCH_MEMORY_DAYS = env_int("FLEETWATCH_MEMORY_DAYS", 7, minimum=1)
# Recompute scores at most this often after incidents arrive; beat also runs it periodically.
FLEETWATCH_CORRELATE_SECONDS = env_int("FLEETWATCH_CORRELATE_SECONDS", 60, minimum=0)
CELERY_BEAT_SCHEDULE = {
    "fleet-correlate": {"task": "analysis.tasks.fleet_correlate", "schedule": 300.0},
    "uploads-sweep": {"task": "ingest.tasks.uploads_sweep", "schedule": FLEETWATCH_SWEEP_SECONDS},
}

# --- REST framework --------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "ingest.auth.AgentKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["ingest.auth.CanRead"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    # DRF's parsers, with JSON nested too deeply for the decoder answered 400, not 500.
    "DEFAULT_PARSER_CLASSES": [
        "fleet.api.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "fleet.api.Pagination",
    "PAGE_SIZE": env_int("FLEETWATCH_PAGE_SIZE", 50, minimum=1),
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "fleet.api.exception_handler",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Fleetwatch API",
    "DESCRIPTION": "Uploads from GPU hosts, incidents with their culprit, fleet inventory.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI from this server's static files, never a CDN: clusters have no internet.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # Eager mode would log every task run at INFO; keep the console for what matters.
    "loggers": {"celery.app.trace": {"level": "WARNING"}},
}

# Behind a TLS-terminating proxy in production.
if not DEBUG:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", True)
    CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", True)

# --- Operations (issue 8) --------------------------------------------------------------------
# Drains: dry-run (default: audit what would run, run nothing) | slurm | kubernetes.
FLEETWATCH_DRAIN = env_str("FLEETWATCH_DRAIN", "dry-run")
if FLEETWATCH_DRAIN not in ("dry-run", "slurm", "kubernetes"):
    raise ImproperlyConfigured(
        f"FLEETWATCH_DRAIN={FLEETWATCH_DRAIN!r}: use dry-run, slurm or kubernetes"
    )
# Whose commands a dry run records.
FLEETWATCH_DRAIN_PREVIEW = env_str("FLEETWATCH_DRAIN_PREVIEW", "slurm")
if FLEETWATCH_DRAIN_PREVIEW not in ("slurm", "kubernetes"):
    raise ImproperlyConfigured("FLEETWATCH_DRAIN_PREVIEW must be slurm or kubernetes")
FLEETWATCH_SCONTROL = env_str("FLEETWATCH_SCONTROL", "scontrol")
# Per-key rate limits by the scope an endpoint needs ("N/s|min|hour|day"; empty: unlimited).
# Uploads burst when a large job fails (every rank at once), so their default is high.
FLEETWATCH_RATE_LIMITS = {
    "read": env_str("FLEETWATCH_RATE_LIMIT_READ", "600/min"),
    "upload": env_str("FLEETWATCH_RATE_LIMIT_UPLOAD", "20000/min"),
    "operate": env_str("FLEETWATCH_RATE_LIMIT_OPERATE", "60/min"),
}
REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"] = ["fleet.api.throttling.AgentKeyThrottle"]
# Weekly reliability report: who gets it, and the mail server (console backend by default).
FLEETWATCH_REPORT_EMAILS = env_list("FLEETWATCH_REPORT_EMAILS", [])
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "fleetwatch@localhost")
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
FLEETWATCH_REPORT_PDF = env_bool("FLEETWATCH_REPORT_PDF", True)
# Monday 06:00 UTC: the week before, complete.
from celery.schedules import crontab  # noqa: E402

CELERY_BEAT_SCHEDULE["weekly-report"] = {
    "task": "analysis.tasks.weekly_report_build",
    "schedule": crontab(minute=0, hour=6, day_of_week="mon"),
}
# Notifications (fleet.notify): destinations are added in the admin. Where operators reach the
# UI, to make the links in notifications absolute (empty: UI paths as they are).
FLEETWATCH_PUBLIC_URL = env_str("FLEETWATCH_PUBLIC_URL")
# A delivery whose receiver refuses or times out is retried with full-jitter back-off this many
# times (about 10 minutes in all at the 2-minute cap), then marked failed.
FLEETWATCH_NOTIFY_MAX_RETRIES = env_int("FLEETWATCH_NOTIFY_MAX_RETRIES", 8, minimum=0)
CELERY_BEAT_SCHEDULE["notifications-sweep"] = {
    "task": "fleet.tasks.notifications_sweep",
    "schedule": 300.0,
}
# Optional bearer token that /metrics asks for (empty: open, as scrape targets usually are).
FLEETWATCH_METRICS_TOKEN = env_str("FLEETWATCH_METRICS_TOKEN")
# WeasyPrint narrates every layout step at INFO.
LOGGING["loggers"].update({"weasyprint": {"level": "WARNING"}, "fontTools": {"level": "WARNING"}})
SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"] = [
    "drf_spectacular.hooks.postprocess_schema_enums",
    "fleet.api.ops.schema_document_errors",
]
