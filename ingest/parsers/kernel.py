"""Kernel and driver lines: NVIDIA Xid errors, GPUs fallen off the bus, PCIe AER, nvidia-smi.

Lines arrive from ``dmesg`` (``[12345.678901] NVRM: …``, ``dmesg -T`` / ``-H`` timestamps),
``journalctl -k`` / syslog (``Mar 21 02:07:08 host kernel: NVRM: …``) or pasted nvidia-smi
output; the message is matched anywhere in the line. The line's clock is read where a rate
matters (corrected PCIe errors): seconds since boot from ``dmesg``, wall time from ``dmesg -T``,
syslog and ISO 8601 journals; each kind is kept apart, since their zeros differ.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from .events import Event, GpuOffBus, GpuUnreachable, GpuXid, KernelBoot, PcieAer
from .lines import Line
from .prefix import Prefix

# "NVRM" covers every driver line; AER and nvidia-smi errors say "Error". nvidia-smi's
# "device handle … GPU is lost" has neither, and lives in small files: the head is enough.
TRIGGERS: tuple[bytes, ...] = (b"NVRM", b"Error", b"Linux version")
HEAD_TRIGGERS: tuple[bytes, ...] = (b"device handle",)


@dataclass(frozen=True, slots=True)
class XidCode:
    name: str
    meaning: str
    primary: bool  # a hardware fault by itself (drain the node) vs. usually app error/follow-on


# NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors), the codes that show up on
# training clusters. "primary" follows NVIDIA's own triage: hardware/driver faults that need the
# node looked at, against codes that are usually caused by the application or by another fault.
XID_CODES: dict[int, XidCode] = {
    8: XidCode("GPU stopped processing", "GPU channel timeout (driver or app)", False),
    13: XidCode(
        "Graphics Engine Exception",
        "illegal instruction/address in a kernel; usually "
        "an application bug or a follow-on of another fault",
        False,
    ),
    31: XidCode(
        "GPU memory page fault",
        "MMU fault: a kernel touched an invalid address; usually an application bug",
        False,
    ),
    32: XidCode(
        "Invalid or corrupted push buffer stream", "DMA/PCIe corruption between host and GPU", True
    ),
    38: XidCode("Driver firmware error", "driver firmware error", True),
    43: XidCode(
        "GPU stopped processing", "a channel was reset after an application fault; follow-on", False
    ),
    45: XidCode(
        "Preemptive cleanup",
        "channels cleaned up after a process was killed or another fault; follow-on",
        False,
    ),
    48: XidCode("Double Bit ECC Error", "uncorrectable (double-bit) ECC error in GPU memory", True),
    56: XidCode("Display engine error", "display engine error", True),
    57: XidCode("Error programming video memory interface", "memory interface error", True),
    61: XidCode("Internal micro-controller breakpoint/warning", "PMU/firmware halt", True),
    62: XidCode("Internal micro-controller halt", "PMU/firmware halt", True),
    63: XidCode(
        "ECC page retirement or row remapping recording event",
        "a memory page was retired or a row remapped after ECC errors; schedule a reset",
        True,
    ),
    64: XidCode(
        "ECC page retirement or row remapper recording failure",
        "retirement/remapping could not be recorded; replace the GPU",
        True,
    ),
    68: XidCode("NVDEC0 Exception", "video decoder exception", False),
    69: XidCode(
        "Graphics Engine class error",
        "graphics engine class error; usually application or follow-on",
        False,
    ),
    74: XidCode("NVLink Error", "NVLink error (link down, CRC/replay errors)", True),
    79: XidCode("GPU has fallen off the bus", "the GPU stopped answering on PCIe", True),
    92: XidCode("High single-bit ECC error rate", "high correctable ECC error rate", True),
    94: XidCode(
        "Contained ECC error",
        "uncorrectable ECC error contained to the application; reset the GPU",
        True,
    ),
    95: XidCode(
        "Uncontained ECC error",
        "uncorrectable ECC error not contained; all "
        "applications on the GPU affected; reset the GPU",
        True,
    ),
    109: XidCode("Context Switch Timeout Error", "context switch timeout", False),
    119: XidCode("GSP RPC Timeout", "the GPU System Processor did not answer the driver", True),
    120: XidCode("GSP Error", "GPU System Processor error", True),
    121: XidCode("C2C Link Error", "chip-to-chip link error (Grace Hopper)", True),
    122: XidCode("SPI PMU RPC read failure", "PMU communication failure", True),
    123: XidCode("SPI PMU RPC write failure", "PMU communication failure", True),
    140: XidCode("Unrecovered ECC error", "ECC error the GPU could not recover from", True),
    143: XidCode("GPU initialization failure", "GPU failed to initialise", True),
    144: XidCode("NVLink SAW error", "NVLink/NVSwitch error", True),
    145: XidCode("NVLink RLW error", "NVLink/NVSwitch error", True),
    149: XidCode("NVLink NETIR error", "NVLink fabric error", True),
    154: XidCode(
        "GPU recovery action changed",
        "the driver asks for a GPU reset, node reboot or drain-and-reset to recover",
        True,
    ),
}

# Xid, every driver era:
#   <= 450: "NVRM: Xid (0000:3b:00): 13, Graphics Exception: …"
#   450+  : "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
#   older 4xx and some codes print no "name=": "NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, An
#   uncorrectable double bit error (DBE) has been detected on GPU …"
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})[^)]*\):\s*"
    r"(?P<code>\d+),\s*(?:pid=(?P<pid>'?<?\w+>?'?),\s*)?(?:name=(?P<name>[^,]*),\s*)?"
    r"(?P<detail>.*?)\s*$"
)
# "NVRM: GPU at PCI:0000:3b:00: GPU-8c3e…" then "NVRM: GPU Board Serial Number: …" then
# "NVRM: Xid (PCI:0000:3b:00): 79, …" (418+); without an Xid (older or when the bus dropped
# before the driver could tell): "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus." and
# "NVRM: The NVIDIA GPU 0000:3b:00.0 … has fallen off the bus and is not responding".
_OFF_BUS = re.compile(
    r"NVRM: (?:The NVIDIA )?GPU (?:at )?(?:PCI:)?(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:"
    r"[0-9a-fA-F]{2}(?:\.\d)?).*fallen off the bus"
)
# "NVRM: RmInitAdapter failed! (0x26:0x65:1417)" and "NVRM: GPU 0000:3b:00.0: RmInitAdapter
# failed! (…)" (all drivers): the driver could not bring the GPU up.
_RM_INIT = re.compile(
    r"NVRM: (?:GPU (?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?): )?"
    r"RmInitAdapter failed"
)
# AER, kernel 3.x - 6.x:
#   "pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer,
#    (Transmitter ID)" (4.x+; 3.x put "id=00e0(Receiver ID)" at the end)
#   "… severity=Uncorrected (Non-Fatal), type=Transaction Layer, …", newer kernels (6.x) print
#   "severity=Correctable" / "Uncorrectable (Fatal)".
_AER = re.compile(
    r"(?:(?P<dev>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d)\s*:\s*)?"
    r"PCIe Bus Error: severity=(?P<sev>[^,]+),\s*type=(?P<type>[^,(]+)"
)
# nvidia-smi: "Unable to determine the device handle for GPU 0000:03:00.0: Unknown Error" and
# "… for gpu 0000:3B:00.0: GPU is lost.  Reboot the system to recover this GPU" (all versions;
# some omit the space after "GPU").
_SMI_HANDLE = re.compile(
    r"Unable to determine the device handle for (?:GPU|gpu)\s*"
    r"(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?):\s*(?P<reason>[^.]*)"
)


# The banner every Linux kernel prints first at boot (init/version.c linux_banner):
# "Linux version 5.15.0-119-generic (buildd@lcy02-amd64-075) (gcc …) #129-Ubuntu SMP …".
_BOOT = re.compile(r"\bLinux version \d+\.\d+\S* \(")

# Line clocks, at the start of the line (after a file label the agent may add):
#   dmesg                 "[ 8123.456789] pcieport …"            seconds since boot
#   dmesg -T              "[Tue Mar 12 04:11:09 2024] pcieport …"
#   syslog / journalctl   "Mar 12 04:11:09 gpu-node-17 kernel: …" (no year)
#   journalctl -o short-iso(-precise) "2024-03-12T04:11:09.123456+00:00 gpu-node-17 kernel: …"
_BOOT_CLOCK = re.compile(r"^\s*\[\s*(\d+\.\d+)\]")
_DMESG_T = re.compile(
    r"^\s*\[(?:[A-Z][a-z]{2} )?([A-Z][a-z]{2})\s+(\d{1,2}) (\d\d):(\d\d):(\d\d)(?:\.\d+)? (\d{4})\]"
)
_SYSLOG = re.compile(r"^\s*([A-Z][a-z]{2})\s+(\d{1,2}) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?\s")
_ISO = re.compile(r"^\s*(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)")
_MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTHS = {m: i for i, m in enumerate(_MONTH_NAMES, 1)}


def line_clock(text: str) -> tuple[str, float] | None:
    """(kind, seconds) of a kernel line's timestamp: "boot" (dmesg), "wall" (dmesg -T, ISO),
    "syslog" (month and day without a year). Seconds compare only within one kind."""
    m = _BOOT_CLOCK.match(text)
    if m:
        return "boot", float(m.group(1))
    m = _DMESG_T.match(text)
    if m and m.group(1) in _MONTHS:
        mon, day, hh, mm, ss, year = m.groups()
        try:
            when = datetime(int(year), _MONTHS[mon], int(day), int(hh), int(mm), int(ss))
        except ValueError:
            return None
        return "wall", when.timestamp()
    m = _ISO.match(text)
    if m:
        value = m.group(1).replace(" ", "T").replace("Z", "+00:00")
        try:
            return "wall", datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    m = _SYSLOG.match(text)
    if m and m.group(1) in _MONTHS:
        mon, day, hh, mm, ss, frac = m.groups()
        if not 1 <= int(day) <= 31:
            return None
        days = _MONTH_START[_MONTHS[mon]] + int(day) - 1
        seconds = days * 86400 + int(hh) * 3600 + int(mm) * 60 + int(ss)
        return "syslog", seconds + (float("0." + frac) if frac else 0.0)
    return None


# Day of the year each month starts on (a leap year: syslog does not say which year it is).
_MONTH_START = {i + 1: sum((31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[:i]) for i in range(12)}


def xid_info(code: int) -> XidCode:
    return XID_CODES.get(code, XidCode("", "unlisted Xid", False))


def _pci(value: str) -> str:
    """Canonical short PCI address: lower case, 4-digit domain, no function ("0000:3b:00")."""
    value = value.lower()
    if value.count(":") == 2:
        domain, bus, rest = value.split(":")
        value = f"{domain[-4:].rjust(4, '0')}:{bus}:{rest.split('.')[0]}"
    return value


class KernelParser:
    triggers = TRIGGERS
    head_triggers = HEAD_TRIGGERS

    def feed(self, line: Line, pre: Prefix, follow) -> list[Event]:
        text = pre.rest
        ctx = {"line": line.number, "text": line.text, "rank": pre.rank}
        if "Linux version" in text and _BOOT.search(text):
            return [KernelBoot(**ctx)]
        if "NVRM" in text:
            if "Xid" in text:
                m = _XID.search(text)
                if m:
                    code = int(m.group("code"))
                    info = xid_info(code)
                    pid = (m.group("pid") or "").strip("'<>")
                    return [
                        GpuXid(
                            **ctx,
                            pci=_pci(m.group("pci")),
                            code=code,
                            pid=int(pid) if pid.isdigit() else None,
                            process=(m.group("name") or "").strip("'<> "),
                            detail=m.group("detail")[:300],
                            meaning=info.name + (f": {info.meaning}" if info.meaning else ""),
                            primary=info.primary,
                        )
                    ]
                return []
            if "fallen off the bus" in text:
                m = _OFF_BUS.search(text)
                return [GpuOffBus(**ctx, pci=_pci(m.group("pci")) if m else "")]
            if "RmInitAdapter failed" in text:
                m = _RM_INIT.search(text)
                pci = m.group("pci") if m and m.group("pci") else ""
                return [GpuUnreachable(**ctx, pci=_pci(pci), reason="RmInitAdapter failed")]
            if "NV_ERR_RESET_REQUIRED" in text:
                # The driver's status for a GPU that must be reset before it can be used again
                # (nvidia open-gpu-kernel-modules nvstatuscodes.h: "Reset required"), e.g. after
                # a GSP firmware fault: no job can run on it until the node is reset.
                return [GpuUnreachable(**ctx, pci="", reason="reset required")]
            return []
        if "PCIe Bus Error" in text:
            m = _AER.search(text)
            if m:
                sev = m.group("sev").strip().lower()
                if sev.startswith("correct"):
                    severity = "corrected"
                elif "non-fatal" in sev:
                    severity = "uncorrected_nonfatal"
                else:
                    severity = "uncorrected_fatal"
                clock = line_clock(line.text) or line_clock(text)
                return [
                    PcieAer(
                        **ctx,
                        device=(m.group("dev") or "").lower(),
                        severity=severity,
                        error_type=m.group("type").strip(),
                        clock=clock[0] if clock else "",
                        at=clock[1] if clock else None,
                    )
                ]
            return []
        if "device handle" in text:
            m = _SMI_HANDLE.search(text)
            if m:
                return [
                    GpuUnreachable(
                        **ctx, pci=_pci(m.group("pci")), reason=m.group("reason").strip()
                    )
                ]
        return []

    def flush(self) -> list[Event]:
        return []
