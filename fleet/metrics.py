"""``/metrics`` for Prometheus, computed from the database at scrape time.

Every value is read from Postgres (or Redis for the queue) when scraped, by a custom collector
on a registry of its own: any gunicorn worker answers with the same numbers, with no
per-process counters to aggregate (and no multiprocess directory to manage).
"""

from __future__ import annotations

from django.conf import settings
from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from analysis.classify import CULPRITS


def queue_names() -> list[str]:
    queues = getattr(settings, "CELERY_TASK_QUEUES", None) or ()
    return [q.name for q in queues] or [getattr(settings, "CELERY_TASK_DEFAULT_QUEUE", "celery")]


def celery_queue_depth() -> dict[str, int] | None:
    """Messages waiting in each Celery queue (Redis LLEN), or None without a Redis broker."""
    url = getattr(settings, "CELERY_BROKER_URL", "")
    if not url.startswith(("redis://", "rediss://")):
        return None
    import redis

    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        return {queue: int(client.llen(queue)) for queue in queue_names()}
    finally:
        client.close()


class FleetCollector:
    def collect(self):
        from analysis.models import DrainAction, Incident
        from fleet.drain import hosts_health
        from ingest.models import Upload

        now = timezone.now()
        incidents = CounterMetricFamily(
            "fleetwatch_incidents", "Incidents diagnosed, by culprit class", labels=["culprit"]
        )
        counted = dict(Incident.objects.values_list("culprit").annotate(n=Count("id")))
        for culprit in CULPRITS:
            incidents.add_metric([culprit], counted.get(culprit, 0))
        yield incidents

        open_incidents = GaugeMetricFamily(
            "fleetwatch_incidents_open",
            "Incidents not yet resolved, by culprit",
            labels=["culprit"],
        )
        still_open = dict(
            Incident.objects.exclude(status=Incident.Status.RESOLVED)
            .values_list("culprit")
            .annotate(n=Count("id"))
        )
        for culprit in CULPRITS:
            open_incidents.add_metric([culprit], still_open.get(culprit, 0))
        yield open_incidents

        verdicts = GaugeMetricFamily(
            "fleetwatch_hosts", "Hosts by health verdict", labels=["verdict"]
        )
        every = hosts_health(now)
        for verdict in ("ok", "watch", "drain"):
            verdicts.add_metric([verdict], sum(1 for h in every if h.verdict == verdict))
        yield verdicts

        pending = Upload.objects.filter(status__in=[Upload.Status.RECEIVED, Upload.Status.PARSING])
        oldest = pending.aggregate(at=Min("received_at"))["at"]
        yield GaugeMetricFamily(
            "fleetwatch_ingest_lag_seconds",
            "Age of the oldest upload not yet parsed (0 when none waits)",
            value=(now - oldest).total_seconds() if oldest else 0.0,
        )
        uploads = GaugeMetricFamily("fleetwatch_uploads", "Uploads by status", labels=["status"])
        by_status = dict(Upload.objects.values_list("status").annotate(n=Count("id")))
        for status in Upload.Status.values:
            uploads.add_metric([status], by_status.get(status, 0))
        yield uploads
        yield CounterMetricFamily(
            "fleetwatch_parse_failures",
            "Uploads whose parsing failed",
            value=by_status.get(Upload.Status.FAILED, 0),
        )

        drains = CounterMetricFamily(
            "fleetwatch_drain_actions",
            "Drain and resume requests, by outcome",
            labels=["action", "result"],
        )
        for action, result, n in (
            DrainAction.objects.values_list("action", "result").annotate(n=Count("id")).order_by()
        ):
            drains.add_metric([action, result], n)
        yield drains

        depth = celery_queue_depth_safe()
        if depth is not None:
            yield _queue_family(depth)


def _queue_family(depth: dict[str, int]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "fleetwatch_queue_depth", "Tasks waiting in each Celery queue", labels=["queue"]
    )
    for queue, waiting in depth.items():
        family.add_metric([queue], waiting)
    return family


def celery_queue_depth_safe() -> dict[str, int] | None:
    # A broker that is down must not take the whole scrape with it: the gauge goes missing,
    # which Prometheus alerting sees as absent().
    try:
        return celery_queue_depth()
    except Exception:
        return None


def render() -> tuple[bytes, str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return generate_latest(registry), CONTENT_TYPE_LATEST
