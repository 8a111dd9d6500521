"""Load a small demo fleet through the real upload API, and make a login to look at it."""

from __future__ import annotations

import gzip
import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management.base import BaseCommand, CommandError
from django.test import Client
from django.utils import timezone

from analysis import memory
from analysis.models import CulpritScore, Incident
from fleet.celery import eager_countdowns
from fleet.demo import demo_scenarios, healthy_log, rank_log
from fleet.simulate import Simulator
from ingest.models import AgentKey, Scope


class Command(BaseCommand):
    help = "Send real-shaped artifacts of a few jobs through POST /api/v1/uploads."

    def add_arguments(self, parser):
        parser.add_argument("--user", default="admin", help="login to create or reset")
        parser.add_argument("--hosts", type=int, default=96, help="simulated fleet size")
        parser.add_argument(
            "--days",
            type=int,
            default=7,
            help="simulated days of history (a week: every planted "
            "culprit recurs often enough to be accused)",
        )
        parser.add_argument(
            "--again",
            action="store_true",
            help="the fleet's next day, squeezed into the time since the last resolution: the "
            "planted culprits fail again, and one resolved meanwhile reopens as a regression",
        )

    def handle(self, *args, user: str, hosts: int, days: int, again: bool = False, **options):
        _, key = AgentKey.objects.create_key(name="demo agent", scopes=[Scope.UPLOAD])
        if again:
            self._again(key, hosts)
            return
        if not Incident.objects.exists():
            # A realistic recent history from the fleet simulator (planted culprits and noise),
            # then a few hand-made incidents of every common kind, all through the upload API.
            self.stdout.write(f"Simulating {hosts} hosts over {days} days of jobs...")
            sim = Simulator(hosts=hosts, days=days, seed=7, end=timezone.now())
            truth = sim.run_with_fleet_memory(key, ticks_per_day=4)
            self.stdout.write(
                f"  {truth.attempts} attempts, {truth.failures} failures; planted: "
                + ", ".join(p.kind for p in truth.plants)
            )
        # The same URL, authentication, validation and service path an agent's request takes.
        client = Client(HTTP_HOST="127.0.0.1")
        sent = 0
        for scenario, failed in demo_scenarios():
            with eager_countdowns.batch():  # each attempt classified once, all its ranks in
                sent += self._send_attempt(client, key, scenario, failed)
        memory.fleet_correlate()
        AgentKey.objects.filter(name="demo agent").update(revoked=True)
        password = secrets.token_urlsafe(9)
        account, _ = get_user_model().objects.get_or_create(username=user)
        account.is_staff = account.is_superuser = True
        account.set_password(password)
        account.save()
        self.stdout.write(f"Demo fleet: {sent} artifacts uploaded.")
        self.stdout.write(f"Log in at http://127.0.0.1:8000/ as {user} / {password}")

    def _again(self, key: str, hosts: int) -> None:
        """Another simulated day of the same fleet (same seed: the same planted culprits), its
        jobs started since the last culprit was resolved, so that their failures come after it."""
        if not Incident.objects.exists():
            raise CommandError("no demo fleet yet: run demo_fleet without --again first")
        now = timezone.now()
        resolved = (
            CulpritScore.objects.filter(resolved_at__isnull=False)
            .order_by("-resolved_at")
            .values_list("resolved_at", flat=True)
            .first()
        )
        window = min(timedelta(days=1), max(timedelta(minutes=1), now - (resolved or now)))
        self.stdout.write(f"The fleet's next day, over the last {window}...")
        sim = Simulator(hosts=hosts, days=1, seed=7, end=now, window=window, tag=f"-{now:%H%M%S}")
        truth = sim.run(key)
        memory.fleet_correlate()
        AgentKey.objects.filter(name="demo agent").update(revoked=True)
        reopened = CulpritScore.objects.filter(regressed_at__gte=now).count()
        self.stdout.write(
            f"  {truth.attempts} attempts, {truth.failures} failures; "
            f"{reopened} resolved culprit(s) reopened as regressions."
        )

    def _send_attempt(self, client, key, scenario, failed) -> int:
        sent = 0
        for rank in range(scenario.world):
            body = (rank_log if failed else healthy_log)(scenario, rank).encode()
            name = f"{scenario.job}-rank{rank}.log"
            if rank % 2:
                body, name = gzip.compress(body), name + ".gz"
            response = client.post(
                "/api/v1/uploads",
                {
                    "file": SimpleUploadedFile(name, body),
                    "host": scenario.host_of(rank),
                    "job": scenario.job,
                    "attempt": scenario.attempt,
                    "rank": rank,
                },
                HTTP_AUTHORIZATION=f"Bearer {key}",
            )
            if response.status_code != 202:
                raise CommandError(
                    f"demo upload refused: {response.status_code} {response.content!r}"
                )
            sent += 1
        for host, text in scenario.host_logs.items():
            self._send(client, key, text.encode(), f"{host}-dmesg.log", host, scenario)
            sent += 1
        return sent

    def _send(self, client, key, body, name, host, scenario):
        response = client.post(
            "/api/v1/uploads",
            {
                "file": SimpleUploadedFile(name, body),
                "host": host,
                "job": scenario.job,
                "attempt": scenario.attempt,
            },
            HTTP_AUTHORIZATION=f"Bearer {key}",
        )
        if response.status_code != 202:
            raise CommandError(f"demo upload refused: {response.status_code} {response.content!r}")
