"""``manage.py simulate_fleet --hosts N --days D --seed S --truth PATH``."""

from __future__ import annotations

import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from fleet.simulate import Simulator
from ingest.models import AgentKey, Scope


class Command(BaseCommand):
    help = (
        "Simulate a fleet with planted culprits through the real upload and attempts API; "
        "write the ground truth as JSON."
    )

    def add_arguments(self, parser):
        parser.add_argument("--hosts", type=int, default=200)
        parser.add_argument("--days", type=int, default=7)
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--truth", required=True, help="where to write the ground truth")
        parser.add_argument(
            "--ticks-per-day",
            type=int,
            default=24,
            help="how often fleet memory recomputes its scores besides after each incident, in "
            "simulated time (the beat schedule does it every 5 minutes in production)",
        )

    def handle(self, *args, hosts, days, seed, truth, ticks_per_day, **options):
        if hosts < 64 or days < 1:
            raise CommandError(
                "need at least 64 hosts (4 racks: every GPU model) and 1 day for every planted "
                "culprit"
            )
        _, key = AgentKey.objects.create_key(name=f"simulator {seed}", scopes=[Scope.UPLOAD])
        started = time.monotonic()
        sim = Simulator(hosts=hosts, days=days, seed=seed, end=timezone.now())
        result = sim.run_with_fleet_memory(key, ticks_per_day=ticks_per_day)
        AgentKey.objects.filter(name=f"simulator {seed}").update(revoked=True)
        Path(truth).write_text(result.to_json())
        self.stdout.write(
            f"Simulated {hosts} hosts for {days} days: {result.attempts} attempts, "
            f"{result.failures} failures ({result.noise_failures} background noise) in "
            f"{time.monotonic() - started:.0f} s; truth in {truth}"
        )
