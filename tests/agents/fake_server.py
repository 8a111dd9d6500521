"""A stand-in for the upload API on 127.0.0.1 for durability tests: idempotent on the same
bytes for the same host and job like the real one, and able to fail on purpose."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeServer:
    def __init__(self, *, delay_s: float = 0.0, port: int = 0):
        self.accepted: dict[tuple, int] = {}  # (host, job, sha256) -> id
        self.duplicates = 0
        self.requests = 0
        self.fail_next: list[tuple[int, dict]] = []  # (status, headers) answered first
        self.delay_s = delay_s
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with server.lock:
                    server.requests += 1
                    failure = server.fail_next.pop(0) if server.fail_next else None
                if failure:
                    status, headers = failure
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    return
                if server.delay_s:
                    time.sleep(server.delay_s)
                fields = parse_multipart(body, self.headers.get("Content-Type", ""))
                key = (
                    fields.get("host"),
                    fields.get("job"),
                    hashlib.sha256(fields.get("file", b"")).hexdigest(),
                )
                with server.lock:
                    duplicate = key in server.accepted
                    if duplicate:
                        server.duplicates += 1
                    else:
                        server.accepted[key] = len(server.accepted) + 1
                    answer = {
                        "id": server.accepted[key],
                        "status": "received",
                        "duplicate": duplicate,
                    }
                payload = json.dumps(answer).encode()
                self.send_response(202)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def parse_multipart(body: bytes, content_type: str) -> dict:
    boundary = content_type.split("boundary=")[-1].encode()
    fields = {}
    for part in body.split(b"--" + boundary):
        head, _, value = part.partition(b"\r\n\r\n")
        if b'name="' not in head:
            continue
        name = head.split(b'name="')[1].split(b'"')[0].decode()
        value = value.removesuffix(b"\r\n")
        fields[name] = value if name == "file" else value.decode()
    return fields
