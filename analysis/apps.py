from django.apps import AppConfig


class AnalysisConfig(AppConfig):
    name = "analysis"
    verbose_name = "Analysis"

    def ready(self) -> None:
        # Registers the app's Celery tasks, which services publish by name (task_publish).
        from analysis import tasks  # noqa: F401
