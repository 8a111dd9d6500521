"""Real services for the benchmarks: scratch PostgreSQL databases, a Redis db number, and the
processes the bench starts (gunicorn, Celery workers), each stopped by its own process group.

Everything here is loopback only and bounded in time: every wait has a deadline, and every
process started is stopped on the way out, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
# The machine's PostgreSQL (trust auth; `test` is the admin database scratch ones are made from).
PG_ADMIN = "postgres://postgres@127.0.0.1:5432/test"
REDIS = "redis://127.0.0.1:6379"


def postgres_database(name: str, *, admin: str = PG_ADMIN) -> str | None:
    """Create a scratch database; None when PostgreSQL is not reachable here."""
    try:
        import psycopg

        with psycopg.connect(admin, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
    except Exception:
        return None
    return admin.rsplit("/", 1)[0] + f"/{name}"


def drop_database(name: str, *, admin: str = PG_ADMIN) -> None:
    try:
        import psycopg

        with psycopg.connect(admin, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except Exception as exc:  # a leftover scratch database is harmless; say so
        print(f"bench: could not drop {name}: {exc}", file=sys.stderr)


def redis_flush(url: str) -> bool:
    """FLUSHDB on the db number of ``url`` (only that one); False when Redis is not reachable."""
    try:
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=10)
        client.flushdb()
        client.close()
    except Exception:
        return False
    return True


def redis_free_db(base: str = REDIS, prefer: tuple[int, ...] = (13, 12, 11, 10, 9)) -> str | None:
    """The URL of the first db number in ``prefer`` that is empty and that no client has
    selected: the bench's tasks must not be consumed (or purged) by someone else's worker on
    the shared Redis. None when Redis is unreachable or every one is taken."""
    try:
        import redis

        client = redis.Redis.from_url(f"{base}/0", socket_connect_timeout=3, socket_timeout=10)
        taken = {int(c.get("db", 0)) for c in client.client_list()}
        sizes = client.info("keyspace")
        client.close()
    except Exception:
        return None
    for db in prefer:
        if db not in taken and f"db{db}" not in sizes:
            return f"{base}/{db}"
    return None


def redis_clients(url: str) -> int:
    """How many connections have selected the db number of ``url``."""
    import redis

    db = int(urlsplit(url).path.lstrip("/") or 0)
    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=10)
    try:
        return sum(1 for c in client.client_list() if int(c.get("db", 0)) == db) - 1
    finally:
        client.close()


def exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so every ``finally`` stops its processes and drops its
    scratch database instead of leaving them behind."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def gunicorn_argv(port: int, *, workers: int, timeout: int = 120, extra: tuple = ()) -> list[str]:
    """The web tier as deployments run it (gunicorn's sync workers), on a loopback port: one
    command line for the bench, the fault tests and the proxy test."""
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "fleet.wsgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
        "--timeout",
        str(timeout),
        *extra,
    ]


def manage(*args: str, env: dict, timeout: float = 300) -> str:
    """``manage.py ARGS`` in a child process; its standard output."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


class Processes:
    """Child processes, each the leader of its own process group, stopped together on exit:
    SIGTERM to the group (gunicorn's workers, Celery's pool children), SIGKILL after a grace."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.started: list[tuple[str, subprocess.Popen, object]] = []

    def start(self, name: str, argv: list[str], env: dict) -> subprocess.Popen:
        self.logdir.mkdir(parents=True, exist_ok=True)
        log = (self.logdir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started.append((name, proc, log))
        return proc

    def log_text(self, name: str, tail: int = 4000) -> str:
        path = self.logdir / f"{name}.log"
        try:
            return path.read_text(encoding="utf-8", errors="replace")[-tail:]
        except OSError:
            return ""

    def check_alive(self) -> None:
        for name, proc, _ in self.started:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_text(name)}")

    def wait_for_log(self, name: str, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.log_text(name, tail=1 << 20):
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not ready after {timeout:.0f}s:\n{self.log_text(name)}")
            time.sleep(0.1)

    def stop(self, grace: float = 20.0) -> None:
        for _, proc, _ in self.started:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for _, proc, log in self.started:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            log.close()
        self.started.clear()

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_http(url: str, timeout: float, processes: Processes | None = None) -> None:
    """Until ``url`` answers 200 (loopback only)."""
    if urlsplit(url).hostname not in ("127.0.0.1", "localhost"):
        raise ValueError(f"bench talks to loopback only, not {url}")
    deadline = time.monotonic() + timeout
    while True:
        if processes is not None:
            processes.check_alive()
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310 (loopback)
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer 200 within {timeout:.0f}s")
        time.sleep(0.2)
