"""``/metrics`` for Prometheus, computed from the database at scrape time.

Every value is read from Postgres (or the broker for the queue) when scraped, by a custom
collector on a registry of its own: any gunicorn worker answers with the same numbers, with no
per-process counters to aggregate (and no multiprocess directory to manage).

Counters count rows that are only ever added (incidents opened, verdicts recorded, drain
requests, uploads that failed): a reclassification never lowers one, which Prometheus would
read as a reset. Current counts (incidents by their culprit now, hosts by verdict, uploads by
status) are gauges. Each host has its verdict and score as series of its own, so an alert can
name the host.
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
    """Messages waiting in each Celery queue: Redis LLEN, or an AMQP broker's own count (a
    passive queue declare); with no broker (the embedded default, eager tasks), the tasks this
    process holds for their countdown (the settle window) under ``in-process``."""
    url = getattr(settings, "CELERY_BROKER_URL", "") or ""
    if getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False) or url.startswith("memory://"):
        from fleet.celery import eager_countdowns

        return {"in-process": eager_countdowns.pending()}
    if url.startswith(("redis://", "rediss://")):
        import redis

        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            return {queue: int(client.llen(queue)) for queue in queue_names()}
        finally:
            client.close()
    from kombu import Connection

    with Connection(url, connect_timeout=2) as connection:
        channel = connection.default_channel
        depth = {}
        for queue in queue_names():
            try:
                depth[queue] = int(channel.queue_declare(queue, passive=True).message_count)
            except connection.channel_errors:  # not declared yet: no worker ever started
                channel = connection.channel()
                depth[queue] = 0
        return depth


class FleetCollector:
    def collect(self):
        from analysis.models import DrainAction, Incident, IncidentRevision
        from fleet.drain import hosts_health_shared
        from ingest.models import Upload

        now = timezone.now()
        yield CounterMetricFamily(
            "fleetwatch_incidents", "Incidents opened", value=Incident.objects.count()
        )
        yield _per_culprit(
            CounterMetricFamily(
                "fleetwatch_verdicts",
                "Verdicts recorded (an incident's first and each revision that changed it), by "
                "the culprit they named",
                labels=["culprit"],
            ),
            IncidentRevision.objects.all(),
        )
        yield _per_culprit(
            GaugeMetricFamily(
                "fleetwatch_incidents_by_culprit",
                "Incidents by the culprit of their current verdict",
                labels=["culprit"],
            ),
            Incident.objects.all(),
        )
        yield _per_culprit(
            GaugeMetricFamily(
                "fleetwatch_incidents_open",
                "Incidents not yet resolved, by culprit",
                labels=["culprit"],
            ),
            Incident.objects.exclude(status=Incident.Status.RESOLVED),
        )

        hosts = GaugeMetricFamily("fleetwatch_hosts", "Hosts by health verdict", labels=["verdict"])
        every = hosts_health_shared(now)
        for verdict in ("ok", "watch", "drain"):
            hosts.add_metric([verdict], sum(1 for h in every if h.verdict == verdict))
        yield hosts
        host_verdict = GaugeMetricFamily(
            "fleetwatch_host_verdict",
            "1 for each host's current health verdict (ok, watch, drain)",
            labels=["host", "verdict"],
        )
        host_score = GaugeMetricFamily(
            "fleetwatch_host_score",
            "Each host's fleet-memory score (how far its implications exceed the fleet's rate)",
            labels=["host"],
        )
        for health in every:
            host_verdict.add_metric([health.hostname, health.verdict], 1)
            host_score.add_metric([health.hostname], health.score)
        yield host_verdict
        yield host_score

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


def _per_culprit(family, rows):
    """``family`` with one sample per culprit class: how many of ``rows`` name it (0 for none)."""
    counted = dict(rows.values_list("culprit").annotate(n=Count("id")).order_by())
    for culprit in CULPRITS:
        family.add_metric([culprit], counted.get(culprit, 0))
    return family


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
