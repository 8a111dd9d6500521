from django.apps import AppConfig


class IngestConfig(AppConfig):
    name = "ingest"
    verbose_name = "Ingest"

    def ready(self) -> None:
        # Registers the app's Celery tasks, which services publish by name (task_publish).
        from ingest import (
            schema,  # noqa: F401  (registers the OpenAPI auth extension)
            tasks,  # noqa: F401
        )
