"""Outgoing notifications: a real HTTP receiver on loopback gets each event once per destination,
signed, after a refused first attempt is retried; filters, formats, failures and the page."""

from __future__ import annotations

import json
import socket
import threading
import time
import types
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.urls import include, path
from django.utils import timezone
from rest_framework.test import APIClient

from analysis.models import Incident
from fleet.demo import XID_79, JobScenario, rank_log
from fleet.models import NotificationDelivery, NotificationDestination
from fleet.notify import notify, notify_host_verdicts, signature, verify_signature
from fleet.tasks import notification_deliver

pytestmark = pytest.mark.django_db

EVENTS = ["host_drain", "culprit_flagged", "regression", "ingest_failing"]
PAYLOADS = {
    "host_drain": {"host": "gpu-a07", "verdict": "drain", "score": 9.5, "reasons": ["Xid 79"]},
    "culprit_flagged": {"entity": "host:gpu-a07", "culprit": "bad_node_hardware"},
    "regression": {"entity": "setting:NCCL_ALGO=Tree", "culprit": "nccl_config"},
    "ingest_failing": {"upload": 7, "host": "gpu-a07", "job": "j", "error": "refused"},
}


class Receiver:
    """A webhook receiver: answers the statuses in ``answers`` in turn, then 200; records
    every request (recorded before it answers, so a sender that got its answer is seen)."""

    def __init__(self, answers=(503,)):
        self.answers = list(answers)
        self.requests: list[dict] = []
        self.changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.changed:
                    status = receiver.answers.pop(0) if receiver.answers else 200
                    receiver.requests.append(
                        {
                            "path": self.path,
                            "headers": dict(self.headers),
                            "body": body,
                            "status": status,
                        }
                    )
                    receiver.changed.notify_all()
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", "1")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"no" if status >= 300 else b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def wait_for(self, condition, what: str, timeout: float = 30.0) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: condition(self.requests), timeout):
                raise AssertionError(f"the receiver never saw {what}: {self.requests}")

    def for_delivery(self, delivery) -> list[dict]:
        with self.changed:
            return [
                r
                for r in self.requests
                if r["headers"]["X-Fleetwatch-Delivery"] == str(delivery.pk)
            ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def receiver():
    made = []

    def make(answers=(503,)) -> Receiver:
        made.append(Receiver(answers))
        return made[-1]

    yield make
    for one in made:
        one.close()


@pytest.fixture
def sent(django_capture_on_commit_callbacks):
    """notify(), then run what it published after commit (the deliveries, eagerly)."""

    def send(*args, **kwargs):
        with django_capture_on_commit_callbacks(execute=True):
            return notify(*args, **kwargs)

    return send


def destination(name, url, fmt="json", events=(), **kw):
    return NotificationDestination.objects.create(
        name=name, url=url, format=fmt, events=list(events), **kw
    )


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


@pytest.mark.parametrize("event", EVENTS)
def test_each_event_is_delivered_once_per_destination_signed_and_retried_after_a_refusal(
    receiver, sent, event
):
    hook = receiver()  # refuses the first request it gets
    first = destination("a-first", f"{hook.url}/one")
    second = destination("b-second", f"{hook.url}/two")
    key = f"{event}:gpu-a07:2026-11-25T10:00"

    deliveries = sent(event, key, f"{event} happened", PAYLOADS[event], url="/hosts/gpu-a07/")

    assert sorted(d.destination.name for d in deliveries) == ["a-first", "b-second"]
    hook.wait_for(lambda rs: sum(r["status"] == 200 for r in rs) == 2, "two accepted deliveries")
    rows = {d.destination_id: d for d in NotificationDelivery.objects.all()}
    assert rows.keys() == {first.pk, second.pk}
    refused = rows[first.pk]  # delivered first: it met the refusal
    assert [r["status"] for r in hook.for_delivery(refused)] == [503, 200]
    assert (refused.status, refused.attempts, refused.response_code) == ("delivered", 2, 200)
    assert refused.delivered_at is not None and "attempt 1: HTTP 503" in refused.last_error
    other = rows[second.pk]
    assert [r["status"] for r in hook.for_delivery(other)] == [200]
    assert (other.status, other.attempts) == ("delivered", 1)

    for dest, row in ((first, refused), (second, other)):
        for request in hook.for_delivery(row):
            headers, body = request["headers"], request["body"]
            assert request["path"] == ("/one" if dest == first else "/two")
            assert headers["X-Fleetwatch-Event"] == event
            assert headers["Content-Type"] == "application/json"
            assert headers["User-Agent"] == "Fleetwatch"
            assert verify_signature(dest.secret, headers["X-Fleetwatch-Signature"], body)
            assert not verify_signature(dest.secret, headers["X-Fleetwatch-Signature"], body + b" ")
            assert not verify_signature("another secret", headers["X-Fleetwatch-Signature"], body)
            document = json.loads(body)
            assert document["event"] == event and document["key"] == key
            assert document["title"] == f"{event} happened"
            assert document["url"] == "/hosts/gpu-a07/"
            assert document["payload"] == PAYLOADS[event]
            assert datetime.fromisoformat(document["at"].replace("Z", "+00:00"))
        # The body is the event's, the same on the retry.
        assert len({r["body"] for r in hook.for_delivery(row)}) == 1

    # Noticing the same event again sends nothing more.
    seen = len(hook.requests)
    assert sent(event, key, "again", PAYLOADS[event]) == []
    assert NotificationDelivery.objects.count() == 2 and len(hook.requests) == seen


def test_a_destination_filtered_to_host_drain_gets_nothing_else(receiver, sent):
    hook = receiver(answers=())
    drains = destination("drains-only", f"{hook.url}/drains", events=["host_drain"])
    everything = destination("everything", f"{hook.url}/all")

    sent("culprit_flagged", "culprit_flagged:host:gpu-a07", "flagged", PAYLOADS["culprit_flagged"])
    hook.wait_for(lambda rs: len(rs) == 1, "the culprit")
    assert [r["path"] for r in hook.requests] == ["/all"]
    assert not drains.deliveries.exists() and everything.deliveries.count() == 1

    sent("host_drain", "host_drain:gpu-a07:ever", "drain", PAYLOADS["host_drain"])
    hook.wait_for(lambda rs: len(rs) == 3, "the drain at both")
    assert sorted(r["path"] for r in hook.requests[1:]) == ["/all", "/drains"]
    assert drains.accepts("test") and not drains.accepts("regression")


def test_a_chat_destination_gets_its_text_signed(receiver, sent):
    hook = receiver(answers=())
    chat = destination("chat", f"{hook.url}/chat", fmt="chat")
    sent("regression", "regression:x", 'nccl_config came back on "Tree" & <b>', {}, url="/c/1/")
    hook.wait_for(lambda rs: len(rs) == 1, "the chat message")
    request = hook.requests[0]
    assert json.loads(request["body"]) == {"text": 'nccl_config came back on "Tree" & <b> /c/1/'}
    header = request["headers"]["X-Fleetwatch-Signature"]
    assert verify_signature(chat.secret, header, request["body"])


def test_an_alertmanager_gets_one_v2_alert_with_labels_from_the_payload(receiver, sent):
    hook = receiver(answers=())
    unsigned = destination("am", f"{hook.url}/api/v2/alerts", fmt="alertmanager", secret="")
    signed = destination("am-signed", f"{hook.url}/signed/api/v2/alerts", fmt="alertmanager")
    sent(
        "host_drain",
        "host_drain:gpu-a07:ever",
        "gpu-a07 should be drained: Xid 79",
        PAYLOADS["host_drain"],
        url="/hosts/gpu-a07/",
    )
    sent("culprit_flagged", "culprit_flagged:k", "flagged", PAYLOADS["culprit_flagged"])
    hook.wait_for(lambda rs: len(rs) == 4, "two alerts at each Alertmanager")
    by_path = {}
    for request in hook.requests:
        by_path.setdefault(request["path"], []).append(request)
    drain, flagged = (json.loads(r["body"]) for r in by_path["/api/v2/alerts"])
    assert isinstance(drain, list) and len(drain) == 1
    alert = drain[0]
    assert alert["labels"] == {
        "alertname": "FleetwatchHostDrain",
        "severity": "critical",
        "host": "gpu-a07",
        "verdict": "drain",
    }
    assert alert["annotations"]["summary"] == "gpu-a07 should be drained: Xid 79"
    assert alert["annotations"]["description"] == "Xid 79"
    assert alert["generatorURL"] == "/hosts/gpu-a07/"
    assert abs(datetime.fromisoformat(alert["startsAt"]) - timezone.now()).total_seconds() < 60
    assert flagged[0]["labels"]["alertname"] == "FleetwatchCulpritFlagged"
    assert flagged[0]["labels"]["severity"] == "warning"
    assert flagged[0]["labels"]["culprit"] == "bad_node_hardware"
    assert "generatorURL" not in flagged[0]  # no link: none sent rather than an empty one
    assert all("X-Fleetwatch-Signature" not in r["headers"] for r in by_path["/api/v2/alerts"])
    for request in by_path["/signed/api/v2/alerts"]:
        header = request["headers"]["X-Fleetwatch-Signature"]
        assert verify_signature(signed.secret, header, request["body"])
    assert unsigned.secret == "" and signed.secret


def test_a_json_or_chat_destination_is_always_signed():
    made = NotificationDestination.objects.create(name="d", url="http://127.0.0.1:9/")
    assert len(made.secret) == 64 and made.secret_hint == f"…{made.secret[-4:]}"
    from django.core.exceptions import ValidationError
    from django.db import IntegrityError, transaction

    unsigned_chat = NotificationDestination(
        name="e", url="http://x.test/", format="chat", secret=""
    )
    with pytest.raises(ValidationError):
        unsigned_chat.full_clean()
    with pytest.raises(ValidationError):
        NotificationDestination(name="f", url="http://x.test/", events=["nope"]).full_clean()
    with pytest.raises(IntegrityError), transaction.atomic():
        NotificationDestination.objects.create(name="g", url="http://x.test/", secret="")


def test_a_400_fails_the_delivery_at_once_without_retries(receiver, sent):
    hook = receiver(answers=(400,))
    destination("strict", f"{hook.url}/strict")
    (delivery,) = sent("culprit_flagged", "culprit_flagged:x", "flagged", {"culprit": "c"})
    hook.wait_for(lambda rs: len(rs) == 1, "the one attempt")
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("failed", 1, 400)
    assert "HTTP 400" in delivery.last_error
    assert len(hook.requests) == 1


def test_a_429_is_retried(receiver, sent):
    hook = receiver(answers=(429,))
    destination("busy", f"{hook.url}/busy")
    (delivery,) = sent("regression", "regression:y", "back", {})
    hook.wait_for(lambda rs: len(rs) == 2, "the retry")
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("delivered", 2, 200)


@pytest.mark.parametrize("max_retries", [None, 2], ids=["default", "setting"])
def test_a_receiver_that_is_down_leaves_the_delivery_failed_after_the_last_retry(
    sent, settings, max_retries
):
    if max_retries is not None:
        settings.FLEETWATCH_NOTIFY_MAX_RETRIES = max_retries
    destination("down", closed_port_url())
    (delivery,) = sent("host_drain", "host_drain:gpu-a07:ever", "drain", {"host": "gpu-a07"})
    delivery.refresh_from_db()
    attempts = (8 if max_retries is None else max_retries) + 1
    assert (delivery.status, delivery.attempts) == ("failed", attempts)
    assert delivery.response_code is None and delivery.delivered_at is None
    assert f"attempt {attempts}:" in delivery.last_error
    assert f"gave up after {attempts} attempts" in delivery.last_error


def test_a_delivery_gone_or_already_delivered_is_left_alone(receiver, sent):
    hook = receiver(answers=())
    destination("once", f"{hook.url}/once")
    (delivery,) = sent("regression", "regression:z", "back", {})
    hook.wait_for(lambda rs: len(rs) == 1, "the delivery")
    notification_deliver.apply((delivery.pk,))
    notification_deliver.apply((delivery.pk + 1000,))
    assert len(hook.requests) == 1
    delivery.refresh_from_db()
    assert delivery.attempts == 1


def test_a_signature_older_than_the_tolerance_fails():
    body = b'{"a":1}'
    old = signature("s", body, int(time.time()) - 600)
    assert not verify_signature("s", old, body)
    assert verify_signature("s", old, body, tolerance_s=900)
    assert not verify_signature("s", "garbage", body)
    assert not verify_signature("", signature("", body), body)


# --- the events Fleetwatch notices itself --------------------------------------------------------


def run_job(upload, job, hosts, lagging=None, dmesg=None, world=4):
    scenario = JobScenario(job, hosts, world=world, lagging=lagging)
    for rank in range(world):
        upload(rank_log(scenario, rank), job=job, rank=rank, host=scenario.host_of(rank))
    for host, text in (dmesg or {}).items():
        upload(text, job=job, host=host, name=f"{host}-dmesg.log")
    return Incident.objects.get(job__external_id=job)


def test_a_host_turning_drain_is_notified_once(
    upload, receiver, make_key, django_capture_on_commit_callbacks
):
    from analysis.tasks import fleet_correlate

    run_job(upload, "sft-9", ["gpu-a", "gpu-x"], lagging=3, dmesg={"gpu-x": XID_79})
    hook = receiver()
    dest = destination("drains", f"{hook.url}/drains", events=["host_drain"])

    with django_capture_on_commit_callbacks(execute=True):
        fleet_correlate.apply()  # the recompute task notifies the hosts to drain
    hook.wait_for(lambda rs: any(r["status"] == 200 for r in rs), "the drain")
    (delivery,) = NotificationDelivery.objects.all()
    assert (delivery.event, delivery.status, delivery.attempts) == ("host_drain", "delivered", 2)
    assert delivery.key == "host_drain:gpu-x:ever"
    document = json.loads(hook.for_delivery(delivery)[-1]["body"])
    assert document["title"].startswith("gpu-x should be drained: GPU hardware fault")
    assert document["payload"]["host"] == "gpu-x" and document["payload"]["verdict"] == "drain"
    assert document["url"] == "/hosts/gpu-x/"
    last = hook.requests[-1]
    assert verify_signature(dest.secret, last["headers"]["X-Fleetwatch-Signature"], last["body"])

    with django_capture_on_commit_callbacks(execute=True):
        assert notify_host_verdicts() == []
    assert len(hook.requests) == 2 and NotificationDelivery.objects.count() == 1

    # Repaired, then drained again: a new event.
    operator = APIClient()
    operator.credentials(HTTP_AUTHORIZATION=f"Bearer {make_key('read', 'operate')}")
    assert operator.post("/api/v1/hosts/gpu-x/repaired", {}, format="json").status_code == 200
    with django_capture_on_commit_callbacks(execute=True):
        assert notify_host_verdicts() == []  # repaired: ok now
    run_job(upload, "sft-10", ["gpu-a", "gpu-x"], lagging=3, dmesg={"gpu-x": XID_79})
    with django_capture_on_commit_callbacks(execute=True):
        (again,) = notify_host_verdicts()
    assert again.key.startswith("host_drain:gpu-x:") and again.key != delivery.key
    hook.wait_for(lambda rs: len(rs) == 3, "the second drain")


PICKLE_REFUSED = b"\x80\x04\x8c\x02os\x8c\x06system\x93."


def test_uploads_failing_to_parse_are_notified_once_an_hour(upload, receiver):
    hook = receiver(answers=())
    destination("ingest", f"{hook.url}/ingest", events=["ingest_failing"])
    hour = timezone.now().hour
    first = upload(PICKLE_REFUSED, name="fr_rank0.pkl", host="gpu-p", job="pk-1").json()["id"]
    upload(PICKLE_REFUSED + b" ", name="fr_rank1.pkl", host="gpu-q", job="pk-1")
    hook.wait_for(lambda rs: len(rs) >= 1, "the failing uploads")
    if timezone.now().hour != hour:
        pytest.skip("the clock hour turned during the test")
    (delivery,) = NotificationDelivery.objects.all()
    assert delivery.event == "ingest_failing" and delivery.status == "delivered"
    assert delivery.key == f"ingest_failing:{delivery.created_at:%Y-%m-%dT%H}"
    payload = json.loads(hook.requests[0]["body"])["payload"]
    assert payload["upload"] == first and payload["host"] == "gpu-p" and payload["job"] == "pk-1"
    assert payload["failed_this_hour"] == 1 and "refused" in payload["error"]
    assert len(hook.requests) == 1


def test_notify_test_reaches_every_destination_whatever_its_filter(
    receiver, django_capture_on_commit_callbacks
):
    hook = receiver(answers=())
    destination("drains", f"{hook.url}/drains", events=["host_drain"])
    destination("off", f"{hook.url}/off", enabled=False)
    with django_capture_on_commit_callbacks(execute=True):
        call_command("notify_test")
    hook.wait_for(lambda rs: len(rs) == 1, "the test event")
    assert hook.requests[0]["path"] == "/drains"
    assert hook.requests[0]["headers"]["X-Fleetwatch-Event"] == "test"
    with django_capture_on_commit_callbacks(execute=True):
        call_command("notify_test", destination="off")  # named: sent though disabled
    hook.wait_for(lambda rs: len(rs) == 2, "the named destination's test")
    with pytest.raises(CommandError):
        call_command("notify_test", destination="nope")


# --- the page ------------------------------------------------------------------------------------


@pytest.fixture
def notifications_urls(settings):
    """The page's URLs beside the UI's, whether or not ui_urls includes them yet."""
    urls = types.ModuleType("notify_test_urls")
    urls.urlpatterns = [path("", include("fleet.notify_urls")), path("", include("fleet.urls"))]
    settings.ROOT_URLCONF = urls


def test_the_notifications_page_lists_destinations_and_deliveries_escaped(
    client, notifications_urls
):
    dest = destination("ops-<i>chat</i>", "http://127.0.0.1:9/hook", fmt="chat")
    NotificationDelivery.objects.create(
        destination=dest,
        event="culprit_flagged",
        key="k1",
        title="<script>alert('title')</script>",
        url="javascript:alert(1)",
        status="failed",
        attempts=3,
        response_code=400,
        last_error="HTTP 400: <img src=x onerror=alert(1)>",
    )
    assert client.get("/notifications/").status_code == 302  # login first

    client.force_login(User.objects.create_user("viewer"))
    page = client.get("/notifications/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "<script>alert(" not in html and "&lt;script&gt;alert(" in html
    assert "<img src=x" not in html and "&lt;img src=x" in html
    assert "<i>chat</i>" not in html and "ops-&lt;i&gt;chat&lt;/i&gt;" in html
    assert "javascript:" not in html
    assert dest.secret not in html and dest.secret[-4:] in html
    assert "culprit_flagged" in html and "400" in html


def test_the_sweep_sends_a_delivery_whose_message_was_lost_and_only_that_one(receiver):
    from datetime import timedelta

    from fleet.tasks import STUCK_AFTER_S, notifications_sweep

    hook = receiver(answers=())
    dest = destination("lost", hook.url + "/hook")
    old = timezone.now() - timedelta(seconds=STUCK_AFTER_S + 60)
    lost = NotificationDelivery.objects.create(
        destination=dest, event="regression", key="lost", title="t", payload={}
    )
    NotificationDelivery.objects.filter(pk=lost.pk).update(created_at=old)
    # Young, or already tried (its retry is scheduled): left to their own messages.
    NotificationDelivery.objects.create(
        destination=dest, event="regression", key="young", title="t", payload={}
    )
    tried = NotificationDelivery.objects.create(
        destination=dest, event="regression", key="tried", title="t", payload={}, attempts=1
    )
    NotificationDelivery.objects.filter(pk=tried.pk).update(created_at=old)
    assert notifications_sweep() == 1
    hook.wait_for(lambda r: len(r) == 1, "the lost delivery")
    assert hook.requests[0]["headers"]["X-Fleetwatch-Delivery"] == str(lost.pk)
    assert NotificationDelivery.objects.get(pk=lost.pk).status == "delivered"
