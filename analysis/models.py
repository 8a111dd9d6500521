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
    ruleset_version = models.CharField(max_length=32, blank=True)
    opened_at = models.DateTimeField(default=timezone.now)
    classified_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-opened_at"]
        indexes = [
            models.Index(fields=["culprit", "opened_at"]),
            models.Index(fields=["status", "opened_at"]),
        ]

    def __str__(self) -> str:
        return f"incident {self.pk} ({self.culprit}) on {self.job_id}"
