"""``manage.py evaluate_fleet --truth PATH``: how well fleet memory found the planted culprits."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from analysis.models import CulpritScore
from fleet.simulate import evaluate


class Command(BaseCommand):
    help = "Compare flagged culprits with a simulate_fleet ground truth; print JSON."

    def add_arguments(self, parser):
        parser.add_argument("--truth", required=True)

    def handle(self, *args, truth, **options):
        try:
            data = json.loads(Path(truth).read_text())
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot read the truth file {truth}: {exc}") from exc
        scores = CulpritScore.objects.select_related("entity")
        self.stdout.write(json.dumps(evaluate(data, scores), indent=2, default=str))
