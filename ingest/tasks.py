"""Celery tasks for ingest: thin, idempotent, taking ids."""

from __future__ import annotations

from celery import shared_task
from django.db import OperationalError

from ingest import services
from ingest.models import Upload


@shared_task(
    bind=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    retry_jitter=True,
    max_retries=8,
)
def upload_parse(self, upload_id: int) -> None:
    if not Upload.objects.filter(pk=upload_id).exists():
        return
    try:
        services.upload_parse(upload_id)
    except OperationalError:
        # Transient database trouble: release the claim so the retry can take it again.
        Upload.objects.filter(pk=upload_id, status=Upload.Status.PARSING).update(
            status=Upload.Status.RECEIVED
        )
        raise
    except Exception as exc:
        # Anything else is a property of this input or a bug: record it, never loop on it.
        services.upload_mark_failed(upload_id, f"parse failed: {type(exc).__name__}: {exc}")
        raise
