"""Agent keys, uploaded artifacts and the events parsed from them."""

from __future__ import annotations

from django.core.files.storage import storages
from django.db import models
from django.utils import timezone
from rest_framework_api_key.models import AbstractAPIKey

from fleet.models import Attempt, Host, Job


class Scope(models.TextChoices):
    UPLOAD = "upload", "upload artifacts (agents)"
    READ = "read", "read incidents, hosts and jobs (schedulers, dashboards)"
    OPERATE = "operate", "drain and repair hosts (operators)"


class AgentKey(AbstractAPIKey):
    """An API key. Only its hash is stored (djangorestframework-api-key); revocation is final."""

    scopes = models.JSONField(default=list)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta(AbstractAPIKey.Meta):
        verbose_name = "agent key"

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes


def artifact_storage():
    """The configured artifact store (local disk by default, S3-compatible in production)."""
    return storages["artifacts"]


class Upload(models.Model):
    class Kind(models.TextChoices):
        LOG = "log", "text log"
        FR_DUMP = "fr_dump", "Flight Recorder dump"
        TRACE = "trace", "profiler trace"
        HW_STATS = "hw_stats", "hardware stats"
        UNKNOWN = "unknown", "unknown"

    class Status(models.TextChoices):
        RECEIVED = "received"
        PARSING = "parsing"
        PARSED = "parsed"
        FAILED = "failed"

    sha256 = models.CharField(max_length=64)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.LOG)
    size = models.BigIntegerField()
    compressed = models.BooleanField(default=False)
    filename = models.CharField(max_length=255, blank=True)
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="uploads")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="uploads")
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="uploads")
    rank = models.PositiveIntegerField(null=True, blank=True)
    # The blob lives in the artifact storage backend; the row keeps only its name.
    blob = models.FileField(upload_to="uploads/", max_length=255, storage=artifact_storage)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RECEIVED)
    error = models.TextField(blank=True)
    key = models.ForeignKey(AgentKey, on_delete=models.SET_NULL, null=True, blank=True)
    received_at = models.DateTimeField(default=timezone.now)
    parsed_at = models.DateTimeField(null=True, blank=True)
    line_count = models.BigIntegerField(null=True, blank=True)
    # [[line, offset], …]: where some lines start in the decompressed artifact (one per 4 MiB
    # parsed), so the artifact page seeks near a line instead of reading every line before it.
    line_index = models.JSONField(default=list, db_default=[], blank=True)
    event_count = models.PositiveIntegerField(default=0)
    ranks = models.JSONField(default=list)  # every rank the parsed content named
    # Parse runs started from a fresh or re-delivered message. A run that never reports back
    # (its worker was killed: by the time limit, out of memory, a crash) leaves its count, and
    # an upload that has taken MAX_PARSE_TRIES workers down is failed instead of tried again.
    parse_tries = models.PositiveSmallIntegerField(default=0)
    # When the sweep last re-published this upload's parse: a message it sent may still be
    # queued behind a backlog, so it is not sent again until FLEETWATCH_SWEEP_REPUBLISH_SECONDS.
    published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-received_at"]
        constraints = [
            # The natural key that makes a retried upload a no-op: the same bytes from the same
            # host for the same attempt and rank. The same bytes for another attempt or rank
            # (a restarted job printing the same lines) are evidence of that one.
            models.UniqueConstraint(
                fields=["sha256", "host", "job", "attempt", "rank"],
                condition=models.Q(rank__isnull=False),
                name="upload_unique_content_rank",
            ),
            models.UniqueConstraint(
                fields=["sha256", "host", "job", "attempt"],
                condition=models.Q(rank__isnull=True),
                name="upload_unique_content_no_rank",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "received_at"]),
            models.Index(fields=["attempt", "status"]),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.sha256[:12]} from {self.host_id}"


class Event(models.Model):
    """One typed event from ``ingest.parsers``; ``attrs`` holds the kind-specific fields."""

    upload = models.ForeignKey(Upload, on_delete=models.CASCADE, related_name="events")
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=40)
    rank = models.IntegerField(null=True, blank=True)
    line = models.PositiveIntegerField()
    text = models.TextField()
    attrs = models.JSONField(default=dict)

    class Meta:
        ordering = ["upload", "line"]
        indexes = [models.Index(fields=["attempt", "kind"])]

    def __str__(self) -> str:
        return f"{self.kind} at line {self.line}"


class ArtifactRequest(models.Model):
    """The server asks a host's agent for an artifact it kept locally: today, the raw profiler
    trace of a suspect rank whose summary was uploaded. Agents poll for their host's requests."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="artifact_requests")
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="artifact_requests")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="artifact_requests")
    rank = models.IntegerField(null=True, blank=True)
    kind = models.CharField(max_length=16, default=Upload.Kind.TRACE)
    reason = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    fulfilled_at = models.DateTimeField(null=True, blank=True)
    upload = models.ForeignKey(Upload, on_delete=models.SET_NULL, null=True, blank=True)
    # The summary the server read: the agent sends the raw trace it summarised under this name,
    # for this job, attempt and rank, and nothing else.
    source_file = models.CharField(max_length=255, blank=True)

    class Outcome(models.TextChoices):
        OPEN = "", "open"
        SENT = "sent", "sent"
        NONE = "none", "none"  # the agent no longer has it (pruned, other host)

    outcome = models.CharField(max_length=8, choices=Outcome.choices, default="", blank=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["attempt", "host", "rank", "kind"], name="artifact_request_unique"
            )
        ]
        indexes = [models.Index(fields=["host", "fulfilled_at"])]

    def __str__(self) -> str:
        return f"{self.kind} of rank {self.rank} from {self.host_id} for {self.attempt_id}"
