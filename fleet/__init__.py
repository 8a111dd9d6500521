"""Fleetwatch: the Django project and the fleet inventory.

Nothing is imported here: ``fleetwatch diagnose`` (fleet.cli) must run without Django or Celery.
The Celery app is loaded by FleetConfig.ready() in the web tier and by ``celery -A fleet``.
"""
