"""Pure tests of the agent's parts: spool, follower, config, uploader, records and rules."""

from __future__ import annotations

import json
import os
import random

import pytest

from agents import records
from agents.config import ConfigError, load_config
from agents.follow import Follower
from agents.spool import Spool
from agents.uploader import Uploader, full_jitter
from analysis.classify import IncidentContext, classify
from ingest.parsers import parse_artifact

from .fake_server import FakeServer


def test_a_spooled_item_is_whole_after_reopening_and_temp_files_of_dead_writers_go(tmp_path):
    spool = Spool(tmp_path)
    spool.put({"job": "j", "kind": "log"}, b"line 1\nline 2\n")
    (tmp_path / ".tmp-dead.item.1.abc").write_bytes(b"half")
    os.utime(tmp_path / ".tmp-dead.item.1.abc", (0, 0))
    again = Spool(tmp_path)
    (item,) = list(again.items())
    assert item.header == {"job": "j", "kind": "log"}
    assert item.body() == b"line 1\nline 2\n"
    again.enforce_bounds()
    assert not list(tmp_path.glob(".tmp-*"))


def test_a_full_spool_drops_the_oldest_first_and_remembers_how_many(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 16, max_items=3)
    for i in range(5):
        spool.enforce_bounds(incoming=10)
        spool.put({"i": i}, b"x" * 10)
    assert [it.header["i"] for it in spool.items()] == [2, 3, 4]
    state = Spool(tmp_path).state()
    assert state.dropped_items == 2 and state.dropped_bytes > 0


def test_a_damaged_item_is_dropped_and_counted_not_sent(tmp_path):
    spool = Spool(tmp_path)
    (tmp_path / "00000000000000000001-1-aaaaaa.item").write_bytes(b"not json\nbody")
    assert list(spool.items()) == []
    assert Spool(tmp_path).state().dropped_items == 1


def test_the_follower_ships_whole_lines_across_rotation_and_truncation(tmp_path):
    log = tmp_path / "rank0.log"
    log.write_bytes(b"a1\na2\npartial")
    follower = Follower([str(tmp_path / "*.log")], chunk_bytes=1 << 20, flush_s=0)
    assert [c.body for c in follower.poll(0)] == [b"a1\na2\n"]
    with log.open("ab") as f:
        f.write(b" line\n")
    log.rename(tmp_path / "rank0.log.1")  # rotation: the rest of the old file still ships
    log.write_bytes(b"b1\n")
    bodies = [c.body for c in follower.poll(1)]
    assert bodies == [b"partial line\n", b"b1\n"]
    log.write_bytes(b"c\n")  # copytruncate: smaller than our offset
    assert [c.body for c in follower.poll(2)] == [b"c\n"]
    with log.open("r+b") as f:  # rewritten in place, same size and more
        f.write(b"d\nd2\n")
    assert [c.body for c in follower.poll(3)] == [b"d\nd2\n"]


def test_the_follower_resumes_at_the_saved_offset_of_the_same_file_only(tmp_path):
    log = tmp_path / "r1.log"
    log.write_bytes(b"one\ntwo\n")
    first = Follower([str(log)], flush_s=0)
    first.poll(0)
    with log.open("ab") as f:
        f.write(b"three\n")
    resumed = Follower([str(log)], flush_s=0, offsets=first.offsets())
    assert [c.body for c in resumed.poll(1)] == [b"three\n"]
    log.unlink()
    log.write_bytes(b"new file\n")
    other = Follower([str(log)], flush_s=0, offsets=resumed.offsets())
    assert [c.body for c in other.poll(2)] == [b"new file\n"]


def test_config_reads_toml_and_ini_and_the_environment_wins(tmp_path):
    toml = tmp_path / "agent.toml"
    toml.write_text(
        '[agent]\nserver = "http://fw:8000"\nlogs = ["/a/*.log", "/b.log"]\npoll_s = 2\n'
    )
    config = load_config(toml, environ={"FLEETWATCH_POLL_S": "0.5"})
    assert config.server == "http://fw:8000" and config.logs == ("/a/*.log", "/b.log")
    assert config.poll_s == 0.5
    ini = tmp_path / "agent.ini"
    ini.write_text("[agent]\nlogs = /a.log, /b.log\nio_idle = no\n")
    assert load_config(ini, environ={}).logs == ("/a.log", "/b.log")
    assert load_config(ini, environ={}).io_idle is False
    with pytest.raises(ConfigError):
        load_config(environ={"FLEETWATCH_POLL_S": "soon"})
    with pytest.raises(ConfigError):
        load_config(environ={"FLEETWATCH_SERVER": "fw:8000"})


def test_full_jitter_stays_under_the_exponential_cap():
    rng = random.Random(1)
    delays = [full_jitter(n, 1.0, 60.0, rng) for n in range(12) for _ in range(50)]
    assert all(0 <= d <= 60 for d in delays)
    assert max(full_jitter(2, 1.0, 60.0, rng) for _ in range(200)) <= 4


def test_the_uploader_honours_retry_after_and_the_servers_idempotency(tmp_path):
    with FakeServer() as server:
        config = load_config(environ={}, server=server.url, key="k", host="h1")
        spool = Spool(tmp_path)
        now = [100.0]
        uploader = Uploader(config, spool, clock=lambda: now[0], rng=random.Random(0))
        header = records.upload_header(
            host="h1", job="j", attempt=0, rank=0, kind="log", filename="r0.log"
        )
        spool.put(header, b"hello\n")
        server.fail_next = [(503, {"Retry-After": "30"})]
        assert uploader.drain() == 0
        assert not uploader.ready() and uploader.not_before >= 130
        now[0] += 31
        assert uploader.drain() == 1
        # The same bytes again (a crash between the answer and the unlink): a duplicate.
        spool.put(header, b"hello\n")
        assert uploader.drain() == 1
        assert len(server.accepted) == 1 and uploader.stats.duplicates == 1
        server.fail_next = [(400, {})]
        spool.put(header, b"refused\n")
        assert uploader.drain() == 1 and not spool.names()
        assert spool.state().extra["rejected"] == 1


def _doc(*recs, rank=None, host="gpu-7"):
    return records.encode(records.document(list(recs), host=host, job="j", attempt=0, rank=rank))


def test_hw_stats_documents_parse_to_events_and_say_when_a_reader_could_not_look():
    body = _doc(
        {"type": "reader", "reader": "nvml", "available": False, "reason": "no NVIDIA driver"},
        {"type": "host", "cpu_percent": 12, "mem_percent": 40, "disks": [{"device": "sda"}]},
        {"type": "mystery"},
    )
    parsed = parse_artifact(body, kind="hw_stats", source="hw.json")
    kinds = [e.kind for e in parsed.events]
    assert kinds == ["reader_status", "host_stats"]
    assert "unavailable (no NVIDIA driver)" in parsed.events[0].text
    assert len(parsed.issues) == 1
    assert parse_artifact(b"{not json", kind="hw_stats").issues


def _events(*bodies):
    out = []
    for body in bodies:
        out += parse_artifact(body, kind="hw_stats", source="hw.json").events
    return out


HW_CASES = [
    # (records over time, expected culprit, rule id)
    (
        [
            {"type": "gpu", "pci": "0000:3b:00.0", "ecc_uncorrected_volatile": 0},
            {"type": "gpu", "pci": "0000:3b:00.0", "ecc_uncorrected_volatile": 3},
        ],
        "bad_node_hardware",
        "gpu_error_counters",
    ),
    (
        [{"type": "gpu", "pci": "0000:3b:00.0", "row_remap": {"pending": True}}],
        "bad_node_hardware",
        "gpu_error_counters",
    ),
    (
        [
            {"type": "gpu", "pci": "0000:3b:00.0", "ecc_uncorrected_volatile": 5},
            {"type": "gpu", "pci": "0000:3b:00.0", "ecc_uncorrected_volatile": 5},
        ],
        "unknown",
        None,
    ),
]


@pytest.mark.parametrize(("recs", "culprit", "rule"), HW_CASES)
def test_gpu_counter_rules(recs, culprit, rule):
    events = _events(*[_doc(r) for r in recs])
    verdict = classify(events, IncidentContext())
    assert verdict.culprit == culprit
    if rule:
        # Rising counters explain a failure but are none: alone they open no incident.
        assert rule in verdict.rule_ids and not verdict.failed


def _stall():
    return {"type": "progress_stall", "rank": 1, "silent_s": 120, "median_step_s": 2}


def test_host_exhaustion_and_disk_saturation_name_their_class_only_with_a_stall_or_timeout():
    hot = {"type": "host", "cpu_percent": 99, "load1_per_core": 3.0, "mem_percent": 97}
    disk = {"type": "host", "disks": [{"device": "nvme0n1", "busy_percent": 99, "await_ms": 80}]}
    assert classify(_events(_doc(hot)), IncidentContext()).culprit == "unknown"
    assert classify(_events(_doc(hot, _stall())), IncidentContext()).culprit == "dataloader_cpu"
    assert classify(_events(_doc(disk, _stall())), IncidentContext()).culprit == "storage_io"


def test_throttling_on_the_lagging_ranks_gpu_is_named():
    throttled = {
        "type": "gpu",
        "pci": "0000:3b:00.0",
        "rank": 1,
        "throttle_reasons": ["hw_thermal"],
    }
    verdict = classify(_events(_doc(throttled, _stall())), IncidentContext())
    assert verdict.culprit == "unknown"  # no lagging rank known: only a weak sign
    assert any(a.culprit == "bad_node_hardware" for a in verdict.alternatives)


def test_ranks_with_different_steps_per_epoch_are_a_desync_before_any_timeout():
    def order(rank, steps, fp):
        return {"type": "data_order", "rank": rank, "epoch": 0, "dataset_len": steps * 2,
                "steps": steps, "dataset_fingerprint": fp}  # fmt: skip

    same = _events(_doc(order(0, 12, "a")), _doc(order(1, 12, "a")))
    assert not classify(same, IncidentContext()).failed
    split = _events(_doc(order(0, 12, "a")), _doc(order(1, 11, "b")), _doc(order(2, 12, "a")))
    verdict = classify(split, IncidentContext())
    assert verdict.culprit == "rank_desync_code" and verdict.failed
    assert next(s.id for s in verdict.suspects if s.kind == "rank") == "1"
    content = _events(_doc(order(0, 12, "a")), _doc(order(1, 12, "b")))
    assert "different data" in classify(content, IncidentContext()).summary


def test_records_round_trip_through_json():
    doc = json.loads(_doc({"type": "agent", "spool_dropped_items": 4}))
    assert doc["hw_stats"] == records.FORMAT
    (event,) = _events(_doc({"type": "agent", "spool_dropped_items": 4}))
    assert event.dropped_items == 4


def test_ib_port_counters_are_read_from_sysfs_and_absence_is_reported(tmp_path):
    from agents.readers import IbPorts

    assert IbPorts(str(tmp_path / "none")).read()[0]["available"] is False
    port = tmp_path / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "counters" / "symbol_error").write_text("7\n")
    (port / "counters" / "link_downed").write_text("2\n")
    (port / "state").write_text("4: ACTIVE\n")
    (nic,) = IbPorts(str(tmp_path)).read()
    assert (nic["device"], nic["port"], nic["symbol_error"], nic["link_downed"]) == (
        "mlx5_0",
        "1",
        7,
        2,
    )
    assert nic["port_rcv_errors"] is None and nic["state"] == "4: ACTIVE"
    parsed = parse_artifact(_doc(nic), kind="hw_stats", source="hw.json")
    (event,) = parsed.events
    assert event.kind == "nic_health" and event.symbol_error == 7 and event.device == "mlx5_0"


@pytest.mark.parametrize(
    ("pg_timeout_s", "silent_s", "dumped"),
    [(6.0, 4.0, True), (None, 4.0, False), (6.0, 2.0, False)],
)
def test_a_silent_rank_is_dumped_at_half_its_process_groups_timeout(
    tmp_path, pg_timeout_s, silent_s, dumped
):
    """A fixed 30 s stall trigger never fired before a 6 s collective timeout; with the job's
    timeout in its heartbeat the agent asks at half of it, and never sooner."""
    from agents.agent import Agent

    config = load_config(
        environ={},
        spool_dir=str(tmp_path / "spool"),
        run_dir=str(tmp_path / "run"),
        kernel_logs=(),
        ib_sysfs=str(tmp_path / "no-ib"),
    )
    agent = Agent(config, clock=lambda: 1000.0)
    agent.heartbeats = [
        {
            "job": "j",
            "attempt": 0,
            "rank": 1,
            "pid": os.getpid(),
            "steps": 40,
            "median_step_s": 0.05,
            "last_step_at": 1000.0 - silent_s,
            "finished": False,
            "pg_timeout_s": pg_timeout_s,
        }
    ]
    asked = []
    agent.request_dump = lambda beat: asked.append(beat["rank"]) or True
    agent._check_stalls(1000.0)
    assert bool(asked) == dumped


def test_status_says_what_the_spool_holds_for_each_job(tmp_path, monkeypatch, capsys):
    from agents.cli import main

    spool = Spool(tmp_path / "spool")
    for job, n in (("job-a", 2), ("job-b", 1)):
        for i in range(n):
            spool.put(
                records.upload_header(
                    host="h", job=job, attempt=0, rank=i, kind="log", filename=f"rank{i}.log"
                ),
                b"x" * 100,
            )
    spool.put(records.attempt_header(job="job-a", attempt=0, event="start"), b"{}")
    monkeypatch.setenv("FLEETWATCH_SPOOL_DIR", str(tmp_path / "spool"))
    assert main(["status"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["items"] == 4
    assert {job: row["items"] for job, row in status["by_job"].items()} == {
        "job-a#0": 3,
        "job-b#0": 1,
    }


def test_two_jobs_writing_into_one_directory_each_get_their_own_logs(tmp_path):
    """Each rank's heartbeat names the file behind its stdout; a file nothing ties to a job is
    held while two jobs run here, never shipped under the newest job's name."""
    import time as clock

    from agents.agent import Agent

    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("a0.log", "b0.log", "stray.log"):
        (logs / name).write_text(f"{name} line\n")
    progress = tmp_path / "run" / "progress"
    progress.mkdir(parents=True)
    now = clock.time()
    for job, name in (("job-a", "a0.log"), ("job-b", "b0.log")):
        (progress / f"{job}.0.0.json").write_text(
            json.dumps(
                {
                    "job": job,
                    "attempt": 0,
                    "rank": 0,
                    "pid": os.getpid(),
                    "updated_at": now,
                    "outputs": [str((logs / name).resolve())],
                }
            )
        )
    config = load_config(
        environ={},
        spool_dir=str(tmp_path / "spool"),
        run_dir=str(tmp_path / "run"),
        logs=(str(logs / "*.log"),),
        kernel_logs=(),
        ib_sysfs=str(tmp_path / "no-ib"),
        log_flush_s=0.0,
    )
    agent = Agent(config)
    agent.scan_heartbeats(now)
    agent.collect_logs(now, final=True)
    shipped = {
        (i.header["job"], i.header["source"].rsplit("/", 1)[-1])
        for i in Spool(tmp_path / "spool").items()
    }
    assert shipped == {("job-a", "a0.log"), ("job-b", "b0.log")}
    assert str(logs / "stray.log") in agent.unattributed
