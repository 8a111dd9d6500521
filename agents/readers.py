"""Readers of GPU, host and kernel state. Each degrades cleanly where the hardware or the
permission is absent and says so with a ``reader`` record, so the server can tell "no errors"
from "could not look".
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

# Kernel lines worth shipping: GPU driver (Xid, fallen off the bus), PCIe AER, hung tasks,
# storage and the OOM killer. Everything else in the kernel log stays on the host.
KERNEL_LINE = re.compile(
    r"NVRM|Xid|fallen off the bus|AER|blocked for more than|not responding|Lustre|"
    r"I/O error|Out of memory|oom-kill|Killed process"
)


def reader_record(name: str, available: bool, reason: str = "") -> dict:
    return {"type": "reader", "reader": name, "available": available, "reason": reason[:300]}


class Nvml:
    """NVML through nvidia-ml-py: counters, clocks, throttle reasons, temperatures, power."""

    def __init__(self) -> None:
        self.reason = ""
        self.pynvml = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.pynvml = pynvml
        except ImportError:
            self.reason = "nvidia-ml-py is not installed"
        except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded / NoPermission
            self.reason = f"NVML unavailable: {exc}"

    def read(self) -> list[dict]:
        if self.pynvml is None:
            return [reader_record("nvml", False, self.reason)]
        n = self.pynvml
        out = [reader_record("nvml", True)]
        try:
            count = n.nvmlDeviceGetCount()
        except n.NVMLError as exc:
            return [reader_record("nvml", False, str(exc))]
        for index in range(count):
            handle = n.nvmlDeviceGetHandleByIndex(index)
            gpu: dict = {"type": "gpu", "index": index}
            for field_name, fn in self._fields(handle).items():
                try:
                    gpu[field_name] = fn()
                except (n.NVMLError, AttributeError):
                    continue  # not supported on this GPU or driver
            out.append(gpu)
        return out

    def _fields(self, h) -> dict:
        n = self.pynvml
        ecc = n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        corr = n.NVML_MEMORY_ERROR_TYPE_CORRECTED
        vol, agg = n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC

        def text(value):
            return value.decode() if isinstance(value, bytes) else str(value)

        def nvlink_errors():
            total = 0
            for link in range(getattr(n, "NVML_NVLINK_MAX_LINKS", 18)):
                for counter in range(4):  # DL replay, recovery, CRC flit, CRC data
                    try:
                        total += n.nvmlDeviceGetNvLinkErrorCounter(h, link, counter)
                    except n.NVMLError:
                        break
            return total

        def remap():
            corr_rows, unc_rows, pending, failed = n.nvmlDeviceGetRemappedRows(h)
            return {"correctable": corr_rows, "uncorrectable": unc_rows, "pending": bool(pending),
                    "failed": bool(failed)}  # fmt: skip

        return {
            "name": lambda: text(n.nvmlDeviceGetName(h)),
            "pci": lambda: text(n.nvmlDeviceGetPciInfo(h).busId),
            "ecc_uncorrected_volatile": lambda: n.nvmlDeviceGetTotalEccErrors(h, ecc, vol),
            "ecc_uncorrected_aggregate": lambda: n.nvmlDeviceGetTotalEccErrors(h, ecc, agg),
            "ecc_corrected_volatile": lambda: n.nvmlDeviceGetTotalEccErrors(h, corr, vol),
            "row_remap": remap,
            "nvlink_errors": nvlink_errors,
            "pcie_replay": lambda: n.nvmlDeviceGetPcieReplayCounter(h),
            "sm_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
            "sm_clock_max_mhz": lambda: n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM),
            "throttle_reasons": lambda: throttle_names(n.nvmlDeviceGetCurrentClocksEventReasons(h)),
            "temperature_c": lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
            "power_w": lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "power_limit_w": lambda: n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "utilization_pct": lambda: n.nvmlDeviceGetUtilizationRates(h).gpu,
        }


# nvmlClocksEventReasons bits (nvml.h); the names are what the rules read.
THROTTLE_BITS = {
    0x2: "sw_power_cap",
    0x4: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


class HostStats:
    """CPU, memory, disk and network through psutil; rates from the previous call."""

    def __init__(self) -> None:
        try:
            import psutil

            self.psutil = psutil
            psutil.cpu_percent(None)  # prime: the next call measures since now
            self.cpu_times = psutil.cpu_times_percent(None)
            self.reason = ""
        except ImportError:
            self.psutil = None
            self.reason = "psutil is not installed"
        self.last = time.monotonic()
        self.disks = self._disks()
        self.net = self._net()

    def _disks(self):
        try:
            return self.psutil.disk_io_counters(perdisk=True) if self.psutil else {}
        except (OSError, RuntimeError):
            return {}

    def _net(self):
        try:
            return self.psutil.net_io_counters(pernic=True) if self.psutil else {}
        except OSError:
            return {}

    def read(self) -> list[dict]:
        p = self.psutil
        if p is None:
            return [reader_record("host", False, self.reason)]
        now = time.monotonic()
        elapsed = max(now - self.last, 1e-3)
        times = p.cpu_times_percent(None)
        mem = p.virtual_memory()
        swap = p.swap_memory()
        load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        cores = p.cpu_count() or 1
        host = {
            "type": "host",
            "cpu_percent": p.cpu_percent(None),
            "iowait_percent": getattr(times, "iowait", None),
            "cpu_count": cores,
            "load1_per_core": round(load1 / cores, 3) if load1 is not None else None,
            "mem_percent": mem.percent,
            "mem_available_mb": mem.available >> 20,
            "swap_percent": swap.percent,
            "interval_s": round(elapsed, 3),
        }
        disks = self._disks()
        host["disks"] = []
        for name, now_io in disks.items():
            before = self.disks.get(name)
            if before is None or name.startswith(("loop", "ram")):
                continue
            busy_ms = getattr(now_io, "busy_time", 0) - getattr(before, "busy_time", 0)
            ops = (now_io.read_count + now_io.write_count) - (
                before.read_count + before.write_count
            )
            wait_ms = (now_io.read_time + now_io.write_time) - (
                before.read_time + before.write_time
            )
            host["disks"].append(
                {
                    "device": name,
                    "busy_percent": round(min(100.0, busy_ms / (elapsed * 10)), 1),
                    "await_ms": round(wait_ms / ops, 2) if ops else 0.0,
                    "write_mb_s": round(
                        (now_io.write_bytes - before.write_bytes) / elapsed / 1e6, 2
                    ),
                }
            )
        net = self._net()
        errors = 0
        for name, now_nic in net.items():
            before = net.get(name) if name not in self.net else self.net[name]
            errors += (now_nic.errin + now_nic.errout + now_nic.dropin + now_nic.dropout) - (
                before.errin + before.errout + before.dropin + before.dropout
            )
        host["net_errors"] = errors
        self.last, self.disks, self.net = now, disks, net
        return [host]


IB_COUNTERS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)


class IbPorts:
    """InfiniBand/RoCE port counters from sysfs (``/sys/class/infiniband/<hca>/ports/<n>``):
    the NIC side of "counters over time". Absent hardware is reported, not guessed."""

    def __init__(self, root: str = "/sys/class/infiniband") -> None:
        self.root = Path(root)

    def read(self) -> list[dict]:
        try:
            hcas = sorted(p for p in self.root.iterdir() if p.is_dir())
        except OSError:
            return [reader_record("ib", False, f"no InfiniBand devices ({self.root} absent)")]
        found = []
        for hca in hcas:
            try:
                ports = sorted((hca / "ports").iterdir())
            except OSError:
                continue
            for port in ports:
                nic: dict = {"type": "nic", "device": hca.name[:64], "port": port.name[:8]}
                for name in IB_COUNTERS:
                    try:
                        nic[name] = int((port / "counters" / name).read_text().strip())
                    except (OSError, ValueError):
                        nic[name] = None
                for name in ("state", "rate"):
                    try:
                        nic[name] = (port / name).read_text().strip()[:64]
                    except OSError:
                        nic[name] = ""
                found.append(nic)
        if not found:
            return [reader_record("ib", False, f"no ports under {self.root}")]
        return found


class KernelLog:
    """Interesting kernel lines from ``/dev/kmsg`` (new records only) or dmesg output files."""

    def __init__(self, paths: tuple[str, ...]) -> None:
        self.kmsg_fd: int | None = None
        self.files: list[str] = []
        self.offsets: dict[str, int] = {}
        self.problems: list[str] = []
        for path in paths:
            if path == "/dev/kmsg":
                try:
                    self.kmsg_fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                    os.lseek(self.kmsg_fd, 0, os.SEEK_END)  # only what happens from now on
                except OSError as exc:
                    self.problems.append(f"{path}: {exc.strerror or exc}")
            else:
                self.files.append(path)
                try:
                    self.offsets[path] = os.path.getsize(path)
                except OSError:
                    self.offsets[path] = 0

    def status(self) -> list[dict]:
        if self.problems and self.kmsg_fd is None and not self.files:
            return [reader_record("kernel_log", False, "; ".join(self.problems))]
        return [reader_record("kernel_log", True, "; ".join(self.problems))]

    def read(self) -> list[str]:
        lines: list[str] = []
        if self.kmsg_fd is not None:
            while len(lines) < 10_000:
                try:
                    record = os.read(self.kmsg_fd, 8192)
                except BlockingIOError:
                    break
                except OSError:  # EPIPE: records overwritten before we read them
                    continue
                if not record:
                    break
                meta, _, message = record.decode("utf-8", "replace").partition(";")
                parts = meta.split(",")
                stamp = int(parts[2]) / 1e6 if len(parts) > 2 and parts[2].isdigit() else 0.0
                message = message.split("\n", 1)[0]
                if KERNEL_LINE.search(message):
                    lines.append(f"[{stamp:12.6f}] {message}")
        for path in self.files:
            try:
                size = os.path.getsize(path)
                start = self.offsets.get(path, 0)
                if size < start:
                    start = 0
                with open(path, "rb") as stream:
                    stream.seek(start)
                    block = stream.read(min(size - start, 8 << 20))
            except OSError:
                continue
            cut = block.rfind(b"\n") + 1
            self.offsets[path] = start + cut
            for line in block[:cut].decode("utf-8", "replace").splitlines():
                if KERNEL_LINE.search(line):
                    lines.append(line)
        return lines


def lower_priority(nice: int, io_idle: bool) -> list[str]:
    """Run below the training processes: CPU niceness and the idle I/O class."""
    done = []
    try:
        current = os.nice(0)
        if nice > current:
            os.nice(nice - current)
        done.append(f"nice {os.nice(0)}")
    except OSError:
        pass
    if io_idle:
        try:
            import psutil
        except ImportError:
            return done
        if hasattr(psutil, "IOPRIO_CLASS_IDLE"):
            try:
                psutil.Process().ionice(psutil.IOPRIO_CLASS_IDLE)
                done.append("ionice idle")
            except (OSError, psutil.Error):
                pass
    return done
