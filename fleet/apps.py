from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Fleet inventory"

    def ready(self) -> None:
        # Make the configured Celery app current before any task is sent from the web tier.
        # Registers the app's Celery tasks, which services publish by name (task_publish).
        from fleet import (
            celery,  # noqa: F401
            tasks,  # noqa: F401
        )
