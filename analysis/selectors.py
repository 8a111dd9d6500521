"""Reads for incidents, shared by the UI and reports."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from analysis.models import Incident
from ingest.models import Upload


def incident_list(
    *, culprit: str = "", status: str = "", job: str = "", host: str = ""
) -> QuerySet:
    qs = Incident.objects.select_related("job", "attempt").order_by("-opened_at")
    if culprit:
        qs = qs.filter(culprit=culprit)
    if status:
        qs = qs.filter(status=status)
    if job:
        qs = qs.filter(job__external_id=job)
    if host:
        qs = qs.filter(attempt__uploads__host__hostname=host).distinct()
    return qs


def incident_get(pk: int) -> Incident:
    return (
        Incident.objects.select_related("job", "attempt")
        .prefetch_related(
            Prefetch(
                "attempt__uploads",
                queryset=Upload.objects.select_related("host").order_by("rank", "id"),
            )
        )
        .get(pk=pk)
    )
