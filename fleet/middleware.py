"""Failures of a part, not of the request, answered as what they are.

A database that is restarting or unreachable is a 503 with ``Retry-After`` (agents keep the file
and come back; see ``agents/uploader.py``), and a disk with no room is a 507 — never a 500, which
reads as "this request is broken". Both carry a JSON ``detail`` like every other API error.
"""

from __future__ import annotations

import contextlib
import logging

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import JsonResponse

from ingest.services import NO_SPACE

log = logging.getLogger(__name__)


class UnavailableMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, (OperationalError, InterfaceError)):
            retry_after = settings.FLEETWATCH_RETRY_AFTER_SECONDS
            log.warning(
                "database unavailable for %s %s: %s", request.method, request.path, exception
            )
            response = JsonResponse(
                {
                    "detail": "the database is unavailable (restarting or unreachable): send "
                    f"the request again in {retry_after} seconds"
                },
                status=503,
            )
            response["Retry-After"] = str(retry_after)
            return response
        if isinstance(exception, OSError) and exception.errno in NO_SPACE:
            log.error("no space left for %s %s: %s", request.method, request.path, exception)
            # A body that filled the disk while it was spooled leaves its temporary file open in
            # the upload handler (Django cleans up only uploads it finished): remove it now, not
            # whenever the garbage collector breaks the exception's reference cycle.
            for handler in getattr(request, "_upload_handlers", None) or ():
                # Closing flushes what is buffered, which may fail again with ENOSPC; the
                # temporary file is unlinked all the same.
                with contextlib.suppress(OSError):
                    handler.upload_interrupted()
            response = JsonResponse(
                {
                    "detail": f"the server has no room for this request ({exception.strerror}); "
                    "nothing was stored: send it again later"
                },
                status=507,
            )
            response["Retry-After"] = str(settings.FLEETWATCH_RETRY_AFTER_SECONDS)
            return response
        return None


class QueryTextMiddleware:
    """A NUL in a query parameter is a 400 with the reason. No filter can match it (PostgreSQL
    text cannot hold NUL, and psycopg refuses it with an error that would surface as a 500), so
    nothing is asked of the database."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        query = request.META.get("QUERY_STRING", "")
        if "%00" in query or "\x00" in query:
            bad = sorted(
                {
                    k
                    for k, values in request.GET.lists()
                    if "\x00" in k or any("\x00" in v for v in values)
                }
            )
            if bad:
                return JsonResponse(
                    {
                        "detail": "a query parameter holds a NUL character, which no filter can "
                        f"match: {', '.join(repr(k) for k in bad)}"
                    },
                    status=400,
                )
        return self.get_response(request)


class BodyLengthMiddleware:
    """A request body sent chunked (``Transfer-Encoding: chunked``) with no ``Content-Length``
    is a 411 saying so. WSGI has no standard way to read such a body, and Django reads a body of
    CONTENT_LENGTH bytes: the upload would arrive empty and fail as a misleading "no file". The
    shipped nginx front reads a chunked body whole and passes it on with its length; only a
    client talking to gunicorn directly meets this."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        chunked = "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()
        if chunked and not request.META.get("CONTENT_LENGTH"):
            return JsonResponse(
                {
                    "detail": "the body was sent chunked with no Content-Length, which this "
                    "server cannot read: send the length (curl -F and the agent do), or send "
                    "through the nginx front, which adds it"
                },
                status=411,
            )
        return self.get_response(request)
