"""Sends spooled items to the server, oldest first, with backoff that survives restarts.

Why a small loop and not ``urllib3.util.Retry`` alone: a retry here spans minutes, agent
restarts and every queued item (when the server is down, none of them should be tried until
the backoff ends), so the backoff is a "not before" time kept by the uploader, not a sleep
inside one request. urllib3 still does the HTTP, and its ``Retry.parse_retry_after`` reads the
``Retry-After`` header (seconds or an HTTP date).

Delivery is at-least-once: an item is unlinked only after the server accepted it. The upload
API is idempotent on the same bytes for the same host and job, so the duplicate after a crash
between the answer and the unlink is recognised by the server, not stored twice.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass

import urllib3
from urllib3.util import Retry

from .config import AgentConfig
from .spool import Item, Spool

log = logging.getLogger("fleetwatch.agent")

UPLOADS_PATH = "/api/v1/uploads"
ATTEMPTS_PATH = "/api/v1/attempts"
REQUESTS_PATH = "/api/v1/artifact-requests"
# Answers that will not change by sending the same item again: drop it (and count it).
PERMANENT = {400, 404, 405, 410, 413, 415, 422}


@dataclass
class Stats:
    sent: int = 0
    duplicates: int = 0
    rejected: int = 0
    failures: int = 0  # consecutive transient failures
    requests: int = 0


def full_jitter(failures: int, base: float, cap: float, rng: random.Random) -> float:
    """AWS "full jitter": uniform in [0, min(cap, base · 2^failures)]. Spreads a fleet of agents
    that all lost the server at once, so they do not come back in lock-step."""
    return rng.uniform(0.0, min(cap, base * (2 ** min(failures, 30))))


class Uploader:
    def __init__(
        self,
        config: AgentConfig,
        spool: Spool,
        *,
        rng: random.Random | None = None,
        clock=time.monotonic,
    ) -> None:
        self.config = config
        self.spool = spool
        self.rng = rng or random.Random()
        self.clock = clock
        self.stats = Stats()
        self.not_before = 0.0
        # A shutdown lowers this for its last pass (agents/cli.py).
        self.request_timeout_s = config.request_timeout_s
        self.http = urllib3.PoolManager(
            num_pools=2,
            maxsize=1,
            retries=False,  # retries are this class's job (see the module docstring)
            timeout=urllib3.Timeout(connect=5.0, read=config.request_timeout_s),
        )

    def ready(self) -> bool:
        return self.clock() >= self.not_before

    def artifact_requests(self, host: str) -> list[dict]:
        """What the server asks this host for; [] when it cannot be asked right now (the next
        poll asks again, so a failure here needs no retry of its own)."""
        base = self.config.server.rstrip("/")
        try:
            response = self.http.request(
                "GET",
                base + REQUESTS_PATH,
                fields={"host": host},
                headers={"Authorization": f"Bearer {self.config.api_key()}"},
            )
        except urllib3.exceptions.HTTPError:
            return []
        if response.status != 200:
            return []
        try:
            answer = json.loads(response.data)
        except ValueError:
            return []
        return [r for r in answer if isinstance(r, dict)] if isinstance(answer, list) else []

    def answer_request(self, request_id: int, outcome: str) -> bool:
        """Tell the server what became of a request (``sent`` or ``none``); False when it could
        not be told now (the next poll lists the request again and it is answered again)."""
        base = self.config.server.rstrip("/")
        try:
            response = self.http.request(
                "POST",
                f"{base}{REQUESTS_PATH}/{int(request_id)}/answer",
                body=json.dumps({"outcome": outcome}).encode(),
                headers={
                    "Authorization": f"Bearer {self.config.api_key()}",
                    "Content-Type": "application/json",
                },
            )
        except urllib3.exceptions.HTTPError:
            return False
        return response.status in (200, 404)

    def drain(self, budget_s: float = 5.0, *, max_items: int | None = None) -> int:
        """Send items until the spool is empty, the server fails, or the budget is spent."""
        if not self.config.server or not self.ready():
            return 0
        started = self.clock()
        sent = 0
        for item in self.spool.items():
            if self.clock() - started > budget_s or (max_items is not None and sent >= max_items):
                break
            if not self.send(item):
                break
            sent += 1
        return sent

    def send(self, item: Item) -> bool:
        """One item; True when it left the spool (accepted or permanently rejected)."""
        try:
            response = self._request(item)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self._back_off(None, f"{type(exc).__name__}: {exc}")
            return False
        status = response.status
        if status in (200, 201, 202):
            self._accepted(item, response)
            return True
        if status in PERMANENT:
            self.stats.rejected += 1
            log.warning(
                "server refused %s (%s): %s",
                item.name,
                status,
                response.data[:300].decode("utf-8", "replace"),
            )
            self.spool.remove(item)
            state = self.spool.state()
            self.spool.save_extra("rejected", int(state.extra.get("rejected", 0)) + 1)
            return True
        # 401/403 (a key being rotated), 408, 429, 5xx: keep the item, try again later.
        self._back_off(response.headers.get("Retry-After"), f"HTTP {status}")
        return False

    def _accepted(self, item: Item, response) -> None:
        self.stats.sent += 1
        self.stats.failures = 0
        try:
            answer = json.loads(response.data or b"{}")
        except ValueError:
            answer = {}
        if isinstance(answer, dict) and answer.get("duplicate"):
            self.stats.duplicates += 1
        self.spool.remove(item)

    def _back_off(self, retry_after: str | None, why: str) -> None:
        self.stats.failures += 1
        delay = full_jitter(
            self.stats.failures - 1,
            self.config.backoff_base_s,
            self.config.backoff_max_s,
            self.rng,
        )
        if retry_after:
            try:
                asked = Retry().parse_retry_after(retry_after)
            except urllib3.exceptions.InvalidHeader:
                asked = 0.0
            delay = max(delay, min(asked, self.config.backoff_max_s * 4))
        self.not_before = self.clock() + delay
        log.info("upload deferred %.1fs after %s", delay, why)

    def _request(self, item: Item):
        header = item.header
        base = self.config.server.rstrip("/")
        headers = {"Authorization": f"Bearer {self.config.api_key()}"}
        self.stats.requests += 1
        timeout = urllib3.Timeout(
            connect=min(5.0, self.request_timeout_s), read=self.request_timeout_s
        )
        if header.get("endpoint") == "attempts":
            return self.http.request(
                "POST",
                base + ATTEMPTS_PATH,
                body=item.body(),
                headers={**headers, "Content-Type": "application/json"},
                timeout=timeout,
            )
        fields: dict = {
            "host": str(header.get("host") or self.config.host),
            "job": str(header["job"]),
            "attempt": str(int(header.get("attempt") or 0)),
            "file": (header.get("filename") or "artifact", item.body()),
        }
        if header.get("rank") is not None:
            fields["rank"] = str(int(header["rank"]))
        if header.get("kind"):
            fields["kind"] = header["kind"]
        return self.http.request(
            "POST",
            base + UPLOADS_PATH,
            fields=fields,
            headers=headers,
            encode_multipart=True,
            timeout=timeout,
        )
