"""Corrected PCIe errors name the node only at a rate NVIDIA calls a failing link (more than 8
replays a minute, DCGM's limit), on one device, in a job that failed (rule pcie_link_replaying).
The agent's NVML counters are held to the same rates (rule gpu_error_counters)."""

# ruff: noqa: E501 - log lines are kept as the software prints them

import json

import pytest

from analysis.classify import classify
from analysis.classify.rules import MAX_REPLAYS_PER_MINUTE
from ingest.parsers import parse_log
from ingest.parsers.hw_stats import parse_hw_stats

TIMEOUT = (
    "[rank1]:[E ProcessGroupNCCL.cpp:1537] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=25559040, NumelOut=25559040, "
    "Timeout(ms)=600000) ran for 600090 milliseconds before timing out.\n"
)


def aer(at: float, device: str = "0000:17:01.0") -> str:
    return (
        f"[{at:12.6f}] pcieport {device}: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
        "(Receiver ID)\n"
    )


def verdict_of(text: str):
    return classify(parse_log(text.encode()).events)


def named(text: str) -> str:
    v = verdict_of(text)
    return v.culprit if v.confidence >= 0.5 else "unknown"


def test_more_than_dcgms_limit_within_a_minute_on_one_link_names_the_node():
    burst = "".join(aer(5000 + 6 * i) for i in range(MAX_REPLAYS_PER_MINUTE + 1))  # 9 in 48 s
    v = verdict_of(burst + TIMEOUT)
    assert v.culprit == "bad_node_hardware"
    assert any(m.rule_id == "pcie_link_replaying" for m in v.matches)


@pytest.mark.parametrize(
    "lines",
    [
        # At the limit, not past it: 8 within a minute.
        [aer(5000 + 7 * i) for i in range(MAX_REPLAYS_PER_MINUTE)],
        # Nine, but spread over more than a minute.
        [aer(5000 + 8 * i) for i in range(MAX_REPLAYS_PER_MINUTE + 1)],
        # Nine within a minute, but over two links.
        [aer(5000 + i, "0000:17:01.0" if i % 2 else "0000:b7:01.0") for i in range(9)],
        # Many, without a clock: they cannot be placed within a minute.
        [aer(0).split("] ", 1)[1] for _ in range(40)],
        # Days apart, as a healthy link logs them now and then.
        [aer(5000 + 86400 * i) for i in range(12)],
    ],
    ids=["at-limit", "spread", "two-links", "no-clock", "days-apart"],
)
def test_corrected_errors_below_the_rate_accuse_nothing(lines):
    assert named("".join(lines) + TIMEOUT) == "unknown"


def test_a_replaying_link_in_a_job_that_did_not_fail_makes_no_incident():
    burst = "".join(aer(5000 + i) for i in range(30))
    v = verdict_of(burst + "Training completed. Saving final checkpoint\n")
    assert v.culprit == "unknown" or v.confidence < 0.5
    assert not any(m.rule_id == "pcie_link_replaying" for m in v.matches)


def test_syslog_and_boot_clocks_are_not_mixed():
    # Five with a boot clock and five with a syslog clock in the same second: two series of 5.
    boot = "".join(aer(5000 + i) for i in range(5))
    syslog = "".join(
        f"Mar 12 04:11:0{i} node-7 kernel: pcieport 0000:17:01.0: PCIe Bus Error: "
        "severity=Corrected, type=Physical Layer, (Receiver ID)\n"
        for i in range(5)
    )
    assert named(boot + syslog + TIMEOUT) == "unknown"


def counter_events(readings: list[tuple[float, int, int]]):
    """The agent's GPU readings of one GPU as (at, pcie_replay, nvlink_errors), one document each."""
    events = []
    for at, replays, nvlink in readings:
        doc = {
            "hw_stats": "fleetwatch.hw_stats/1",
            "host": "gpu-node-3",
            "at": at,
            "records": [
                {
                    "type": "gpu",
                    "index": 0,
                    "pci": "00000000:3B:00.0",
                    "pcie_replay": replays,
                    "nvlink_errors": nvlink,
                }
            ],
        }
        events += parse_hw_stats(json.dumps(doc).encode()).events
    return events


def counters_verdict(readings):
    return classify(list(parse_log(TIMEOUT.encode()).events) + counter_events(readings))


def test_replays_rising_faster_than_dcgms_limit_name_the_gpu():
    # +200 replays in 10 minutes: 20 a minute.
    v = counters_verdict([(1000.0, 50, 0), (1300.0, 150, 0), (1600.0, 250, 0)])
    assert any(m.rule_id == "gpu_error_counters" for m in v.matches)
    assert v.culprit == "bad_node_hardware"


@pytest.mark.parametrize(
    "readings",
    [
        # +200 replays over a day: far below 8 a minute.
        [(1000.0, 50, 0), (87400.0, 250, 0)],
        # A big absolute count that did not rise.
        [(1000.0, 9000, 0), (1600.0, 9000, 0)],
        # One reading: no rise, no rate.
        [(1000.0, 9000, 0)],
        # NVLink errors +3000 in 60 s: 50 a second, below the CRC limit a sum is held to.
        [(1000.0, 0, 100), (1060.0, 0, 3100)],
    ],
    ids=["slow", "flat", "single", "nvlink-below"],
)
def test_counters_below_the_rates_accuse_nothing(readings):
    v = counters_verdict(readings)
    assert not any(m.rule_id == "gpu_error_counters" for m in v.matches)


def test_nvlink_errors_above_dcgms_crc_rate_name_the_gpu():
    v = counters_verdict([(1000.0, 0, 0), (1060.0, 0, 60 * 150)])
    assert any(m.rule_id == "gpu_error_counters" for m in v.matches)
