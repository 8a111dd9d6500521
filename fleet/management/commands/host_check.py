"""``manage.py host_check <hostname> [--url URL --key KEY]`` — for Slurm's HealthCheckProgram
or an NHC check: one line on stdout and an exit code from the host's Fleetwatch verdict.

Exit codes (NHC convention: non-zero is a failed check):
  0  ok     — nothing against the host
  1  watch  — implicated recently; a warning, wrappers should not drain on it
  2  drain  — take the host out of service (the line says why)
  3  unknown — the host is not known to Fleetwatch, or Fleetwatch could not be asked

With ``--url`` (or FLEETWATCH_URL) the verdict comes from the API with a read key (``--key`` or
FLEETWATCH_KEY), so compute nodes need no database access; otherwise from the database.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

from django.core.management.base import BaseCommand

EXIT = {"ok": 0, "watch": 1, "drain": 2}
UNKNOWN = 3


def _from_api(url: str, key: str, hostname: str, timeout: float) -> dict:
    target = f"{url.rstrip('/')}/api/v1/hosts/{urllib.parse.quote(hostname, safe='')}/health"
    if not target.startswith(("http://", "https://")):
        raise ValueError("--url must be http:// or https://")
    request = urllib.request.Request(target, headers={"Authorization": f"Bearer {key}"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        return json.load(response)


def _from_db(hostname: str) -> dict | None:
    from analysis.memory import host_health
    from fleet.models import Host

    host = Host.objects.filter(hostname=hostname).first()
    if host is None:
        return None
    health = host_health(host)
    return {"verdict": health.verdict, "score": health.score, "reasons": health.reasons}


class Command(BaseCommand):
    help = "Exit 0 ok, 1 watch, 2 drain, 3 unknown, with one line: for HealthCheckProgram/NHC."

    def add_arguments(self, parser):
        parser.add_argument("hostname")
        parser.add_argument("--url", default=os.environ.get("FLEETWATCH_URL", ""))
        parser.add_argument("--key", default=os.environ.get("FLEETWATCH_KEY", ""))
        parser.add_argument("--timeout", type=float, default=10.0)

    def handle(self, *args, hostname, url, key, timeout, **options):
        try:
            health = _from_api(url, key, hostname, timeout) if url else _from_db(hostname)
        except urllib.error.HTTPError as exc:
            health = None if exc.code == 404 else {"error": f"HTTP {exc.code}"}
        except Exception as exc:  # unreachable server, bad answer, database down
            health = {"error": f"{type(exc).__name__}: {exc}"}
        if health is None:
            self._exit(UNKNOWN, f"UNKNOWN {hostname}: not known to Fleetwatch")
        if "error" in health:
            self._exit(UNKNOWN, f"UNKNOWN {hostname}: could not ask Fleetwatch ({health['error']})")
        verdict = health.get("verdict", "")
        if verdict not in EXIT:
            self._exit(UNKNOWN, f"UNKNOWN {hostname}: unexpected verdict {verdict!r}")
        why = "; ".join(health.get("reasons") or []) or "no recent incidents"
        line = f"{verdict.upper()} {hostname}: score {health.get('score', 0)}; {why}"
        self._exit(EXIT[verdict], " ".join(line.split())[:400])

    def _exit(self, code: int, line: str):
        self.stdout.write(line)
        self.stdout.flush()
        sys.exit(code)
