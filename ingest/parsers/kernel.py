"""Kernel and driver lines: NVIDIA Xid errors, GPUs fallen off the bus, PCIe AER, nvidia-smi.

Lines arrive from ``dmesg`` (``[12345.678901] NVRM: …``, ``dmesg -T`` / ``-H`` timestamps),
``journalctl -k`` / syslog (``Mar 21 02:07:08 host kernel: NVRM: …``) or pasted nvidia-smi
output; the timestamp is ignored, the message is matched anywhere in the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .events import Event, GpuOffBus, GpuUnreachable, GpuXid, PcieAer
from .lines import Line
from .prefix import Prefix

# "NVRM" covers every driver line; AER and nvidia-smi errors say "Error". nvidia-smi's
# "device handle … GPU is lost" has neither, and lives in small files: the head is enough.
TRIGGERS: tuple[bytes, ...] = (b"NVRM", b"Error")
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
                return [
                    PcieAer(
                        **ctx,
                        device=(m.group("dev") or "").lower(),
                        severity=severity,
                        error_type=m.group("type").strip(),
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
