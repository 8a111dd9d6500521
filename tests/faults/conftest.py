"""Fixtures for fault tests: a PostgreSQL cluster of their own (one per session, a fresh database
per test cloned from a migrated template), and a ``stack`` that starts Redis, gunicorn and Celery
workers for one test and stops every one of them afterwards.

These tests bring their own services, so they run the same on both passes of ``make test``."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from .stack import (
    Database,
    Gunicorn,
    Postgres,
    Process,
    Redis,
    Unavailable,
    Worker,
    app_env,
    manage,
    postgres_bindir,
)

TEMPLATE = "fleetwatch_template"
_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    bindir = postgres_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    try:
        cluster = Postgres(bindir)
    except Unavailable as exc:
        pytest.skip(f"cannot start a PostgreSQL cluster of the tests' own: {exc}")
    try:
        cluster.execute(f"CREATE DATABASE {TEMPLATE}")
        data_dir = tmp_path_factory.mktemp("template-data")
        env = app_env(DATABASE_URL=cluster.url(TEMPLATE), FLEETWATCH_DATA_DIR=str(data_dir))
        manage(env, "migrate", "--noinput", "-v", "0")
        key = manage(env, "agentkey", "create", "fault-tests", "--scopes", "upload,read")
        cluster.key = key.strip().splitlines()[-1]
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def database(postgres) -> Database:
    name = f"faults_{next(_numbers)}"
    if not postgres.running():
        postgres.start()  # a test that stopped it failed before starting it again
    postgres.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    return Database(postgres, name)


class Stack:
    """What one test started, stopped in reverse order when it ends (pass or fail)."""

    def __init__(self, database: Database, tmp_path: Path):
        self.database = database
        self.key: str = database.cluster.key
        self.tmp = tmp_path
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.data_dir = tmp_path / "data"
        self.data_dir.mkdir()
        self.started: list[Process | Redis] = []

    def env(self, broker: Redis | None = None, **overrides: str | None) -> dict[str, str]:
        base = {
            "DATABASE_URL": self.database.url,
            "FLEETWATCH_DATA_DIR": str(self.data_dir),
            "CELERY_BROKER_URL": broker.url(0) if broker else None,
            # Production shape: the cache (rate limits) lives on the broker's Redis too.
            "REDIS_URL": broker.url(1) if broker else None,
            "FLEETWATCH_SETTLE_SECONDS": "0.5",
            "DB_CONN_MAX_AGE": "60",
        }
        return app_env(**{**base, **overrides})

    def redis(self) -> Redis:
        server = Redis(self.logs)
        self.started.append(server)
        return server

    def gunicorn(self, env: dict[str, str], workers: int = 2) -> Gunicorn:
        server = Gunicorn(env, self.logs, workers=workers)
        self.started.append(server)
        return server

    def worker(self, name: str, env: dict[str, str], **options) -> Worker:
        worker = Worker(name, env, self.logs, **options)
        self.started.append(worker)
        return worker

    def logs_text(self) -> str:
        return "\n".join(
            p.tail() for p in self.started if isinstance(p, Process) and p.log_path.exists()
        )

    def stop_all(self) -> None:
        for part in reversed(self.started):
            part.stop()


@pytest.fixture
def stack(database, tmp_path):
    started = Stack(database, tmp_path)
    try:
        yield started
    finally:
        started.stop_all()
