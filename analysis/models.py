"""Incidents: one failed attempt of one job, with the verdict of the diagnosis core."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from analysis.classify import CULPRITS
from fleet.models import Attempt, Job


class Incident(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"
        ACKNOWLEDGED = "acknowledged"
        RESOLVED = "resolved"

    Culprit = models.TextChoices("Culprit", [(c, c) for c in CULPRITS])

    attempt = models.OneToOneField(Attempt, on_delete=models.CASCADE, related_name="incident")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="incidents")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    culprit = models.CharField(max_length=32, choices=Culprit.choices, default="unknown")
    confidence = models.FloatField(default=0.0)
    summary = models.TextField(blank=True)
    fix = models.TextField(blank=True)
    evidence = models.JSONField(default=list)
    suspects = models.JSONField(default=list)
    alternatives = models.JSONField(default=list)
    rule_ids = models.JSONField(default=list)
    matches = models.JSONField(default=list)  # every rule that matched: rule_id, culprit, conf.
    ruleset_version = models.CharField(max_length=32, blank=True)
    # Incidents with the same cause (culprit + implicated entity + rule) share a fingerprint,
    # so a page or a report can say "the 7th time".
    fingerprint = models.CharField(max_length=64, blank=True, db_index=True)
    signature = models.CharField(max_length=255, blank=True)  # Verdict.signature
    # The resolved public incidents most like this one (analysis.corpus.similar): leads with
    # their thread and fix, never the verdict.
    similar = models.JSONField(default=list, blank=True)
    opened_at = models.DateTimeField(default=timezone.now)
    classified_at = models.DateTimeField(null=True, blank=True)
    # The on-call workflow (analysis.services.incident_*): who did what, and when.
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=150, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=150, blank=True)
    fix_applied_at = models.DateTimeField(null=True, blank=True)
    fix_applied_by = models.CharField(max_length=150, blank=True)
    # Set when an operator overrode the classifier's culprit; the core's verdict is kept here.
    classified_culprit = models.CharField(max_length=32, blank=True)
    # Who handles it (a user name, or a team as "team:storage"); blank: nobody yet.
    assignee = models.CharField(max_length=150, blank=True, db_index=True)
    # Out of the overview and the open lists until then; the status does not change.
    snoozed_until = models.DateTimeField(null=True, blank=True)
    # Every workflow step with its note, oldest first: {"at", "by", "action", "note"}.
    journal = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-opened_at"]
        indexes = [
            models.Index(fields=["opened_at"]),
            models.Index(fields=["culprit", "opened_at"]),
            models.Index(fields=["status", "opened_at"]),
            models.Index(fields=["fingerprint", "opened_at"]),
        ]

    def __str__(self) -> str:
        return f"incident {self.pk} ({self.culprit}) on {self.job_id}"


class IncidentRevision(models.Model):
    """One verdict an incident had. A new one is recorded only when later evidence changes the
    culprit or the suspected ranks; evidence that only adds to the same verdict is no revision."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="revisions")
    at = models.DateTimeField(default=timezone.now)
    culprit = models.CharField(max_length=32)
    confidence = models.FloatField(default=0.0)
    ranks = models.JSONField(default=list)  # the suspected ranks, strongest first
    rule_id = models.CharField(max_length=64, blank=True)  # the rule that named the culprit
    cause = models.CharField(max_length=500, blank=True)  # what arrived since the last verdict
    ruleset_version = models.CharField(max_length=32, blank=True)

    class Meta:
        ordering = ["at", "pk"]

    def __str__(self) -> str:
        return f"{self.culprit} ({self.cause})"


class Entity(models.Model):
    """Something an incident can implicate and that recurs across jobs: a host, a GPU, a NIC,
    a rack, a storage mount, a config value, a software version, a job family."""

    class Kind(models.TextChoices):
        HOST = "host"
        GPU = "gpu"
        NIC = "nic"
        RACK = "rack"
        MOUNT = "mount"
        CONFIG = "config"
        VERSION = "version"
        JOB_FAMILY = "job_family"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    key = models.CharField(max_length=255)  # "gpu-a01", "gpu-a01/0000:3b:00", "nccl=2.20.3"
    first_seen = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["kind", "key"]
        constraints = [models.UniqueConstraint(fields=["kind", "key"], name="entity_unique")]

    def __str__(self) -> str:
        return f"{self.kind}:{self.key}"


class Exposure(models.Model):
    """An attempt ran on or with an entity — failed or healthy. The denominator of recurrence."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="exposures")
    entity = models.ForeignKey(Entity, on_delete=models.CASCADE, related_name="exposures")
    at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["attempt", "entity"], name="exposure_unique")
        ]
        indexes = [models.Index(fields=["entity", "at"])]

    def __str__(self) -> str:
        return f"{self.attempt_id} ran with {self.entity_id}"


class Implication(models.Model):
    """An incident's verdict points at an entity, through a rule, with a reason."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="implications")
    entity = models.ForeignKey(Entity, on_delete=models.CASCADE, related_name="implications")
    culprit = models.CharField(max_length=32)
    rule_id = models.CharField(max_length=64)
    confidence = models.FloatField()
    why = models.TextField(blank=True)
    at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["incident", "entity", "rule_id"], name="implication_unique"
            )
        ]
        indexes = [models.Index(fields=["entity", "at"])]

    def __str__(self) -> str:
        return f"incident {self.incident_id} implicates {self.entity_id} ({self.culprit})"


class CulpritScore(models.Model):
    """The recurrence verdict on one entity, recomputed by fleet_correlate, and the unit of
    on-call work: a flagged culprit is owned, acknowledged, snoozed, muted or resolved as one,
    whatever number of incidents stand behind it (as Sentry makes an issue of its events). The
    workflow fields are never written by fleet_correlate's upsert."""

    class Status(models.TextChoices):
        OPEN = "open"
        ACKNOWLEDGED = "acknowledged"
        RESOLVED = "resolved"
        MUTED = "muted"  # known and accepted: no notifications, out of the overview

    entity = models.OneToOneField(Entity, on_delete=models.CASCADE, related_name="score")
    culprit = models.CharField(max_length=32)
    score = models.FloatField()  # -log10 of the chance of so many implications by luck
    flagged = models.BooleanField(default=False)
    implicated = models.FloatField()  # decayed count of incidents implicating the entity
    exposed = models.FloatField()  # decayed count of attempts that ran on or with it
    baseline = models.FloatField()  # fleet rate for entities of this kind
    explanation = models.TextField()
    incidents = models.JSONField(default=list)  # ids, newest first
    first_flagged_at = models.DateTimeField(null=True, blank=True)
    incidents_when_flagged = models.PositiveIntegerField(null=True, blank=True)
    # Failed attempts behind a score that no incident implicates by itself: a setting or version
    # contrasted across the fleet (config_contrast). Ids, newest first.
    attempts = models.JSONField(default=list, blank=True)
    computed_at = models.DateTimeField()
    # The on-call workflow (analysis.services.culprit_*).
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    assignee = models.CharField(max_length=150, blank=True, db_index=True)
    snoozed_until = models.DateTimeField(null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=150, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=150, blank=True)
    # Implicated again after it was resolved: reopened by fleet_correlate, and says so.
    regressed_at = models.DateTimeField(null=True, blank=True)
    journal = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-flagged", "-score"]
        indexes = [
            models.Index(fields=["flagged", "score"]),
            models.Index(fields=["status", "flagged"]),
        ]

    def __str__(self) -> str:
        return f"{self.entity_id}: {self.score}"


class HostRepair(models.Model):
    """An operator marked a host repaired: its health starts afresh; history is kept."""

    host = models.ForeignKey("fleet.Host", on_delete=models.CASCADE, related_name="repairs")
    at = models.DateTimeField(default=timezone.now)
    note = models.TextField(blank=True)
    by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.host_id} repaired at {self.at:%Y-%m-%d %H:%M}"


from analysis.models_ops import DrainAction, WeeklyReport  # noqa: E402, F401
