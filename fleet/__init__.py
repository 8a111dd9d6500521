"""Fleetwatch: the Django project and the fleet inventory."""

try:  # the pure core and the agent install without Celery
    from .celery import app as celery_app
except ImportError:  # pragma: no cover - only without the server extra
    celery_app = None

__all__ = ["celery_app"]
