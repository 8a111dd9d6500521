"""Bearer-key authentication and scope permissions for the API.

Keys are djangorestframework-api-key keys (only a hash is stored). Agents send
``Authorization: Bearer <key>``; a scope names what the key may do.
"""

from __future__ import annotations

from django.utils import timezone
from rest_framework import authentication, exceptions, permissions

from ingest.models import AgentKey, Scope


class AgentKeyAuthentication(authentication.BaseAuthentication):
    keyword = "bearer"

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        keyword, _, key = header.partition(" ")
        if keyword.lower() != self.keyword:
            return None
        key = key.strip()
        if not key:
            raise exceptions.AuthenticationFailed("Authorization: Bearer needs a key after it.")
        try:
            agent_key = AgentKey.objects.get_from_key(key)
        except AgentKey.DoesNotExist:
            raise exceptions.AuthenticationFailed("Unknown or revoked key.") from None
        if agent_key.has_expired:
            raise exceptions.AuthenticationFailed("This key has expired.")
        # Cheap, at most once a minute per key: enough to show which keys are in use.
        now = timezone.now()
        if agent_key.last_used_at is None or (now - agent_key.last_used_at).total_seconds() > 60:
            AgentKey.objects.filter(pk=agent_key.pk).update(last_used_at=now)
        return (None, agent_key)

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="fleetwatch"'


class _ScopePermission(permissions.BasePermission):
    scope: str = ""

    def has_permission(self, request, view) -> bool:
        if isinstance(request.auth, AgentKey):
            if request.auth.has_scope(self.scope):
                return True
            self.message = f"This key lacks the '{self.scope}' scope."
            return False
        user = getattr(request, "user", None)
        return bool(user is not None and user.is_authenticated and self.user_allowed(user))

    def user_allowed(self, user) -> bool:
        return True


class CanUpload(_ScopePermission):
    scope = Scope.UPLOAD

    def user_allowed(self, user) -> bool:
        return user.is_staff


class CanRead(_ScopePermission):
    scope = Scope.READ


class CanOperate(_ScopePermission):
    scope = Scope.OPERATE

    def user_allowed(self, user) -> bool:
        return user.is_staff or user.groups.filter(name="operators").exists()


def actor_of(request) -> str:
    """Who is acting, for audit records: a key as ``key:<prefix>``, else the user name."""
    if isinstance(getattr(request, "auth", None), AgentKey):
        return f"key:{request.auth.prefix}"
    return getattr(getattr(request, "user", None), "username", "") or ""
