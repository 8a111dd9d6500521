"""Settings come from the environment and refuse unsafe or malformed values."""

import subprocess
import sys


def settings_run(env: dict[str, str], expr: str = "1") -> subprocess.CompletedProcess:
    code = f"import fleet.settings as s; print({expr})"
    return subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": ".", "PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
    )


def test_nothing_set_means_sqlite_eager_celery_and_local_files(tmp_path):
    out = settings_run(
        {"FLEETWATCH_DATA_DIR": str(tmp_path)},
        "s.DATABASES['default']['ENGINE'], s.CELERY_TASK_ALWAYS_EAGER, "
        "s.STORAGES['artifacts']['BACKEND']",
    )
    assert out.returncode == 0, out.stderr
    assert "sqlite3" in out.stdout and "True" in out.stdout and "FileSystemStorage" in out.stdout


def test_database_url_switches_to_postgresql_through_psycopg(tmp_path):
    out = settings_run(
        {"DATABASE_URL": "postgres://u@127.0.0.1:5432/db", "FLEETWATCH_DATA_DIR": str(tmp_path)},
        "s.DATABASES['default']['ENGINE']",
    )
    assert out.stdout.strip() == "django.db.backends.postgresql"


def test_broker_url_turns_eager_mode_off(tmp_path):
    out = settings_run(
        {"CELERY_BROKER_URL": "redis://127.0.0.1:6379/0", "FLEETWATCH_DATA_DIR": str(tmp_path)},
        "s.CELERY_TASK_ALWAYS_EAGER",
    )
    assert out.stdout.strip() == "False"


def test_debug_off_refuses_the_development_secret(tmp_path):
    out = settings_run({"DEBUG": "false", "FLEETWATCH_DATA_DIR": str(tmp_path)})
    assert out.returncode != 0
    assert "SECRET_KEY" in out.stderr


def test_debug_off_starts_with_a_real_secret(tmp_path):
    out = settings_run(
        {"DEBUG": "false", "SECRET_KEY": "x" * 50, "FLEETWATCH_DATA_DIR": str(tmp_path)}
    )
    assert out.returncode == 0, out.stderr


def test_a_malformed_boolean_stops_the_start(tmp_path):
    out = settings_run({"DEBUG": "flase", "FLEETWATCH_DATA_DIR": str(tmp_path)})
    assert out.returncode != 0
    assert "DEBUG='flase' is not a boolean" in out.stderr


def test_an_s3_bucket_selects_the_s3_storage_backend(tmp_path):
    out = settings_run(
        {"FLEETWATCH_S3_BUCKET": "artifacts", "FLEETWATCH_DATA_DIR": str(tmp_path)},
        "s.STORAGES['artifacts']['BACKEND']",
    )
    assert out.stdout.strip() == "storages.backends.s3.S3Storage"
