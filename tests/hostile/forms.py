"""Multipart bodies built byte by byte, for what Django's test client will not send: file names
with ``../``, NUL or invalid UTF-8, thousands of fields, several files."""

from __future__ import annotations

BOUNDARY = b"fleetwatch-hostile-boundary"


def field(name: bytes | str, value: bytes | str) -> tuple[bytes, bytes]:
    name = name.encode() if isinstance(name, str) else name
    value = value.encode() if isinstance(value, str) else value
    return b'Content-Disposition: form-data; name="' + name + b'"', value


def file_part(filename: bytes | str, content: bytes, name: bytes = b"file") -> tuple[bytes, bytes]:
    filename = filename.encode() if isinstance(filename, str) else filename
    disposition = b'Content-Disposition: form-data; name="' + name + b'"; filename="' + filename
    return disposition + b'"\r\nContent-Type: application/octet-stream', content


def multipart(parts: list[tuple[bytes, bytes]]) -> bytes:
    body = b""
    for headers, value in parts:
        body += b"--" + BOUNDARY + b"\r\n" + headers + b"\r\n\r\n" + value + b"\r\n"
    return body + b"--" + BOUNDARY + b"--\r\n"


def post_multipart(client, key: str, parts, path: str = "/api/v1/uploads"):
    """POST a hand-built multipart body with a bearer key, as an agent's HTTP client would."""
    return client.generic(
        "POST",
        path,
        multipart(parts),
        content_type=f"multipart/form-data; boundary={BOUNDARY.decode()}",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )


def upload_form(content: bytes, filename: str | bytes = "rank0.log", **fields) -> list:
    """The parts of an ordinary upload: the file, then ``host``, ``job`` and any other field."""
    fields = {"host": "gpu-001", "job": "job-hostile", **fields}
    return [file_part(filename, content), *(field(k, str(v)) for k, v in fields.items())]
