"""The web UI: behind a login, log text shown as text, operators only for the workflow,
and a bounded number of queries per page whatever the size of the fleet."""

import gzip
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.core.files.base import ContentFile
from django.utils import timezone

from analysis.models import CulpritScore, Entity, Incident
from fleet.models import Attempt, Host, Job, RankPlacement
from ingest.models import Upload

pytestmark = pytest.mark.django_db

HOSTILE = "[rank0]: <script>alert(1)</script> Watchdog caught <b>bold</b>"


@pytest.fixture
def hostile_incident():
    job = Job.objects.create(external_id="job-<b>x</b>")
    attempt = Attempt.objects.create(job=job, world_size=2)
    return Incident.objects.create(
        attempt=attempt,
        job=job,
        summary="<script>alert('summary')</script>",
        evidence=[
            {"file": "<img src=x onerror=alert(1)>", "line": 3, "signal": "s", "text": HOSTILE}
        ],
        suspects=[{"kind": "rank", "id": "0", "why": "<iframe>"}],
        fingerprint="f1",
    )


@pytest.fixture
def artifact(hostile_incident):
    host = Host.objects.create(hostname="gpu-<b>01")
    lines = [f"line {n}" for n in range(1, 5001)]
    lines[2] = HOSTILE
    lines[9] = "x" * 50_000
    body = gzip.compress(("\n".join(lines) + "\n").encode())
    upload = Upload(
        sha256="a" * 64,
        size=len(body),
        compressed=True,
        filename="<img src=x onerror=alert(1)>",
        host=host,
        job=hostile_incident.job,
        attempt=hostile_incident.attempt,
        rank=0,
        status=Upload.Status.PARSED,
    )
    upload.blob.save("t.log.gz", ContentFile(body), save=False)
    upload.save()
    return upload


@pytest.fixture
def reader_client(client):
    client.force_login(User.objects.create_user("reader", password="x"))
    return client


def test_pages_need_a_login(client, hostile_incident):
    for url in ("/", "/incidents/", "/hosts/", "/culprits/", "/jobs/"):
        response = client.get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_every_page_shows_log_text_escaped(admin_client, hostile_incident, artifact):
    pages = {
        url: admin_client.get(url)
        for url in (
            "/",
            "/incidents/",
            f"/incidents/{hostile_incident.pk}/",
            "/hosts/",
            f"/hosts/{artifact.host.hostname}/",
            "/jobs/",
            f"/jobs/{hostile_incident.job_id}/",
            f"/artifacts/{artifact.pk}/?line=3",
        )
    }
    for url, response in pages.items():
        html = response.content.decode()
        assert response.status_code == 200, url
        assert "<script>alert" not in html and "<b>" not in html, url
        assert "<img src=x" not in html and "<iframe>" not in html, url
    page = pages[f"/incidents/{hostile_incident.pk}/"].content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "job-&lt;b&gt;x&lt;/b&gt;" in pages["/incidents/"].content.decode()
    viewer = pages[f"/artifacts/{artifact.pk}/?line=3"].content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in viewer


def test_an_evidence_line_links_to_the_artifact_at_that_line(
    admin_client, hostile_incident, artifact
):
    page = admin_client.get(f"/incidents/{hostile_incident.pk}/").content.decode()
    assert f'href="/artifacts/{artifact.pk}/?line=3#L3"' in page


def test_the_artifact_viewer_shows_a_bounded_window_of_a_gzip_blob(admin_client, artifact):
    html = admin_client.get(f"/artifacts/{artifact.pk}/?line=2000").content.decode()
    assert 'id="L2000" class="line target"' in html
    assert 'id="L1960"' in html and 'id="L2060"' in html
    assert 'id="L1959"' not in html and 'id="L2061"' not in html
    long = admin_client.get(f"/artifacts/{artifact.pk}/?line=10").content.decode()
    assert "line truncated" in long and "x" * 50_000 not in long
    assert 'id="L11"' in long  # the rest of the long line was skipped, not taken as lines
    end = admin_client.get(f"/artifacts/{artifact.pk}/?line=4990").content.decode()
    assert "end of file" in end and 'id="L5000"' in end


def test_incident_list_filters_and_sorts(admin_client, hostile_incident):
    assert "alert" in admin_client.get("/incidents/?culprit=unknown").content.decode()
    assert (
        "No incidents match" in admin_client.get("/incidents/?culprit=storage_io").content.decode()
    )
    assert (
        "alert" in admin_client.get("/incidents/?sort=confidence&since=2000-01-01").content.decode()
    )
    assert "No incidents match" in admin_client.get("/incidents/?until=2000-01-01").content.decode()
    partial = admin_client.get("/incidents/?culprit=unknown", HTTP_HX_REQUEST="true")
    assert b"<html" not in partial.content and b"alert" in partial.content


def test_incident_list_filters_by_host(admin_client, hostile_incident):
    host = Host.objects.create(hostname="gpu-a01")
    RankPlacement.objects.create(attempt=hostile_incident.attempt, rank=0, host=host)
    assert "alert" in admin_client.get("/incidents/?host=gpu-a01").content.decode()
    assert "No incidents match" in admin_client.get("/incidents/?host=gpu-b09").content.decode()


def test_a_missing_incident_is_a_404(admin_client):
    assert admin_client.get("/incidents/999/").status_code == 404


def test_login_page_renders_with_csrf(client):
    html = client.get("/accounts/login/").content.decode()
    assert "csrfmiddlewaretoken" in html


def test_operators_walk_an_incident_through_the_workflow(admin_client, hostile_incident):
    url = f"/incidents/{hostile_incident.pk}"
    assert admin_client.post(f"{url}/acknowledge/").status_code == 302
    admin_client.post(f"{url}/fix-applied/", {"note": "moved logs to tmpfs"})
    response = admin_client.post(
        f"{url}/reclassify/", {"culprit": "storage_io", "note": "rank 0 <b>logs</b>"}
    )
    assert response.status_code == 302
    admin_client.post(f"{url}/resolve/", {"note": "done"})
    incident = Incident.objects.get(pk=hostile_incident.pk)
    assert incident.status == "resolved" and incident.culprit == "storage_io"
    assert incident.classified_culprit == "unknown" and incident.acknowledged_by == "admin"
    assert incident.fix_applied_at is not None
    assert [j["action"] for j in incident.journal] == [
        "acknowledged",
        "fix applied",
        "reclassified unknown → storage_io",
        "resolved",
    ]
    page = admin_client.get(f"{url}/").content.decode()
    assert "rank 0 &lt;b&gt;logs&lt;/b&gt;" in page and "Acknowledge</button>" not in page


def test_a_reclassification_needs_a_note(admin_client, hostile_incident):
    admin_client.post(f"/incidents/{hostile_incident.pk}/reclassify/", {"culprit": "storage_io"})
    assert Incident.objects.get(pk=hostile_incident.pk).culprit == "unknown"


def test_htmx_workflow_returns_the_panel(admin_client, hostile_incident):
    response = admin_client.post(
        f"/incidents/{hostile_incident.pk}/acknowledge/", HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200 and b"acknowledged by admin" in response.content
    assert b"<html" not in response.content


def test_read_only_users_see_no_actions_and_cannot_post(reader_client, hostile_incident):
    page = reader_client.get(f"/incidents/{hostile_incident.pk}/").content.decode()
    assert "Acknowledge</button>" not in page and "Read-only" in page
    response = reader_client.post(f"/incidents/{hostile_incident.pk}/acknowledge/")
    assert response.status_code == 403
    assert Incident.objects.get(pk=hostile_incident.pk).status == "open"


def test_the_operators_group_grants_the_workflow(reader_client, hostile_incident):
    user = User.objects.get(username="reader")
    user.groups.add(Group.objects.create(name="operators"))
    assert reader_client.post(f"/incidents/{hostile_incident.pk}/acknowledge/").status_code == 302
    assert Incident.objects.get(pk=hostile_incident.pk).status == "acknowledged"


def test_forms_are_csrf_protected(hostile_incident):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("op", password="x"))
    assert client.post(f"/incidents/{hostile_incident.pk}/acknowledge/").status_code == 403
    page = client.get(f"/incidents/{hostile_incident.pk}/").content.decode()
    assert page.count("csrfmiddlewaretoken") >= 4


def test_operators_mark_a_host_repaired(admin_client, reader_client):
    Host.objects.create(hostname="gpu-a01")
    assert reader_client.post("/hosts/gpu-a01/repaired/").status_code == 403
    admin_client.post("/hosts/gpu-a01/repaired/", {"note": "reseated GPU 3"})
    assert "reseated GPU 3" in admin_client.get("/hosts/gpu-a01/").content.decode()


def test_the_similar_count_reads_as_the_nth_time(admin_client, hostile_incident):
    job = hostile_incident.job
    for n in range(1, 7):
        Incident.objects.create(
            attempt=Attempt.objects.create(job=job, number=n),
            job=job,
            fingerprint="f1",
            opened_at=hostile_incident.opened_at - timedelta(days=n),
        )
    page = admin_client.get(f"/incidents/{hostile_incident.pk}/").content.decode()
    assert "7th time" in page


def _fleet(n: int):
    """n incidents on n jobs over n hosts, with culprit scores: enough rows to show an N+1."""
    now = timezone.now()
    for i in range(n):
        host = Host.objects.create(hostname=f"gpu-{i:03d}")
        job = Job.objects.create(external_id=f"job-{i}")
        attempt = Attempt.objects.create(
            job=job,
            status=Attempt.Status.FAILED,
            started_at=now - timedelta(hours=2),
            ended_at=now - timedelta(hours=1),
        )
        RankPlacement.objects.create(attempt=attempt, rank=0, host=host)
        Incident.objects.create(attempt=attempt, job=job, culprit="storage_io", summary="s")
        entity = Entity.objects.create(kind="host", key=host.hostname)
        CulpritScore.objects.create(
            entity=entity,
            culprit="storage_io",
            score=1.0,
            implicated=1,
            exposed=1,
            baseline=0.1,
            explanation="e",
            incidents=[i],
            computed_at=now,
        )


@pytest.mark.parametrize(
    "url",
    ["/incidents/", "/incidents/?host=gpu-001&sort=confidence", "/hosts/", "/culprits/", "/jobs/"],
)
def test_list_pages_take_a_fixed_number_of_queries(
    admin_client, django_assert_max_num_queries, url
):
    _fleet(30)
    with django_assert_max_num_queries(8):
        assert admin_client.get(url).status_code == 200


def test_the_overview_and_detail_pages_take_few_queries(
    admin_client, django_assert_max_num_queries
):
    _fleet(30)
    incident = Incident.objects.first()
    with django_assert_max_num_queries(12):
        assert admin_client.get(f"/incidents/{incident.pk}/").status_code == 200
    with django_assert_max_num_queries(10):
        assert admin_client.get(f"/jobs/{incident.job_id}/").status_code == 200
    with django_assert_max_num_queries(10):
        assert admin_client.get(f"/culprits/{CulpritScore.objects.first().pk}/").status_code == 200
    # The overview pays host_health only for hosts implicated this week (none here).
    with django_assert_max_num_queries(12):
        assert admin_client.get("/").status_code == 200


def test_job_pages_show_time_lost(admin_client):
    _fleet(1)
    html = admin_client.get("/jobs/").content.decode()
    assert "1:00:00" in html


def test_the_host_page_shows_gpu_and_nic_counters_over_time_from_agent_uploads(
    admin_client, upload
):
    from agents import records

    for ecc in (0, 2):
        body = records.encode(
            records.document(
                [
                    {
                        "type": "gpu",
                        "pci": "0000:3b:00.0",
                        "index": 3,
                        "ecc_uncorrected_volatile": ecc,
                        "temperature_c": 71,
                    },
                    {"type": "nic", "device": "mlx5_2", "port": "1", "symbol_error": 40 + ecc},
                ],
                host="gpu-hw",
                job="j-hw",
                attempt=0,
                rank=None,
            )
        )
        assert (
            upload(
                body, host="gpu-hw", job="j-hw", name=f"hw-{ecc}.json", kind="hw_stats"
            ).status_code
            == 202
        )
    html = admin_client.get("/hosts/gpu-hw/").content.decode()
    assert "GPU counters over time" in html
    assert html.count("0000:3b:00.0") >= 2 and "<td>2</td>" in html
    assert "NIC counters over time" in html and "mlx5_2/1" in html and "<td>42</td>" in html


def _culprit(key: str = "gpu-007", kind: str = "host", **fields) -> CulpritScore:
    now = timezone.now()
    return CulpritScore.objects.create(
        entity=Entity.objects.create(kind=kind, key=key),
        culprit=fields.pop("culprit", "bad_node_hardware"),
        score=fields.pop("score", 9.0),
        flagged=True,
        implicated=3,
        exposed=4,
        baseline=0.01,
        explanation="ran the rank the others waited for in 3 of its 4 attempts",
        first_flagged_at=now - timedelta(hours=5),
        computed_at=now,
        **fields,
    )


def test_the_overview_says_who_owns_each_culprit_and_hides_what_is_dealt_with(admin_client):
    _culprit("gpu-owned", assignee="team:hw")
    _culprit("gpu-free")
    _culprit("gpu-done", status="resolved")
    _culprit("gpu-muted", status="muted")
    _culprit("gpu-later", snoozed_until=timezone.now() + timedelta(days=2))
    page = admin_client.get("/").content.decode()
    table = page[page.index("top-culprits") :]
    assert "host gpu-owned" in table and "team:hw" in table and "host gpu-free" in table
    for hidden in ("gpu-done", "gpu-muted", "gpu-later"):
        assert hidden not in table


def test_acknowledged_incidents_stay_on_the_overview_with_their_owner(
    admin_client, hostile_incident
):
    admin_client.post(f"/incidents/{hostile_incident.pk}/assign/", {"to": "me"})
    admin_client.post(f"/incidents/{hostile_incident.pk}/acknowledge/")
    page = admin_client.get("/").content.decode()
    assert "acknowledged" in page and f"/incidents/{hostile_incident.pk}/" in page
    assert Incident.objects.get(pk=hostile_incident.pk).assignee == "admin"


def test_an_operator_takes_a_culprit_resolves_it_with_a_note_and_drains_its_host(admin_client):
    score = _culprit("gpu-007")
    Host.objects.create(hostname="gpu-007")
    url = f"/culprits/{score.pk}"
    page = admin_client.get(f"{url}/").content.decode()
    assert "Assign to me</button>" in page and "Drain gpu-007</button>" in page
    admin_client.post(f"{url}/assign/", {"to": "me"})
    until = (timezone.now() + timedelta(days=3)).date().isoformat()
    admin_client.post(f"{url}/snooze/", {"until": until})
    admin_client.post(f"{url}/resolve/", {"note": "rack r008 <b>recabled</b>"})
    score.refresh_from_db()
    assert (score.status, score.assignee, score.resolved_by) == ("resolved", "admin", "admin")
    assert score.snoozed_until.date().isoformat() == until
    page = admin_client.get(f"{url}/").content.decode()
    assert "rack r008 &lt;b&gt;recabled&lt;/b&gt;" in page and "Reopen</button>" in page
    # Draining from the culprit page: a dry run says so, with the command it would run.
    drained = admin_client.post("/hosts/gpu-007/drain/", {"note": "culprit"}, follow=True)
    text = drained.content.decode()
    assert "Dry run: nothing ran" in text and "scontrol" in text


def test_a_snooze_in_the_past_or_not_a_date_is_refused_saying_why(admin_client):
    score = _culprit()
    url = f"/culprits/{score.pk}"
    for value, why in (("2001-01-01", "future"), ("next tuesday", "YYYY-MM-DD")):
        page = admin_client.post(f"{url}/snooze/", {"until": value}, follow=True)
        assert why in page.content.decode()
    score.refresh_from_db()
    assert score.snoozed_until is None and score.journal == []


def test_readers_cannot_take_a_culprit(reader_client):
    score = _culprit()
    assert "Assign to me" not in reader_client.get(f"/culprits/{score.pk}/").content.decode()
    assert reader_client.post(f"/culprits/{score.pk}/assign/", {"to": "me"}).status_code == 403


def test_a_setting_culprit_lists_the_failed_attempts_behind_it_and_a_fix(admin_client):
    job = Job.objects.create(external_id="tp8-job")
    attempt = Attempt.objects.create(job=job, status=Attempt.Status.FAILED)
    score = _culprit(
        "tensor_parallel=8 on H100",
        kind="config",
        culprit="parallelism_config",
        attempts=[attempt.pk],
    )
    page = admin_client.get(f"/culprits/{score.pk}/").content.decode()
    assert "tp8-job" in page and "No failed attempts recorded" not in page
    assert "Run the affected jobs without tensor_parallel=8 on H100" in page


def test_a_big_incident_shows_each_evidence_template_once_with_its_rank_ranges(admin_client):
    job = Job.objects.create(external_id="big-job")
    attempt = Attempt.objects.create(job=job, world_size=2048)
    line = (
        "[rank{r}]:[E1121 03:12:44.{r} ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=64058, OpType=ALLREDUCE, NumelIn=8, "
        "NumelOut=8, Timeout(ms)=600000) ran for 60{r:04d} milliseconds before timing out."
    )
    evidence = [
        {"file": f"rank{r}.log", "line": 7, "signal": "timeout", "text": line.format(r=r)}
        for r in range(2048)
        if r != 27
    ]
    evidence.insert(0, {"file": "gpu-9-dmesg.log", "line": 3, "signal": "xid", "text": "Xid 79"})
    incident = Incident.objects.create(attempt=attempt, job=job, evidence=evidence)
    page = admin_client.get(f"/incidents/{incident.pk}/").content.decode()
    assert "2047 lines, ranks 0–26, 28–2047, e.g.:" in page
    assert page.count("Watchdog caught collective operation timeout") == 1
    assert "Xid 79" in page


def test_the_rank_timeline_groups_ranks_by_what_they_did():
    from analysis.selectors import RankRow, rank_ranges, timeline_groups

    rows = [
        RankRow(
            rank=r,
            host=f"h{r // 8}",
            last_completed=64057,
            failed_seq=64058,
            op="ALLREDUCE",
            timed_out=True,
        )
        for r in range(2048)
        if r != 27
    ]
    rows.append(RankRow(rank=27, host="h3", last_completed=64057, lagged=True))
    groups = timeline_groups(rows)
    assert [(g["ranks"], g["state"], g["count"]) for g in groups] == [
        ("27", "lagged", 1),
        ("0–26, 28–2047", "timed out waiting", 2047),
    ]
    assert groups[1]["hosts"].endswith("and 253 more")
    assert rank_ranges([5, 1, 2, 3, 9]) == "1–3, 5, 9"


def test_a_rack_culprit_links_to_each_of_its_hosts(admin_client):
    for n in (1, 2):
        Host.objects.create(hostname=f"r008-n0{n}", rack="r008")
    Host.objects.create(hostname="r009-n01", rack="r009")
    score = _culprit("r008", kind="rack", culprit="network_transport")
    page = admin_client.get(f"/culprits/{score.pk}/").content.decode()
    assert 'href="/hosts/r008-n01/"' in page and 'href="/hosts/r008-n02/"' in page
    assert "r009-n01" not in page


def test_the_hosts_list_filters_by_verdict_and_sorts_by_last_incident(admin_client, upload):
    from fleet.demo import XID_79
    from tests.analysis.test_fleet_memory import run_job

    run_job(upload, "xid-job", ["gpu-ok", "gpu-xid"], dmesg={"gpu-xid": XID_79})
    Host.objects.create(hostname="gpu-idle")
    drained = admin_client.get("/hosts/", {"verdict": "drain"}).content.decode()
    assert "/hosts/gpu-xid/" in drained and "/hosts/gpu-idle/" not in drained
    by_incident = admin_client.get("/hosts/", {"sort": "-last_incident"}).content.decode()
    assert by_incident.index("/hosts/gpu-ok/") < by_incident.index("/hosts/gpu-idle/")
    assert "?host=gpu-xid" in by_incident  # the last incident links to the host's incidents


def test_the_search_box_goes_straight_to_what_it_names(admin_client, hostile_incident):
    Host.objects.create(hostname="gpu-a07", rack="r008")
    score = _culprit("r008", kind="rack")
    assert admin_client.get("/search/", {"q": str(hostile_incident.pk)}).url == (
        f"/incidents/{hostile_incident.pk}/"
    )
    assert admin_client.get("/search/", {"q": "gpu-a07"}).url == "/hosts/gpu-a07/"
    job = hostile_incident.job
    assert admin_client.get("/search/", {"q": job.external_id}).url == f"/jobs/{job.pk}/"
    assert admin_client.get("/search/", {"q": "r008"}).url == f"/culprits/{score.pk}/"
    page = admin_client.get("/search/", {"q": "a0"}).content.decode()
    assert 'href="/hosts/gpu-a07/"' in page
    hostile = admin_client.get("/search/", {"q": "<script>x</script>"}).content.decode()
    assert "<script>x</script>" not in hostile and "&lt;script&gt;" in hostile


def test_the_overview_and_hosts_list_take_few_queries_with_hundreds_of_implicated_hosts(
    admin_client, django_assert_max_num_queries
):
    from analysis.models import Implication

    now = timezone.now()
    job = Job.objects.create(external_id="wide-job")
    incident = Incident.objects.create(
        attempt=Attempt.objects.create(job=job, status=Attempt.Status.FAILED),
        job=job,
        culprit="bad_node_hardware",
    )
    for i in range(300):
        host = Host.objects.create(hostname=f"gpu-{i:04d}")
        for key in (host.hostname, f"{host.hostname}/0000:3b:00"):
            Implication.objects.create(
                incident=incident,
                entity=Entity.objects.create(kind="host" if "/" not in key else "gpu", key=key),
                culprit="bad_node_hardware",
                rule_id="gpu_hardware_fault" if i % 50 == 0 else "lagging_rank",
                confidence=0.9 if i % 50 == 0 else 0.3,
                at=now,
            )
    with django_assert_max_num_queries(14):
        page = admin_client.get("/").content.decode()
    assert "gpu-0000" in page and "verdict-drain" in page
    with django_assert_max_num_queries(12):
        hosts = admin_client.get("/hosts/").content.decode()
    assert hosts.count("verdict-drain") == 1  # gpu-0000 on the first page of 50


def test_the_culprit_list_filters_by_state_and_owner_and_a_host_links_to_its_culprits(
    admin_client,
):
    host = Host.objects.create(hostname="gpu-007", rack="r008")
    mine = _culprit("gpu-007", assignee="admin")
    _culprit("r008", kind="rack", status="resolved")
    _culprit("gpu-free")
    listed = admin_client.get("/culprits/", {"owner": "mine"}).content.decode()
    assert f"/culprits/{mine.pk}/" in listed and "gpu-free" not in listed
    resolved = admin_client.get("/culprits/", {"status": "resolved"}).content.decode()
    assert "rack r008" in resolved and "gpu-007" not in resolved
    page = admin_client.get(f"/hosts/{host.hostname}/").content.decode()
    assert f"/culprits/{mine.pk}/" in page and "rack r008" in page


def test_a_fix_renders_its_code_spans_and_nothing_else_as_markup(admin_client, hostile_incident):
    Incident.objects.filter(pk=hostile_incident.pk).update(
        fix="Set `NCCL_SOCKET_IFNAME=eth0` <b>now</b>"
    )
    page = admin_client.get(f"/incidents/{hostile_incident.pk}/").content.decode()
    assert "<code>NCCL_SOCKET_IFNAME=eth0</code> &lt;b&gt;now&lt;/b&gt;" in page
