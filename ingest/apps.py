from django.apps import AppConfig


class IngestConfig(AppConfig):
    name = "ingest"
    verbose_name = "Ingest"

    def ready(self) -> None:
        from ingest import schema  # noqa: F401  (registers the OpenAPI auth extension)
