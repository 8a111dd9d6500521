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
    # Claimed by the classify task (conditional update) so two workers never classify at once.
    classified_at = models.DateTimeField(null=True, blank=True)

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
