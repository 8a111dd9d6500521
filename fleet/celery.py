"""The Celery app. Configuration lives in Django settings under the CELERY_ namespace.

Also the pieces every task module shares: which database errors are transient, whether a message
is a re-delivery, the retry backoff, and the sweep run whenever a worker starts.
"""

import contextlib
import logging
import os
import threading

from celery import Celery
from celery.signals import worker_ready
from celery.utils.time import get_exponential_backoff_interval
from django.db import InterfaceError, OperationalError, connections

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


class EagerCountdowns:
    """Celery's ``countdown`` for the embedded default, where tasks run eagerly in the web
    process and there is no broker to hold a delayed message.

    ``schedule`` runs the task on a daemon timer thread after the countdown; scheduling the same
    task with the same arguments again restarts its countdown (a burst of uploads of one attempt
    ends in one classification, the settle window after the last). The first schedule in a
    process also sweeps once, after the countdown, for work a previous process left behind (a
    restart drops its timers). Inside ``batch()`` nothing waits: a loader that sends whole
    attempts (the demo fleet, the simulator) runs each scheduled task once when the batch ends,
    with ``complete=True`` for the tasks registered in ``complete_tasks``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._timers: dict[tuple, threading.Timer] = {}
        self._running: set[threading.Thread] = set()
        self._batch: dict[tuple, tuple] | None = None
        self._swept = False
        # Tasks that take ``complete=True`` (the sender says every artifact is in).
        self.complete_tasks: set[str] = set()

    def schedule(self, task, args: tuple, countdown: float) -> None:
        key = (task.name, tuple(args))
        with self._lock:
            if self._batch is not None:
                self._batch[key] = (task, tuple(args))
                return
            old = self._timers.pop(key, None)
            if old is not None:
                old.cancel()
            timer = threading.Timer(countdown, self._run, (key, task, tuple(args)))
            timer.daemon = True
            self._timers[key] = timer
            first, self._swept = not self._swept, True
        timer.start()
        if first:
            from ingest.tasks import uploads_sweep

            self.schedule(uploads_sweep, (), countdown)

    def _run(self, key: tuple, task, args: tuple) -> None:
        me = threading.current_thread()
        with self._lock:
            if self._timers.get(key) is not me:
                return  # cancelled or replaced while this timer fired
            del self._timers[key]
            self._running.add(me)
        try:
            task.apply(args)
        except Exception:
            log.exception("eager countdown of %s%r failed", task.name, args)
        finally:
            connections.close_all()  # this thread's connections; the next timer opens its own
            with self._lock:
                self._running.discard(me)

    def pending(self, task_name: str | None = None) -> int:
        """Timers not yet fired: all of them, or those of one task."""
        with self._lock:
            return sum(1 for name, _ in self._timers if task_name in (None, name))

    def cancel_all(self, wait_s: float = 30.0) -> None:
        """Cancel what has not fired; wait for what is running."""
        with self._lock:
            timers, self._timers = self._timers, {}
            running = list(self._running)
            self._swept = False
        for timer in timers.values():
            timer.cancel()
        for thread in running:
            thread.join(wait_s)

    @contextlib.contextmanager
    def batch(self):
        with self._lock:
            self._batch = {}
        try:
            yield
        finally:
            with self._lock:
                scheduled, self._batch = self._batch or {}, None
            for task, args in scheduled.values():
                complete = {"complete": True} if task.name in self.complete_tasks else None
                task.apply(args, complete)


eager_countdowns = EagerCountdowns()


@contextlib.contextmanager
def lease_renewed(name: str, renew, lease_s: float):
    """Call ``renew()`` every third of the lease while the block runs, from a thread of its own:
    a claim (a parse's, a classification's) must outlive its work only as long as its worker
    does. SQLite (the embedded default: one process, eager tasks) has no other worker to take
    over, and its connections are not shared across threads: no renewal there."""
    if connections["default"].vendor == "sqlite":
        yield
        return
    stop = threading.Event()
    every = lease_s / 3

    def loop() -> None:
        try:
            while not stop.wait(every):
                renew()
        except Exception:  # the claim then lapses, and the work is taken over: safe
            log.exception("%s: renewing the claim failed", name)
        finally:
            connections.close_all()  # this thread's connections only

    renewer = threading.Thread(target=loop, name=f"lease-{name}", daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join(timeout=every)
