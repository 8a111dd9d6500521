"""``manage.py weekly_report --week 2026-W47 [--rebuild] [--no-email]``."""

from __future__ import annotations

import getpass

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from analysis import report


class Command(BaseCommand):
    help = (
        "Build, archive and mail the weekly reliability report for an ISO week (default: the "
        "week before this one). A built week is never replaced unless --rebuild is given, and "
        "the rebuild is recorded on the report."
    )

    def add_arguments(self, parser):
        parser.add_argument("--week", help="ISO week, e.g. 2026-W47 (default: last week)")
        parser.add_argument("--rebuild", action="store_true", help="replace an existing report")
        parser.add_argument("--no-email", action="store_true", help="archive without mailing")

    def handle(self, *args, week, rebuild, no_email, **options):
        week = week or report.previous_week(timezone.now())
        try:
            report.week_bounds(week)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        try:
            built = report.weekly_report_build(
                week, rebuild=rebuild, by=f"manage.py by {getpass.getuser()}", email=not no_email
            )
        except report.ReportExists as exc:
            raise CommandError(str(exc)) from None
        n = built.numbers
        self.stdout.write(
            f"Report {week}{' (rebuilt)' if built.rebuilds else ''}: {n['incidents']} incidents, "
            f"{n['gpu_hours_lost']} GPU-hours lost; PDF {built.pdf.name or 'not built'}; "
            f"mailed to {', '.join(built.emailed_to) or 'nobody'}"
        )
