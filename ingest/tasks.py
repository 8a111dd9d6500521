"""Celery tasks for ingest: thin, idempotent, taking ids. They run on the ``ingest`` queue."""

from __future__ import annotations

import contextlib

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded
from django.conf import settings

from fleet.celery import DATABASE_TRANSIENT, redelivered, retry_countdown
from ingest import services
from ingest.models import Upload


class ParseTask(Task):
    def on_failure(self, exc, task_id, args, kwargs, einfo):
        # Celery calls this in the worker's main process when it killed the pool child at the
        # hard time limit (the child could not run our handler): the message is acknowledged,
        # so the upload is failed here, saying why.
        if isinstance(exc, TimeLimitExceeded):
            upload_id = kwargs.get("upload_id", args[0] if args else None)
            services.upload_mark_failed(
                upload_id,
                f"the parse was stopped after {self.time_limit} s (FLEETWATCH_PARSE_TIME_LIMIT) "
                "where it could not be interrupted; the artifact is kept",
            )


# A parse past its soft limit is failed with the reason. One stuck where Python cannot interrupt
# it (a pickle built to make the unpickler hash for hours) is killed at the hard limit, 5 s
# later. A run that takes its worker down otherwise (out of memory) is re-delivered, until
# services.MAX_PARSE_TRIES runs have died that way.
@shared_task(
    base=ParseTask,
    bind=True,
    max_retries=8,
    soft_time_limit=settings.FLEETWATCH_PARSE_TIME_LIMIT,
    time_limit=settings.FLEETWATCH_PARSE_TIME_LIMIT + 5,
)
def upload_parse(self, upload_id: int, takeover: bool = False, retry: bool = False) -> None:
    try:
        # A row that is gone is not claimed: the parse returns quietly.
        services.upload_parse(upload_id, takeover=takeover or redelivered(self), retry=retry)
    except DATABASE_TRANSIENT as exc:
        # Give the claim back if the database lets us. Either way the retry may take it over:
        # this run held it, and a claim left behind would otherwise wait out its lease.
        with contextlib.suppress(*DATABASE_TRANSIENT):
            Upload.objects.filter(pk=upload_id, status=Upload.Status.PARSING).update(
                status=Upload.Status.RECEIVED
            )
        raise self.retry(
            exc=exc,
            kwargs={"upload_id": upload_id, "retry": True},
            countdown=retry_countdown(self),
        ) from exc
    except SoftTimeLimitExceeded:
        services.upload_mark_failed(
            upload_id,
            f"the parse ran past its {settings.FLEETWATCH_PARSE_TIME_LIMIT} s limit "
            "(FLEETWATCH_PARSE_TIME_LIMIT); the artifact is kept",
        )
        raise
    except Exception as exc:
        # Anything else is a property of this input or a bug: record it, never loop on it.
        services.upload_mark_failed(upload_id, f"parse failed: {type(exc).__name__}: {exc}")
        raise


@shared_task(autoretry_for=DATABASE_TRANSIENT, retry_backoff=True, max_retries=3)
def uploads_sweep() -> None:
    """Beat (FLEETWATCH_SWEEP_SECONDS) and every worker start: re-enqueue work left behind."""
    services.uploads_sweep()
