"""The shipped nginx front (fleet/deploy/nginx.conf, docker-compose's `proxy`), run for real in
front of gunicorn with one sync worker: clients that send their headers or their upload body
slowly are held by nginx, and the one worker keeps answering everyone else. Without the proxy
(or with request buffering off) a single slow upload holds that worker until gunicorn's own
timeout."""

from __future__ import annotations

import os
import shutil
import socket
import urllib.request
from pathlib import Path

import pytest

from bench._services import Processes, free_port, gunicorn_argv, manage, wait_http

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
CONF = Path(__file__).resolve().parents[2] / "fleet" / "deploy" / "nginx.conf"

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")


def main_conf(tmp: Path, site: Path) -> Path:
    """A whole nginx.conf around the shipped server block, with every path in ``tmp``."""
    for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp / name).mkdir(exist_ok=True)
    temp = " ".join(
        f"{kind}_temp_path {tmp / name};"
        for kind, name in (
            ("client_body", "body"),
            ("proxy", "proxy"),
            ("fastcgi", "fastcgi"),
            ("uwsgi", "uwsgi"),
            ("scgi", "scgi"),
        )
    )
    conf = tmp / "nginx.conf"
    conf.write_text(
        ("user root;\n" if os.geteuid() == 0 else "")
        + f"worker_processes 1;\npid {tmp / 'nginx.pid'};\nerror_log {tmp / 'error.log'} warn;\n"
        + "events { worker_connections 256; }\n"
        + f"http {{ access_log off; {temp} include {site}; }}\n"
    )
    return conf


def test_slow_clients_are_held_by_the_proxy_and_the_one_worker_keeps_answering(tmp_path):
    gunicorn_port, proxy_port = free_port(), free_port()
    site = tmp_path / "fleetwatch.conf"
    text = CONF.read_text()
    assert "server web:8000;" in text and "listen 80;" in text
    site.write_text(
        text.replace("server web:8000;", f"server 127.0.0.1:{gunicorn_port};").replace(
            "listen 80;", f"listen 127.0.0.1:{proxy_port};"
        )
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY"))},
        "DEBUG": "false",
        "SECRET_KEY": "a-test-secret-that-is-not-the-development-one",
        "FLEETWATCH_DATA_DIR": str(tmp_path / "data"),
    }
    manage("migrate", "--noinput", env=env)
    # A real key: an upload the application reads (an unauthenticated one is refused before
    # its body is read, and would hold no worker anyway).
    key = manage("agentkey", "create", "slow-agent", "--scopes", "upload", env=env).split()[-1]
    with Processes(tmp_path / "logs") as processes:
        processes.start("gunicorn", gunicorn_argv(gunicorn_port, workers=1), env)
        processes.start(
            "nginx",
            [NGINX, "-p", str(tmp_path), "-c", str(main_conf(tmp_path, site)), "-g", "daemon off;"],
            env,
        )
        healthz = f"http://127.0.0.1:{proxy_port}/healthz"
        wait_http(healthz, timeout=120, processes=processes)
        slow = []
        try:
            for i in range(4):
                sock = socket.create_connection(("127.0.0.1", proxy_port), timeout=10)
                if i % 2:  # headers that never end
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                else:  # an upload whose body trickles in
                    sock.sendall(
                        b"POST /api/v1/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        + f"Authorization: Bearer {key}\r\n".encode()
                        + b"Content-Type: multipart/form-data; boundary=b\r\n"
                        b"Content-Length: 1048576\r\n\r\n--b\r\n"
                        b'Content-Disposition: form-data; name="host"\r\n\r\ngpu-1\r\n'
                        b"--b\r\n" + b"x" * 1024
                    )
                slow.append(sock)
            # Every other client is answered by the one worker while those four hang on.
            for _ in range(5):
                with urllib.request.urlopen(healthz, timeout=30) as answer:
                    assert answer.status == 200
        finally:
            for sock in slow:
                sock.close()
