"""The fleet inventory: hosts and their GPUs, jobs, attempts and where each rank ran."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Host(models.Model):
    hostname = models.CharField(max_length=253, unique=True)
    rack = models.CharField(max_length=100, blank=True)
    gpu_model = models.CharField(max_length=100, blank=True)
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["hostname"]

    def __str__(self) -> str:
        return self.hostname


class Gpu(models.Model):
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveIntegerField(null=True, blank=True)
    uuid = models.CharField(max_length=64, blank=True)
    bus_id = models.CharField(max_length=32, blank=True)  # PCI bus id, e.g. 0000:3b:00.0
    model = models.CharField(max_length=100, blank=True)

    class Meta:
        ordering = ["host", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["host", "bus_id"],
                name="gpu_unique_bus_per_host",
                condition=~models.Q(bus_id=""),
            )
        ]

    def __str__(self) -> str:
        return f"{self.host}:{self.bus_id or self.index}"


class Job(models.Model):
    """A training job as the scheduler names it (Slurm job id, Kubernetes job, elastic run id)."""

    external_id = models.CharField(max_length=255, unique=True)
    name = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.external_id


class Attempt(models.Model):
    """One run of a job; a restart is a new attempt. An incident is one failed attempt."""

    class Status(models.TextChoices):
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        UNKNOWN = "unknown"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.UNKNOWN)
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    world_size = models.PositiveIntegerField(null=True, blank=True)
    # What the job ran with, as agents and schedulers report it: NCCL_*/TORCH_* variables,
    # parallelism degrees, data loader settings; and software versions (torch, nccl, cuda,
    # driver). Fleet memory contrasts these between failed and healthy attempts.
    config = models.JSONField(default=dict, blank=True)
    versions = models.JSONField(default=dict, blank=True)
    # Set when an upload of this attempt finished parsing; classification waits for it to settle.
    last_parsed_at = models.DateTimeField(null=True, blank=True)
    # When the last classification that finished began (the state of the uploads it read).
    classified_at = models.DateTimeField(null=True, blank=True)
    # A classification holding the attempt (conditional update) so two workers never classify
    # at once; one older than FLEETWATCH_CLASSIFY_LEASE_SECONDS died with its worker.
    classify_claimed_at = models.DateTimeField(null=True, blank=True)
    # When the sweep last re-published its classification (see Upload.published_at).
    classify_published_at = models.DateTimeField(null=True, blank=True)
    # Classification runs begun since the last that finished: one that keeps taking its worker
    # down (memory, the time limit) stops at MAX_CLASSIFY_TRIES with classify_error saying so,
    # instead of killing a worker per sweep for ever.
    # Database defaults as well: rows written with raw SQL (the load bench's COPY) name only the
    # columns they know.
    classify_tries = models.PositiveSmallIntegerField(default=0, db_default=0)
    classify_error = models.TextField(blank=True, default="", db_default="")

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="attempt_unique_per_job")
        ]

    def __str__(self) -> str:
        return f"{self.job}#{self.number}"


class RankPlacement(models.Model):
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="placements")
    rank = models.PositiveIntegerField()
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="placements")
    gpu = models.ForeignKey(Gpu, on_delete=models.SET_NULL, null=True, blank=True)
    local_rank = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["attempt", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "rank"], name="placement_unique_rank")
        ]

    def __str__(self) -> str:
        return f"{self.attempt} rank {self.rank} on {self.host}"


# --- outgoing notifications ---------------------------------------------------------------------


def notification_secret() -> str:
    """A fresh signing secret: every JSON and chat delivery is signed (``fleet.notify``)."""
    import secrets

    return secrets.token_hex(32)


# What a notification can be about (fleet.notify sends them); a destination may take a subset.
EVENTS = ("host_drain", "culprit_flagged", "regression", "ingest_failing", "test")


class NotificationDestination(models.Model):
    """Where notifications go: a webhook (plain JSON or a chat-compatible ``{"text"}``) or an
    Alertmanager (``POST /api/v2/alerts``). Operators add them in the admin."""

    class Format(models.TextChoices):
        JSON = "json", "JSON webhook"
        CHAT = "chat", "chat webhook (Slack, Mattermost)"
        ALERTMANAGER = "alertmanager", "Alertmanager v2"

    name = models.CharField(max_length=100, unique=True)
    url = models.URLField(max_length=2000)
    format = models.CharField(max_length=16, choices=Format.choices, default=Format.JSON)
    # Event names this destination takes (``EVENTS`` above); empty takes every event.
    events = models.JSONField(default=list, blank=True)
    # HMAC-SHA256 key of the X-Fleetwatch-Signature header. Required for JSON and chat; an
    # Alertmanager (which reads no signature) may go without.
    secret = models.CharField(max_length=200, default=notification_secret, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(secret="") | models.Q(format="alertmanager"),
                name="notification_destination_signed",
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def secret_hint(self) -> str:
        """The last four characters, enough to tell two secrets apart; never the secret."""
        return f"…{self.secret[-4:]}" if self.secret else "unsigned"

    def accepts(self, event: str) -> bool:
        return event == "test" or not self.events or event in self.events

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        errors = {}
        if not isinstance(self.events, list) or any(e not in EVENTS for e in self.events):
            errors["events"] = f"a list of event names, each one of {', '.join(EVENTS)}"
        if not self.secret and self.format != self.Format.ALERTMANAGER:
            errors["secret"] = "JSON and chat webhooks are always signed: a secret is required"
        if errors:
            raise ValidationError(errors)


class NotificationDelivery(models.Model):
    """One event sent to one destination: unique on (destination, key), so an event is sent at
    most once per destination however often it is noticed."""

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    destination = models.ForeignKey(
        NotificationDestination, on_delete=models.CASCADE, related_name="deliveries"
    )
    event = models.CharField(max_length=32)
    # The event's idempotency key, e.g. "host_drain:gpu-a07:2026-11-25T10:00:00+00:00".
    key = models.CharField(max_length=500)
    title = models.CharField(max_length=500)
    url = models.CharField(max_length=2000, blank=True)  # a link into the UI
    payload = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)  # bounded by the task (ERROR_MAX)
    response_code = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["destination", "key"], name="notification_delivery_once"
            )
        ]
        indexes = [models.Index(fields=["-created_at"], name="notification_delivery_newest")]

    def __str__(self) -> str:
        return f"{self.event} → {self.destination}: {self.status}"

    @property
    def link(self) -> str:
        """``url`` when it is safe to link to (a path in the UI, or http(s)); else nothing."""
        url = self.url.strip()
        if (url.startswith("/") and not url.startswith("//")) or url.lower().startswith(
            ("http://", "https://")
        ):
            return url
        return ""
