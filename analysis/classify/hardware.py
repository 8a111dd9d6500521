"""Rules that read what the agent and its torch integration report (``ingest/parsers/
hw_stats.py``): NVML readings, host CPU/memory/disk stats, and each rank's data at epoch start.

Counters (ECC, NVLink, PCIe replays) are absolute since driver load, so a rule looks at how much
they rose over the readings of one incident, per GPU, and not at their value: a GPU that logged
a few corrected errors last month is not news.
"""

from __future__ import annotations

from collections import defaultdict

from .facts import Facts
from .model import Suspect
from .rules import Match, Rule, cite

# Throttle reasons that slow a GPU far below its peers; sw_power_cap alone is routine.
SEVERE_THROTTLE = {"hw_slowdown", "hw_thermal", "hw_power_brake", "sw_thermal"}


def _by_gpu(f: Facts) -> dict[tuple[str, str], list]:
    gpus: dict[tuple[str, str], list] = defaultdict(list)
    for event in f.of("gpu_health"):
        gpus[(event.host, event.pci or str(event.index))].append(event)
    for readings in gpus.values():
        readings.sort(key=lambda e: e.at or 0.0)
    return gpus


def _rise(readings: list, name: str) -> int:
    values = [getattr(e, name) for e in readings if getattr(e, name) is not None]
    return max(values) - min(values) if len(values) >= 2 else 0


def _rate_per_s(readings: list, name: str) -> float:
    """How fast a counter rose between the first and last timed readings (per second); 0 when
    the readings carry no clock or span no time: a rise whose span is unknown is no rate."""
    timed = [e for e in readings if getattr(e, name) is not None and e.at is not None]
    if len(timed) < 2:
        return 0.0
    span = timed[-1].at - timed[0].at
    return _rise(timed, name) / span if span > 0 else 0.0


# Rates from NVIDIA DCGM's health limits (dcgmlib GpuHardwareLimits.h):
#   DCGM_LIMIT_MAX_PCIREPLAY_RATE 8 — "8 replays per minute is the maximum recommended by RM";
#   DCGM_LIMIT_MAX_LWLINK_CRC_ERROR 100.0 — "CRC errors only matter at rates of 100+ per
#   second". The agent's nvlink_errors sums replay, recovery and both CRC counters, so the CRC
#   limit (the most lenient of DCGM's NVLink limits) is the one a sum can be held to.
MAX_PCIE_REPLAYS_PER_S = 8 / 60
MAX_NVLINK_ERRORS_PER_S = 100.0


def _gpu_error_counters(f: Facts) -> Match | None:
    hard, soft = [], []
    for (host, gpu), readings in _by_gpu(f).items():
        if any(e.remap_failed or e.remap_pending for e in readings):
            hard.append((host, gpu, "row remapping pending or failed", readings))
        elif _rise(readings, "ecc_uncorrected") > 0:
            hard.append((host, gpu, "uncorrectable ECC errors rising", readings))
        elif (rate := _rate_per_s(readings, "nvlink_errors")) > MAX_NVLINK_ERRORS_PER_S:
            what = f"NVLink errors +{_rise(readings, 'nvlink_errors')} ({rate:.0f}/s)"
            soft.append((host, gpu, what, readings))
        elif (rate := _rate_per_s(readings, "pcie_replay")) > MAX_PCIE_REPLAYS_PER_S:
            what = f"PCIe replays +{_rise(readings, 'pcie_replay')} ({rate * 60:.0f}/min)"
            soft.append((host, gpu, what, readings))
    found = hard or soft
    if not found:
        return None
    host, gpu, what, readings = found[0]
    return Match(
        confidence=0.85 if hard else 0.6,
        summary=f"GPU {gpu} on {host}: {what}",
        evidence=cite([r[3][-1] for r in found] + readings[:1], "gpu_counters"),
        suspects=tuple(Suspect("gpu", g, w) for h, g, w, _ in found[:4])
        + tuple(dict.fromkeys(Suspect("host", h, "GPU error counters") for h, *_ in found[:4])),
    )


def _lagging_ranks(f: Facts) -> set[int]:
    ranks: set[int] = set()
    for group in f.groups.values():
        ranks.update(group.lagging()[0])
    return ranks | f.silent_ranks()


def _gpu_throttled(f: Facts) -> Match | None:
    if not f.timeouts and not f.of("progress_stall"):
        return None
    throttled = [e for e in f.of("gpu_health") if SEVERE_THROTTLE & set(e.throttle)]
    if not throttled:
        return None
    lagging = _lagging_ranks(f)
    lagging_hosts = {f.context.rank_hosts.get(r) for r in lagging} - {None}
    on_suspect = [e for e in throttled if e.rank in lagging or e.host in lagging_hosts]
    chosen = on_suspect or throttled
    first = chosen[0]
    return Match(
        confidence=0.7 if on_suspect else 0.45,
        summary=(
            f"GPU {first.pci or first.index} on {first.host} throttled "
            f"({', '.join(first.throttle)}, {first.temperature_c} C) while collectives waited"
            + (" on a lagging rank's host" if on_suspect else "")
        ),
        evidence=cite(chosen, "gpu_throttle"),
        suspects=(Suspect("host", first.host, "GPU throttled by heat or power"),),
    )


def _host_exhausted(f: Facts) -> Match | None:
    if not f.timeouts and not f.of("progress_stall"):
        return None
    hot = [
        e
        for e in f.of("host_stats")
        if (e.mem_percent or 0) >= 95
        or (e.swap_percent or 0) >= 50
        or ((e.cpu_percent or 0) >= 95 and (e.load1_per_core or 0) >= 1.5)
    ]
    if not hot:
        return None
    first = hot[0]
    return Match(
        confidence=0.6,
        summary=(
            f"host {first.host} ran out of CPU or memory (CPU {first.cpu_percent}%, load/core "
            f"{first.load1_per_core}, memory {first.mem_percent}%, swap {first.swap_percent}%)"
        ),
        evidence=cite(hot, "host_exhausted"),
        suspects=tuple(dict.fromkeys(Suspect("host", e.host, "CPU/memory exhausted") for e in hot))[
            :4
        ],
    )


def _disk_saturated(f: Facts) -> Match | None:
    if not f.timeouts and not f.of("progress_stall"):
        return None
    busy = [
        e
        for e in f.of("host_stats")
        if (e.disk_busy_percent or 0) >= 90 or (e.iowait_percent or 0) >= 30
    ]
    if not busy:
        return None
    first = busy[0]
    return Match(
        confidence=0.6,
        summary=(
            f"disk {first.disk or '?'} on {first.host} saturated ({first.disk_busy_percent}% "
            f"busy, await {first.disk_await_ms} ms, iowait {first.iowait_percent}%)"
        ),
        evidence=cite(busy, "disk_saturated"),
        suspects=tuple(
            dict.fromkeys(Suspect("host", e.host, f"disk {e.disk} saturated") for e in busy)
        )[:4],
    )


def _data_order_mismatch(f: Facts) -> Match | None:
    by_epoch: dict[int | None, dict[int, object]] = defaultdict(dict)
    for event in f.of("data_order"):
        if event.rank is not None:
            by_epoch[event.epoch][event.rank] = event  # the last record of a rank wins
    for epoch, ranks in sorted(by_epoch.items(), key=lambda kv: kv[0] or 0):
        if len(ranks) < 2:
            continue
        for field, meaning, confidence in (
            ("steps", "steps per epoch", 0.9),
            ("dataset_len", "dataset length", 0.85),
            ("dataset_fingerprint", "data", 0.8),
        ):
            values = {r: getattr(e, field) for r, e in ranks.items() if getattr(e, field)}
            if len(set(values.values())) < 2:
                continue
            # The odd ones out are the ranks whose value the fewest ranks share.
            counts: dict[object, int] = defaultdict(int)
            for value in values.values():
                counts[value] += 1
            odd = sorted(r for r, v in values.items() if counts[v] < max(counts.values()))
            odd = odd or sorted(values)[1:]
            shown = ", ".join(f"rank {r}: {v}" for r, v in sorted(values.items())[:8])
            return Match(
                confidence=confidence,
                summary=(
                    f"ranks started epoch {epoch} with different {meaning} ({shown}): they "
                    "split the data differently and will run different collectives"
                ),
                evidence=cite(sorted(ranks.values(), key=lambda e: e.rank), "data_order"),
                suspects=tuple(Suspect("rank", str(r), f"different {meaning}") for r in odd[:16]),
            )
    return None


HARDWARE_RULES: tuple[Rule, ...] = (
    Rule(
        "gpu_error_counters",
        "A GPU's uncorrectable ECC, row-remap, NVLink or PCIe error counters rose",
        ("gpu_health",),
        "bad_node_hardware",
        0.85,
        "Drain the host; for pending row remaps reset the GPU (or reboot) to apply them, for a "
        "remap failure or rising uncorrectable ECC replace the GPU; for NVLink/PCIe errors "
        "reseat and check the link (`nvidia-smi nvlink -e`, `lspci -vvv`), then run "
        "`dcgmi diag -r 3` before returning the host.",
        _gpu_error_counters,
        # explains a failure; is none itself (an incident needs a failure)
        marks_failure=False,
    ),
    Rule(
        "data_order_mismatch",
        "Ranks started an epoch with different dataset lengths, step counts or data",
        ("data_order",),
        "rank_desync_code",
        0.9,
        "Build the dataset identically on every rank: seed any random split or shuffle "
        "(train_test_split(..., seed=42), numpy and random seeds) or split once on rank 0 and "
        "share it; shard with DistributedSampler(drop_last=True) so every rank runs the same "
        "number of steps.",
        _data_order_mismatch,
        marks_failure=True,
    ),
    Rule(
        "gpu_throttled",
        "A GPU was throttled by heat or power (on a lagging rank's host) while ranks waited",
        ("gpu_health", "watchdog_timeout", "progress_stall"),
        "bad_node_hardware",
        0.7,
        "Check the host's cooling and power (fans, inlet temperature, PSU, power capping with "
        "`nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE`); drain it until the GPU runs at "
        "full clocks.",
        _gpu_throttled,
    ),
    Rule(
        "host_cpu_memory_exhausted",
        "A host ran out of CPU or memory while ranks waited",
        ("host_stats", "watchdog_timeout", "progress_stall"),
        "dataloader_cpu",
        0.6,
        "Lower DataLoader num_workers and prefetch_factor (keep num_workers × GPUs per host ≤ "
        "CPU cores), move CPU-heavy preprocessing offline, and check for other processes on "
        "the host.",
        _host_exhausted,
    ),
    Rule(
        "disk_io_saturated",
        "A host's disk was saturated (busy or iowait) while ranks waited",
        ("host_stats", "watchdog_timeout", "progress_stall"),
        "storage_io",
        0.6,
        "Move logs and checkpoints to fast local storage (NVMe or tmpfs) and copy them out "
        "asynchronously; log less often from rank 0; shard or cache the dataset locally.",
        _disk_saturated,
    ),
)
