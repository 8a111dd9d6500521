"""Real parts for fault tests, each started on a free loopback port and stopped by the test.

A PostgreSQL cluster of the tests' own (initdb in a temporary directory), a Redis server, gunicorn
and Celery workers as subprocesses of this checkout. The shared services on 5432 and 6379 are
never touched: a fault test stops and restarts only what it started here.

No Django is imported: the tests read the database with psycopg, as an operator would.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import urllib3

from bench._services import free_port, gunicorn_argv

ROOT = Path(__file__).resolve().parents[2]
# What a subprocess must not inherit from the test run (the services pass sets these).
INHERITED = ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")


def wait_until(predicate: Callable[[], object], timeout: float, what: str, every=0.05):
    """Poll ``predicate`` until it is truthy; fail saying what never happened."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def app_env(**overrides: str | None) -> dict[str, str]:
    """The environment of a Fleetwatch subprocess: this one's, minus service URLs and FLEETWATCH_
    settings, plus ``overrides`` (None removes a variable)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in INHERITED and not name.startswith("FLEETWATCH_")
    }
    env.update({"PYTHONPATH": str(ROOT), "LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"})
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


class Process:
    """A subprocess in its own session (so its children can be killed with it), logging to a
    file that failures quote."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def tail(self, chars: int = 4000) -> str:
        return f"--- {self.name} log ---\n{self.log()[-chars:]}"

    def assert_alive(self) -> None:
        assert self.alive(), f"{self.name} exited with {self.proc.returncode}\n{self.tail()}"

    def kill_group(self) -> None:
        """SIGKILL the process and everything it started: a machine losing power, to it."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._reap_group()

    def stop(self, timeout: float = 20) -> None:
        if self.alive():
            with _suppress_gone():
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with _suppress_gone():
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self._reap_group()
        self._log.close()

    def _reap_group(self) -> None:
        # Children that outlived their parent (a pool child of a killed worker) go too.
        with _suppress_gone():
            os.killpg(self.proc.pid, signal.SIGKILL)


class _suppress_gone:
    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        return kind is not None and issubclass(kind, ProcessLookupError | PermissionError)


# --- PostgreSQL ----------------------------------------------------------------------------------


def postgres_bindir() -> Path | None:
    """Where initdb and pg_ctl live: pg_config's answer if it holds them, else the newest
    /usr/lib/postgresql/*/bin, else PATH."""
    candidates: list[Path] = []
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        if out.returncode == 0:
            candidates.append(Path(out.stdout.strip()))
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: [int(x) for x in Path(p).parent.name.split(".") if x.isdigit()],
        reverse=True,
    )
    candidates += [Path(p) for p in versions]
    if shutil.which("initdb"):
        candidates.append(Path(shutil.which("initdb")).parent)
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "pg_ctl").exists():
            return directory
    return None


INITDB_ARGS = ("-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")


class Unavailable(RuntimeError):
    """This machine cannot run a throwaway PostgreSQL (the test is skipped, saying why)."""


class Postgres:
    """A throwaway cluster: ``initdb`` in a temporary directory, listening on 127.0.0.1 only.
    As root the server runs as the ``postgres`` user (PostgreSQL refuses to run as root)."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            # PostgreSQL refuses to run as root: run it as the postgres user, if there is one.
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise Unavailable("running as root and there is no postgres user") from None
            if not shutil.which("runuser"):
                raise Unavailable("running as root without runuser to become postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.root = Path(tempfile.mkdtemp(prefix="fleetwatch-pg-"))
        self.data = self.root / "data"
        if self.as_user:
            shutil.chown(self.root, user="postgres")
        try:
            self._run("initdb", "-D", str(self.data), *INITDB_ARGS)
            self.start()
        except BaseException:
            self.destroy()
            raise

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.as_user, str(self.bindir / tool), *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c full_page_writes=off -c max_connections=60"
        )
        log = str(self.root / "server.log")
        out = self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            log,
            "-w",
            "-t",
            "60",
            "start",
            check=False,
        )
        assert out.returncode == 0, f"pg_ctl start failed: {out.stdout}{out.stderr}\n{self.log()}"

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop", check=False)

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def execute(self, sql: str, database: str = "postgres") -> None:
        with psycopg.connect(self.url(database), autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql)

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class Database:
    """One database of the cluster, read with psycopg."""

    def __init__(self, cluster: Postgres, name: str):
        self.cluster = cluster
        self.name = name
        self.url = cluster.url(name)

    def rows(self, sql: str, *params) -> list[tuple]:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            return conn.execute(sql, params).fetchall()

    def value(self, sql: str, *params):
        rows = self.rows(sql, *params)
        return rows[0][0] if rows else None


def manage(env: dict[str, str], *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"manage.py {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


# --- Redis ---------------------------------------------------------------------------------------


class Redis:
    """A Redis server with no persistence: stopping it loses every queued message, which is
    the harshest broker outage (the sweeper must recover everything from the database)."""

    def __init__(self, log_dir: Path, port: int | None = None):
        if not shutil.which("redis-server"):
            pytest.skip("redis-server is not installed")
        self.port = port or free_port()
        self.log_dir = log_dir
        self.process: Process | None = None
        self.start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        argv = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ]
        self.process = Process(f"redis-{self.port}", argv, dict(os.environ), self.log_dir)
        wait_until(self.ping, 20, f"redis on port {self.port}")

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def client(self, db: int = 0):
        import redis

        return redis.Redis(port=self.port, db=db, socket_timeout=5)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


# --- Fleetwatch processes -----------------------------------------------------------------------


class Gunicorn(Process):
    def __init__(self, env: dict[str, str], log_dir: Path, workers: int = 2):
        self.port = free_port()
        argv = gunicorn_argv(self.port, workers=workers, extra=("--graceful-timeout", "5"))
        super().__init__(f"gunicorn-{self.port}", argv, env, log_dir)
        self.url = f"http://127.0.0.1:{self.port}"
        self.http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(60))
        wait_until(self._answers, 60, f"gunicorn on port {self.port}")

    def _answers(self) -> bool:
        self.assert_alive()
        try:
            self.http.request("GET", self.url + "/healthz", timeout=2)
        except urllib3.exceptions.HTTPError:
            return False
        return True

    def upload(self, key: str, body: bytes, *, filename: str, host: str, job: str, rank=None):
        fields = {"host": host, "job": job, "file": (filename, body)}
        if rank is not None:
            fields["rank"] = str(rank)
        return self.http.request(
            "POST",
            self.url + "/api/v1/uploads",
            fields=fields,
            headers={"Authorization": f"Bearer {key}"},
        )

    def accepted(self, key: str, body: bytes, **fields) -> int:
        """``upload``, which must be answered 202: the upload's id."""
        response = self.upload(key, body, **fields)
        assert response.status == 202, (json_of(response), self.tail())
        return json_of(response)["id"]

    def accepted_logs(self, key: str, scenario, ranks) -> list[int]:
        """Each of ``ranks``' log of a ``fleet.demo`` scenario, each answered 202: their ids."""
        from fleet.demo import rank_log  # plain Python, no Django

        return [
            self.accepted(
                key,
                rank_log(scenario, rank).encode(),
                filename=f"rank{rank}.log",
                host=scenario.host_of(rank),
                job=scenario.job,
                rank=rank,
            )
            for rank in ranks
        ]


def json_of(response) -> dict:
    try:
        return json.loads(response.data or b"{}")
    except ValueError:
        return {"not json": response.data[:2000].decode("utf-8", "replace")}


class Worker(Process):
    """``celery -A fleet worker`` on the given queues; ``beat`` embeds the beat scheduler."""

    def __init__(
        self,
        name: str,
        env: dict[str, str],
        log_dir: Path,
        *,
        queues: str = "ingest,analysis",
        pool: str = "solo",
        beat: bool = False,
    ):
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "fleet",
            "worker",
            "-Q",
            queues,
            f"--pool={pool}",
            "--concurrency=1",
            "--loglevel=INFO",
            "-n",
            f"{name}@%h",
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
        ]
        if beat:
            argv += ["--beat", "--schedule", str(log_dir / f"{name}-beat-schedule")]
        super().__init__(name, argv, env, log_dir)

    def wait_ready(self, timeout: float = 60) -> None:
        def ready():
            self.assert_alive()
            return " ready." in self.log()

        wait_until(ready, timeout, f"worker {self.name} to be ready", every=0.2)
