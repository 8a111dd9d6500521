"""Per-key rate limits (issue 8).

A module of its own, importing no DRF views: ``DEFAULT_THROTTLE_CLASSES`` is resolved while
``rest_framework.views`` is being imported, so this module must not import it back.
"""

from __future__ import annotations

import logging

from django.conf import settings
from redis.exceptions import RedisError
from rest_framework.throttling import SimpleRateThrottle

from ingest.models import AgentKey

log = logging.getLogger(__name__)


class AgentKeyThrottle(SimpleRateThrottle):
    """Per-key rate limit, by the scope the endpoint needs (``FLEETWATCH_RATE_LIMITS``).

    Keyed by the agent key's prefix (its public half), a session user's id, or else the client
    address; counted in the default cache — Redis when ``REDIS_URL`` is set, so every gunicorn
    worker shares one count. DRF answers 429 with ``Retry-After``."""

    cache_format = "throttle_%(scope)s_%(ident)s"

    def __init__(self):
        # The rate depends on the view, so it is chosen in allow_request, not here.
        pass

    def get_rate(self):
        return (getattr(settings, "FLEETWATCH_RATE_LIMITS", {}) or {}).get(self.scope) or None

    @staticmethod
    def view_scope(view) -> str:
        scopes = [getattr(p, "scope", "") for p in view.get_permissions()]
        for scope in ("operate", "upload", "read"):
            if scope in scopes:
                return scope
        return "read"

    def allow_request(self, request, view):
        self.scope = self.view_scope(view)
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        try:
            return super().allow_request(request, view)
        except RedisError as exc:
            # The cache is down (often the broker's Redis too): count nothing rather than refuse
            # everything. No upload may depend on Redis being up at that instant (issue 9).
            log.warning("rate limit not counted, the cache is unavailable: %s", exc)
            return True

    def get_cache_key(self, request, view):
        if isinstance(request.auth, AgentKey):
            ident = f"key:{request.auth.prefix}"
        elif getattr(request, "user", None) is not None and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            ident = f"addr:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
