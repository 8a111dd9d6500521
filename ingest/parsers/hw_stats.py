"""Hardware and host stats from the Fleetwatch agent and its torch integration.

The document (``agents/records.py``) is one JSON object ``{"hw_stats": "fleetwatch.hw_stats/1",
"host", "job", "attempt", "rank", "at", "records": [...]}``; each record has a ``type``. Every
record becomes one event whose ``line`` is its index in ``records`` (1-based) and whose ``text``
is a one-line description a verdict can cite. Unknown record types and bad values are issues,
never exceptions.

The document is untrusted like every upload: its size (compressed and inflated), its nesting,
its number of records and the length of every string taken from it are bounded, and a value of
the wrong type is read as absent.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO, ClassVar

from .artifact import register_kind
from .events import Event, register
from .log import LogParse, ParseIssue

# A real document is a few KB (a host's GPUs and NICs, one reading each); a time series of
# readings stays well under this. Bounded so that a crafted one ("[{},{},…]") cannot turn into
# millions of objects.
MAX_DOCUMENT = 4 << 20
MAX_RECORDS = 10_000
MAX_ISSUES = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuHealth(Event):
    """One NVML reading of one GPU. Counters are absolute; rules compare readings over time."""

    kind: ClassVar[str] = "gpu_health"
    host: str = ""
    index: int | None = None
    pci: str = ""
    name: str = ""
    ecc_uncorrected: int | None = None  # volatile (since driver load)
    ecc_corrected: int | None = None
    remap_pending: bool = False
    remap_failed: bool = False
    remapped_uncorrectable: int | None = None
    nvlink_errors: int | None = None
    pcie_replay: int | None = None
    throttle: tuple[str, ...] = ()
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    at: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NicHealth(Event):
    """One reading of one InfiniBand/RoCE port's error counters (absolute; compare over time)."""

    kind: ClassVar[str] = "nic_health"
    host: str = ""
    device: str = ""  # mlx5_0
    port: str = ""
    state: str = ""  # "4: ACTIVE"
    rate: str = ""  # "400 Gb/sec (4X NDR)"
    symbol_error: int | None = None
    link_downed: int | None = None
    link_error_recovery: int | None = None
    port_rcv_errors: int | None = None
    port_xmit_discards: int | None = None
    at: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HostStats(Event):
    kind: ClassVar[str] = "host_stats"
    host: str = ""
    cpu_percent: float | None = None
    cpu_count: int | None = None  # logical CPUs (psutil.cpu_count())
    iowait_percent: float | None = None
    load1_per_core: float | None = None
    mem_percent: float | None = None
    swap_percent: float | None = None
    disk: str = ""  # the busiest disk
    disk_busy_percent: float | None = None
    disk_await_ms: float | None = None
    net_errors: int | None = None
    at: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReaderStatus(Event):
    """A reader that could (or could not) look: "no ECC errors" needs NVML to have run."""

    kind: ClassVar[str] = "reader_status"
    host: str = ""
    reader: str = ""
    available: bool = False
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSpool(Event):
    kind: ClassVar[str] = "agent_spool"
    host: str = ""
    dropped_items: int = 0
    dropped_bytes: int = 0
    rejected: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class DataOrder(Event):
    """A rank's data at an epoch start (the torch integration's ``epoch_start``)."""

    kind: ClassVar[str] = "data_order"
    epoch: int | None = None
    world_size: int | None = None
    dataset_len: int | None = None
    steps: int | None = None
    dataset_fingerprint: str = ""
    order_fingerprint: str = ""
    sampler: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressStall(Event):
    """The agent saw a rank's step heartbeat stop and asked for a Flight Recorder dump."""

    kind: ClassVar[str] = "progress_stall"
    host: str = ""
    silent_s: float | None = None
    median_step_s: float | None = None
    steps: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveFailure(Event):
    """A collective raised in the training process (caught by the torch integration)."""

    kind: ClassVar[str] = "collective_failure"
    op: str = ""
    error: str = ""
    steps: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeResult(Event):
    """``fleetwatch probe``: collective bandwidth per rank pair and the slow rank or link."""

    kind: ClassVar[str] = "probe_result"
    world_size: int | None = None
    median_pair_gbs: float | None = None
    slow_ranks: tuple[int, ...] = ()
    slow_links: tuple[str, ...] = ()
    verdict: str = ""


for _cls in (ProbeResult, GpuHealth, HostStats, ReaderStatus, AgentSpool, DataOrder, ProgressStall):
    register(_cls)
register(CollectiveFailure)
register(NicHealth)


def _num(value, kind=float):
    """A number, or None for anything else: a string that is not one, a list, NaN, infinity."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = kind(value)
    except (ValueError, OverflowError):  # "abc", int(inf), a 5000-digit string
        return None
    return None if isinstance(number, float) and not math.isfinite(number) else number


def _text(value: Any, limit: int) -> str:
    """A scalar as bounded text; a list or an object (which str() would render whole) as ''."""
    if isinstance(value, str):
        return value[:limit]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)[:limit]
    return ""


def _items(value: Any, limit: int = 256) -> list:
    """A JSON array's first items; anything else (a number, a string, an object) as none."""
    return list(value[:limit]) if isinstance(value, list) else []


def _gpu(r: dict, host: str, at) -> tuple[GpuHealth, str]:
    remap = r.get("row_remap") if isinstance(r.get("row_remap"), dict) else {}
    throttle = tuple(t[:64] for t in _items(r.get("throttle_reasons"), 32) if isinstance(t, str))
    event = dict(
        host=host,
        index=_num(r.get("index"), int),
        pci=_text(r.get("pci"), 64),
        name=_text(r.get("name"), 100),
        ecc_uncorrected=_num(r.get("ecc_uncorrected_volatile"), int),
        ecc_corrected=_num(r.get("ecc_corrected_volatile"), int),
        remap_pending=bool(remap.get("pending")),
        remap_failed=bool(remap.get("failed")),
        remapped_uncorrectable=_num(remap.get("uncorrectable"), int),
        nvlink_errors=_num(r.get("nvlink_errors"), int),
        pcie_replay=_num(r.get("pcie_replay"), int),
        throttle=throttle,
        temperature_c=_num(r.get("temperature_c")),
        power_w=_num(r.get("power_w")),
        sm_clock_mhz=_num(r.get("sm_clock_mhz"), int),
        sm_clock_max_mhz=_num(r.get("sm_clock_max_mhz"), int),
        at=_num(at),
    )
    text = (
        f"{host} GPU {event['index']} {event['pci']}: ECC uncorrected {event['ecc_uncorrected']}, "
        f"row remap pending={event['remap_pending']} failed={event['remap_failed']}, NVLink "
        f"errors {event['nvlink_errors']}, PCIe replays {event['pcie_replay']}, "
        f"{event['temperature_c']} C, {event['power_w']} W, SM {event['sm_clock_mhz']}/"
        f"{event['sm_clock_max_mhz']} MHz, throttle {','.join(throttle) or 'none'}"
    )
    return event, text


def _host(r: dict, host: str, at) -> tuple[dict, str]:
    disks = [d for d in _items(r.get("disks")) if isinstance(d, dict)]
    busiest = max(disks, key=lambda d: _num(d.get("busy_percent")) or 0.0, default={})
    event = dict(
        host=host,
        cpu_percent=_num(r.get("cpu_percent")),
        cpu_count=_num(r.get("cpu_count"), int),
        iowait_percent=_num(r.get("iowait_percent")),
        load1_per_core=_num(r.get("load1_per_core")),
        mem_percent=_num(r.get("mem_percent")),
        swap_percent=_num(r.get("swap_percent")),
        disk=_text(busiest.get("device"), 64),
        disk_busy_percent=_num(busiest.get("busy_percent")),
        disk_await_ms=_num(busiest.get("await_ms")),
        net_errors=_num(r.get("net_errors"), int),
        at=_num(at),
    )
    text = (
        f"{host}: CPU {event['cpu_percent']}% (iowait {event['iowait_percent']}%, load/core "
        f"{event['load1_per_core']}), memory {event['mem_percent']}%, swap "
        f"{event['swap_percent']}%, busiest disk {event['disk'] or '-'} "
        f"{event['disk_busy_percent']}% busy, await {event['disk_await_ms']} ms"
    )
    return event, text


def _event(r: dict, index: int, doc: dict, source: str) -> Event | None:
    kind = r.get("type")
    host = _text(doc.get("host"), 255)
    at = doc.get("at")
    rank = _num(r.get("rank", doc.get("rank")), int)
    base = {"line": index, "source": source, "rank": rank}
    if kind == "gpu":
        fields, text = _gpu(r, host, at)
        return GpuHealth(text=text, **base, **fields)
    if kind == "nic":
        counters = {
            name: _num(r.get(name), int)
            for name in (
                "symbol_error",
                "link_downed",
                "link_error_recovery",
                "port_rcv_errors",
                "port_xmit_discards",
            )
        }
        device, port = _text(r.get("device"), 64), _text(r.get("port"), 8)
        state = _text(r.get("state"), 64)
        text = f"{host}: {device} port {port} {state}: " + ", ".join(
            f"{k} {v}" for k, v in counters.items() if v
        )
        return NicHealth(
            text=text[:2000],
            host=host,
            device=device,
            port=port,
            state=state,
            rate=_text(r.get("rate"), 64),
            at=_num(at),
            **counters,
            **base,
        )
    if kind == "host":
        fields, text = _host(r, host, at)
        return HostStats(text=text, **base, **fields)
    if kind == "reader":
        reader, ok = _text(r.get("reader"), 64), bool(r.get("available"))
        why = _text(r.get("reason"), 300)
        text = f"{host}: {reader} reader {'available' if ok else 'unavailable'}"
        text += f" ({why})" if why else ""
        return ReaderStatus(text=text, host=host, reader=reader, available=ok, reason=why, **base)
    if kind == "agent":
        dropped = _num(r.get("spool_dropped_items"), int) or 0
        return AgentSpool(
            text=f"{host}: agent spool dropped {dropped} items so far",
            host=host,
            dropped_items=dropped,
            dropped_bytes=_num(r.get("spool_dropped_bytes"), int) or 0,
            rejected=_num(r.get("rejected"), int) or 0,
            **base,
        )
    if kind == "data_order":
        fields = dict(
            epoch=_num(r.get("epoch"), int),
            world_size=_num(r.get("world_size"), int),
            dataset_len=_num(r.get("dataset_len"), int),
            steps=_num(r.get("steps"), int),
            dataset_fingerprint=_text(r.get("dataset_fingerprint"), 64),
            order_fingerprint=_text(r.get("order_fingerprint"), 64),
            sampler=_text(r.get("sampler"), 100),
        )
        text = (
            f"rank {rank} epoch {fields['epoch']}: dataset length {fields['dataset_len']}, "
            f"{fields['steps']} steps, data fingerprint {fields['dataset_fingerprint']}, "
            f"order fingerprint {fields['order_fingerprint']}"
        )
        return DataOrder(text=text, **base, **fields)
    if kind == "progress_stall":
        fields = dict(
            silent_s=_num(r.get("silent_s")),
            median_step_s=_num(r.get("median_step_s")),
            steps=_num(r.get("steps"), int),
        )
        text = (
            f"{host}: rank {rank} made no step for {fields['silent_s']} s after step "
            f"{fields['steps']} (median step {fields['median_step_s']} s)"
        )
        return ProgressStall(text=text, host=host, **base, **fields)
    if kind == "collective_failure":
        op, error = _text(r.get("op"), 64), _text(r.get("error"), 2000)
        return CollectiveFailure(
            text=f"rank {rank} {op} failed: {error}"[:2000],
            op=op,
            error=error,
            steps=_num(r.get("steps"), int),
            **base,
        )
    if kind == "probe":
        slow = tuple(x for x in _items(r.get("slow_ranks"), 64) if isinstance(x, int))
        verdict = _text(r.get("verdict"), 500)
        world_size = _num(r.get("world_size"), int)
        return ProbeResult(
            text=f"probe over {world_size} ranks: {verdict}",
            world_size=world_size,
            median_pair_gbs=_num(r.get("median_pair_gbs")),
            slow_ranks=slow,
            slow_links=tuple(_text(x, 32) for x in _items(r.get("slow_links"), 64)),
            verdict=verdict,
            **base,
        )
    return None


def parse_hw_stats(stream: BinaryIO | bytes, *, source: str = "") -> LogParse:
    if isinstance(stream, bytes | bytearray):
        stream = io.BytesIO(stream)
    raw = stream.read(MAX_DOCUMENT + 1)
    issues: list[ParseIssue] = []

    def unreadable(why: str) -> LogParse:
        return LogParse(
            source, (), (ParseIssue(0, f"not a hardware stats document: {why}"),), 0, complete=False
        )

    if len(raw) > MAX_DOCUMENT:
        return unreadable(f"larger than {MAX_DOCUMENT} bytes")
    if raw[:2] == b"\x1f\x8b":
        try:
            # Inflate no more than the bound: a gzip bomb is cut, never held whole.
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as inflated:
                raw = inflated.read(MAX_DOCUMENT + 1)
        except (OSError, EOFError, zlib.error) as exc:
            return unreadable(f"damaged gzip ({exc})")
    if len(raw) > MAX_DOCUMENT:
        return unreadable(f"larger than {MAX_DOCUMENT} bytes")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        return unreadable(f"not JSON ({exc})")
    except RecursionError:
        return unreadable("JSON nested too deeply")
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
        return unreadable("no 'records' list")
    records = doc["records"]
    if len(records) > MAX_RECORDS:
        issues.append(ParseIssue(0, f"{len(records)} records: only the first {MAX_RECORDS} read"))
    events: list[Event] = []
    for index, record in enumerate(records[:MAX_RECORDS], start=1):
        event = _event(record, index, doc, source) if isinstance(record, dict) else None
        if event is not None:
            events.append(event)
        elif len(issues) < MAX_ISSUES:
            why = (
                f"unknown record type {_text(record.get('type'), 40)!r}"
                if isinstance(record, dict)
                else "record is not an object"
            )
            issues.append(ParseIssue(index, why))
    return LogParse(source, tuple(events), tuple(issues), lines=len(records))


register_kind("hw_stats", parse_hw_stats)
