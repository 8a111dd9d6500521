"""The Celery app. Configuration lives in Django settings under the CELERY_ namespace.

Also the pieces every task module shares: which database errors are transient, whether a message
is a re-delivery, the retry backoff, and the sweep run whenever a worker starts.
"""

import logging
import os

from celery import Celery
from celery.signals import worker_ready
from celery.utils.time import get_exponential_backoff_interval
from django.db import InterfaceError, OperationalError

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleet.settings")

app = Celery("fleet")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

log = logging.getLogger(__name__)

# The database went away (a restart, a failover): the connection is replaced on the next try.
DATABASE_TRANSIENT = (OperationalError, InterfaceError)


def redelivered(task) -> bool:
    """The broker gave this message back because the worker that had it died (acks_late)."""
    return bool((task.request.delivery_info or {}).get("redelivered"))


def retry_countdown(task) -> float:
    """Full-jitter exponential backoff, capped at two minutes."""
    return get_exponential_backoff_interval(
        factor=1, retries=task.request.retries, maximum=120, full_jitter=True
    )


@worker_ready.connect
def sweep_when_a_worker_starts(sender=None, **kwargs) -> None:
    """A worker starting after a crash or an outage picks up what was left behind at once,
    without waiting for beat's next sweep."""
    from ingest.services import task_publish
    from ingest.tasks import uploads_sweep

    task_publish(uploads_sweep)
