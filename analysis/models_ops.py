"""Operations records (issue 8): the drain audit trail and the archived weekly reports.

Imported at the end of ``analysis.models`` so that Django finds these models in the analysis app.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class DrainAction(models.Model):
    """One drain or resume Fleetwatch asked a scheduler for — carried out, previewed (dry run)
    or declined (the node was drained by someone else). Every attempt is recorded."""

    class Action(models.TextChoices):
        DRAIN = "drain"
        RESUME = "resume"

    class Result(models.TextChoices):
        APPLIED = "applied"  # the scheduler accepted the command
        DRY_RUN = "dry_run"  # recorded what would have run; nothing ran
        LEFT_ALONE = "left_alone"  # someone else's drain, or nothing of ours to undo
        FAILED = "failed"  # the command ran and failed

    host = models.ForeignKey("fleet.Host", on_delete=models.CASCADE, related_name="drain_actions")
    action = models.CharField(max_length=8, choices=Action.choices)
    adapter = models.CharField(max_length=16)  # slurm | kubernetes
    dry_run = models.BooleanField(default=True)
    command = models.TextField(blank=True)  # what ran (or would have): argv or API calls
    result = models.CharField(max_length=16, choices=Result.choices)
    output = models.TextField(blank=True)  # scheduler's answer or why it was left alone
    reason = models.TextField(blank=True)
    by = models.CharField(max_length=150, blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-at"]
        indexes = [models.Index(fields=["host", "at"]), models.Index(fields=["action", "at"])]

    def __str__(self) -> str:
        return f"{self.action} {self.host_id} via {self.adapter} ({self.result})"


class WeeklyReport(models.Model):
    """One archived weekly reliability report. The row is created first as the claim on its
    week (unique), so two beat workers never build the same week, and a finished report is
    never replaced silently: a rebuild is asked for by name and logged in ``rebuilds``."""

    class Status(models.TextChoices):
        BUILDING = "building"
        READY = "ready"
        FAILED = "failed"

    week = models.CharField(max_length=8, unique=True)  # ISO week, "2026-W47"
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.BUILDING)
    numbers = models.JSONField(default=dict)  # everything the page shows, for later comparison
    html = models.TextField(blank=True)
    pdf = models.FileField(upload_to="reports/", max_length=255, blank=True)
    built_at = models.DateTimeField(null=True, blank=True)
    built_by = models.CharField(max_length=150, blank=True)
    emailed_to = models.JSONField(default=list)
    emailed_at = models.DateTimeField(null=True, blank=True)
    rebuilds = models.JSONField(default=list)  # [{at, by, previous_built_at}] one per rebuild
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-week"]

    def __str__(self) -> str:
        return f"weekly report {self.week} ({self.status})"
