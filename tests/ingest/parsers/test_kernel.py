"""Kernel, driver and nvidia-smi lines about GPUs and PCIe."""

import pytest

from ingest.parsers import parse_log
from ingest.parsers.kernel import XID_CODES, xid_info


def events(text: str, kind: str):
    return parse_log(text.encode()).of_kind(kind)


XIDS = [
    (
        "dmesg, driver 450+ with name=",
        "[12345.678901] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen "
        "off the bus.",
        {"pci": "0000:3b:00", "code": 79, "pid": 1234, "process": "python", "primary": True},
    ),
    (
        "journalctl, driver without name=",
        "Mar 21 02:07:08 gpu-07 kernel: NVRM: Xid (PCI:0000:b7:00): 48, pid=2212, An "
        "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
        "partition 4, subpartition 0.",
        {"pci": "0000:b7:00", "code": 48, "pid": 2212, "process": "", "primary": True},
    ),
    (
        "old driver without PCI:",
        "[Thu Mar 21 02:07:08 2024] NVRM: Xid (0000:3b:00): 13, Graphics Exception: ESR "
        "0x505648=0x1000e 0x505650=0x0",
        {"pci": "0000:3b:00", "code": 13, "primary": False},
    ),
    (
        "driver 525+ with pid='<unknown>'",
        "[  512.1] NVRM: Xid (PCI:0000:ca:00): 119, pid='<unknown>', name=<unknown>, Timeout "
        "after 6s of waiting for RPC response from GPU1 GSP!",
        {"code": 119, "pid": None, "primary": True},
    ),
    (
        "MMU fault is usually the application",
        "[  99.5] NVRM: Xid (PCI:0000:18:00): 31, pid=5511, name=python3, Ch 00000018, intr "
        "10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f11_00000000.",
        {"code": 31, "process": "python3", "primary": False},
    ),
    (
        "NVLink",
        "[ 100.0] NVRM: Xid (PCI:0000:07:00): 74, pid=2861, name=python, NVLink: fatal error "
        "detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        {"code": 74, "primary": True},
    ),
]


@pytest.mark.parametrize(("what", "line", "expected"), XIDS, ids=[x[0] for x in XIDS])
def test_xid_lines_carry_the_code_the_gpu_and_nvidias_meaning(what, line, expected):
    (event,) = events(line, "gpu_xid")
    for name, value in expected.items():
        assert getattr(event, name) == value, name
    assert event.meaning


@pytest.mark.parametrize(
    "code", [13, 31, 32, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 140, 154]
)
def test_the_xid_table_knows_the_codes_seen_on_training_clusters(code):
    assert code in XID_CODES and XID_CODES[code].meaning


@pytest.mark.parametrize(
    ("code", "primary"),
    [
        (48, True),
        (74, True),
        (79, True),
        (92, True),
        (94, True),
        (95, True),
        (119, True),
        (120, True),
        (13, False),
        (31, False),
        (43, False),
        (45, False),
    ],
)
def test_hardware_faults_are_primary_and_application_errors_are_not(code, primary):
    assert xid_info(code).primary is primary


def test_an_unlisted_xid_is_kept_but_not_called_a_hardware_fault():
    (event,) = events("NVRM: Xid (PCI:0000:3b:00): 999, pid=1, name=x, something", "gpu_xid")
    assert event.code == 999 and event.primary is False


OFF_BUS = [
    "[  201.1] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
    "NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:20b0) has fallen off the bus and is not "
    "responding to commands.",
]


@pytest.mark.parametrize("line", OFF_BUS)
def test_a_gpu_fallen_off_the_bus_without_an_xid_is_reported(line):
    (event,) = events(line, "gpu_off_bus")
    assert event.pci == "0000:3b:00"


AER = [
    (
        "pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer, "
        "(Transmitter ID)",
        ("0000:00:03.0", "corrected", "Data Link Layer"),
    ),
    (
        "[  +0.000005] pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Data Link "
        "Layer, (Transmitter ID)",
        ("0000:00:03.0", "corrected", "Data Link Layer"),
    ),
    (
        "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction "
        "Layer, (Requester ID)",
        ("0000:3b:00.0", "uncorrected_nonfatal", "Transaction Layer"),
    ),
    (
        "pcieport 0000:16:02.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Physical "
        "Layer, (Receiver ID)",
        ("0000:16:02.0", "uncorrected_fatal", "Physical Layer"),
    ),
]


@pytest.mark.parametrize(("line", "expected"), AER)
def test_pcie_aer_errors_carry_device_severity_and_layer(line, expected):
    (event,) = events(line, "pcie_aer")
    assert (event.device, event.severity, event.error_type) == expected


UNREACHABLE = [
    (
        "Unable to determine the device handle for GPU0000:03:00.0: Unknown Error",
        ("0000:03:00", "Unknown Error"),
    ),
    (
        "Unable to determine the device handle for gpu 0000:3B:00.0: GPU is lost.  Reboot the "
        "system to recover this GPU",
        ("0000:3b:00", "GPU is lost"),
    ),
    (
        "NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0x65:1417)",
        ("0000:3b:00", "RmInitAdapter failed"),
    ),
]


@pytest.mark.parametrize(("line", "expected"), UNREACHABLE)
def test_gpus_the_driver_cannot_reach_are_reported(line, expected):
    (event,) = events(line, "gpu_unreachable")
    assert (event.pci, event.reason) == expected


CLOCKS = [
    ("[ 8123.456789] pcieport 0000:00:01.0: AER: Corrected error received", ("boot", 8123.456789)),
    ("[12.5] x", ("boot", 12.5)),
    # Day 71 of a leap year (syslog names no year), 04:11:09.
    ("Mar 12 04:11:09 gpu-node-17 kernel: pcieport …", ("syslog", 71 * 86400 + 15069.0)),
]


@pytest.mark.parametrize(("line", "expected"), CLOCKS)
def test_a_kernel_line_clock_is_read_in_its_own_kind(line, expected):
    from ingest.parsers.kernel import line_clock

    kind, seconds = line_clock(line)
    assert (kind, seconds) == (expected[0], pytest.approx(expected[1]))


def test_wall_clocks_of_dmesg_T_and_iso_journals_count_seconds_between_lines():
    from ingest.parsers.kernel import line_clock

    a = line_clock("[Tue Mar 12 04:11:09 2024] pcieport 0000:00:01.0: AER: …")
    b = line_clock("[Tue Mar 12 04:12:10 2024] pcieport 0000:00:01.0: AER: …")
    assert a[0] == b[0] == "wall" and b[1] - a[1] == 61
    c = line_clock("2024-03-12T04:11:09.250000+00:00 gpu-node-17 kernel: pcieport …")
    d = line_clock("2024-03-12T05:11:09.750000+01:00 gpu-node-17 kernel: pcieport …")
    assert c[0] == d[0] == "wall" and d[1] - c[1] == pytest.approx(0.5)
    e = line_clock("Feb 29 23:59:30 gpu-node-17 kernel: …")
    f = line_clock("Mar  1 00:00:30.5 gpu-node-17 kernel: …")
    assert e[0] == f[0] == "syslog" and f[1] - e[1] == pytest.approx(60.5)


@pytest.mark.parametrize(
    "line",
    ["pcieport 0000:00:01.0: AER: x", "[abc] x", "Foo 12 04:11:09 host", "Feb 45 01:02:03 h "],
)
def test_a_line_without_a_clock_has_none(line):
    from ingest.parsers.kernel import line_clock

    assert line_clock(line) is None


def test_an_aer_event_carries_its_line_clock():
    (event,) = events(
        "[ 8123.456789] pcieport 0000:00:01.0: PCIe Bus Error: severity=Corrected, "
        "type=Physical Layer, (Receiver ID)",
        "pcie_aer",
    )
    assert (event.clock, event.at) == ("boot", 8123.456789)
