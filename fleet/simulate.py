"""A simulated fleet with planted culprits, sent through the real API and task path.

Hosts sit in racks of 16 and carry one GPU model each; jobs of many sizes and families run
attempts that agents report through ``POST /api/v1/attempts``; every failure uploads the logs its
hosts would really leave (every rank's ProcessGroupNCCL lines, NCCL INFO where it matters,
kernel logs) through ``POST /api/v1/uploads``, so parsing, classification and fleet memory run
exactly as in production. The planted culprits and their incidents are the ground truth that
``evaluate_fleet`` scores the flagged culprits against.
"""

from __future__ import annotations

import gzip
import heapq
import json
import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from fleet.celery import eager_countdowns
from fleet.demo import OOM_TRACEBACK, _stamp

GPUS_PER_HOST = 8
RACK_SIZE = 16
RACK_MODELS = ("H100", "A100", "H100", "L40S", "H100", "A100", "H100", "H100")
# Logical CPUs of each rack model's hosts (two sockets, SMT on): the A100 racks are the older,
# smaller hosts, where asr-train's 8 x 16 DataLoader workers outnumber the CPUs.
CPUS_BY_MODEL = {"H100": 224, "A100": 96, "L40S": 128}
PG0 = "[PG ID 0 PG GUID 0(default_pg) Rank {r}]"


@dataclass
class Plant:
    id: str
    kind: str  # what was planted
    culprit: str
    entities: list[str]  # "kind:key" any of which, flagged, finds the plant
    incidents: int = 0  # failures it caused
    failed_at: list[str] = field(default_factory=list)  # when each happened (ISO 8601)


@dataclass
class Family:
    name: str
    hosts: tuple[int, int]  # min, max hosts per attempt
    config: dict[str, str] = field(default_factory=dict)
    models: tuple[str, ...] = ()  # restrict to these GPU models (empty: any)
    per_day: float = 1.0  # attempts per 100 hosts per day


@dataclass
class Truth:
    seed: int
    hosts: int
    days: int
    plants: list[Plant]
    failures: int = 0
    attempts: int = 0
    noise_failures: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


FAMILIES = [
    Family("llama-pretrain", (2, 8), {"tensor_model_parallel_size": "8"}, per_day=8.0),
    Family("moe-train", (4, 8), {"expert_parallel_size": "8"}, per_day=5.0),
    Family("vit-sweep", (1, 1), per_day=15.0),
    Family("asr-train", (1, 2), {"num_workers": "16", "prefetch": "250"}, per_day=8.0),
    Family("dit-infer", (1, 1), {"pipefusion_parallel_degree": "8"}, per_day=8.0),
    Family("sft-unseeded", (1, 2), per_day=5.0),
    Family("embed-finetune", (1, 4), {"num_workers": "4"}, per_day=8.0),
    Family("rl-rollout", (1, 2), per_day=8.0),
]


class Simulator:
    def __init__(
        self,
        *,
        hosts: int,
        days: int,
        seed: int,
        end: datetime,
        client=None,
        window: timedelta | None = None,
        tag: str = "",
    ):
        """``days`` of the fleet's jobs, started over the ``window`` before ``end`` (default:
        those days); ``tag`` ends every job name, so a second run never meets the first's jobs."""
        self.rng = random.Random(seed)
        self.seed, self.days, self.end = seed, days, end
        self.window = window or timedelta(days=days)
        self.tag = tag
        self.client = client or Client(HTTP_HOST="127.0.0.1")
        self.key = ""
        self.on_incident = None
        self.hosts = [self._host(i) for i in range(hosts)]
        by_model: dict[str, list[dict]] = {}
        for host in self.hosts:
            by_model.setdefault(host["model"], []).append(host)
        self.by_model = by_model
        # Planted culprits, chosen reproducibly from the fleet.
        h100 = by_model["H100"]
        self.bad_host = self.rng.choice(h100)["name"]
        racks = sorted({h["rack"] for h in h100})
        self.socket_rack = self.rng.choice(racks[1:] or racks)
        self.slow_mount = "fs-logs07"
        self.plants = {
            "bad_gpu_host": Plant(
                "bad_gpu_host",
                "host with a failing GPU",
                "bad_node_hardware",
                [f"host:{self.bad_host}", f"gpu:{self.bad_host}/0000:3b:00"],
            ),
            "socket_rack": Plant(
                "socket_rack",
                "rack whose IB is misconfigured (sockets)",
                "network_transport",
                [f"rack:{self.socket_rack}"],
            ),
            "slow_mount": Plant(
                "slow_mount",
                "slow storage mount rank 0 logs to",
                "storage_io",
                [f"mount:{self.slow_mount}"],
            ),
            "pp_on_l40s": Plant(
                "pp_on_l40s",
                "pipeline degree 8 fails only on L40S",
                "parallelism_config",
                ["config:pipeline_parallel=8 on L40S", "config:pipeline_parallel=8"],
            ),
            "unseeded_split": Plant(
                "unseeded_split",
                "job family with an unseeded data split",
                "rank_desync_code",
                ["job_family:sft-unseeded"],
            ),
            "loader_on_a100": Plant(
                "loader_on_a100",
                "data loader oversubscribes CPUs on A100 hosts",
                "dataloader_cpu",
                [
                    "config:num_workers=16 on A100",
                    "config:num_workers=16",
                    "config:prefetch=250",
                    "config:prefetch=250 on A100",
                ],
            ),
        }
        self.truth = Truth(seed, hosts, days, list(self.plants.values()))

    def _host(self, i: int) -> dict:
        rack_index = i // RACK_SIZE
        rack = f"r{rack_index + 1:03d}"
        # GPU models come by whole racks, as they are bought: 5 of 8 racks H100, 2 A100, 1 L40S.
        model = RACK_MODELS[rack_index % len(RACK_MODELS)]
        return {"name": f"{rack}-n{i % RACK_SIZE + 1:02d}", "rack": rack, "model": model}

    # --- the API calls an agent makes -----------------------------------------------------

    def _report(self, **body) -> None:
        response = self.client.post(
            "/api/v1/attempts",
            body,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {self.key}",
        )
        if response.status_code != 200:
            raise RuntimeError(f"attempt report refused: {response.content[:300]!r}")

    def _upload(self, job: str, host: str, name: str, text: str, rank: int | None = None):
        form = {
            "file": SimpleUploadedFile(name, gzip.compress(text.encode())),
            "host": host,
            "job": job,
        }
        if rank is not None:
            form["rank"] = rank
        response = self.client.post(
            "/api/v1/uploads", form, HTTP_AUTHORIZATION=f"Bearer {self.key}"
        )
        if response.status_code != 202:
            raise RuntimeError(f"upload refused: {response.content[:300]!r}")

    # --- the fleet's week -----------------------------------------------------------------

    def run_with_fleet_memory(self, key: str, ticks_per_day: int = 24) -> Truth:
        """``run`` with fleet memory recomputed at simulated times, as production does: after
        each incident (within FLEETWATCH_CORRELATE_SECONDS of it) and ``ticks_per_day`` times a
        simulated day (beat); the recompute at wall-clock time is switched off."""
        from django.test import override_settings

        from analysis import memory

        with override_settings(FLEETWATCH_CORRELATE_SECONDS=0):
            return self.run(
                key,
                on_tick=memory.fleet_correlate,
                ticks_per_day=ticks_per_day,
                on_incident=memory.fleet_correlate,
            )

    def run(self, key: str, on_tick=None, ticks_per_day: int = 4, on_incident=None) -> Truth:
        """The fleet's days in time order. ``on_tick(now)`` runs ``ticks_per_day`` times a
        simulated day (production's beat), ``on_incident(now)`` after each failure's artifacts
        are in (production's recompute after an incident)."""
        self.key = key
        self.on_incident = on_incident
        start = self.end - self.window
        jobs = []
        for family in FAMILIES:
            count = max(1, round(family.per_day * len(self.hosts) / 100 * self.days))
            for n in range(count):
                at = start + timedelta(seconds=self.rng.uniform(0, self.window.total_seconds()))
                jobs.append((at, family, n))
        # Starts and ends are processed in time order, so fleet memory at a tick knows exactly
        # the failures that had happened by then.
        queue: list[tuple[datetime, int, object]] = []
        for order, (at, family, n) in enumerate(jobs):
            heapq.heappush(queue, (at, order, (family, n)))
        tick = timedelta(days=1 / ticks_per_day)
        next_tick = start + tick
        while queue:
            at, order, item = heapq.heappop(queue)
            while at >= next_tick:
                if on_tick:
                    on_tick(next_tick)
                next_tick += tick
            if isinstance(item, tuple):
                ending = self._attempt(at, *item)
                heapq.heappush(queue, (ending[0], order, ending[1]))
            else:
                item()
        if on_tick:
            on_tick(self.end)
        return self.truth

    def _pick_hosts(self, family: Family) -> list[dict]:
        count = self.rng.randint(*family.hosts)
        models = family.models or tuple(self.by_model)
        if family.name == "dit-infer":
            model = self.rng.choice(["H100", "A100", "L40S"])
        else:
            weights = [len(self.by_model.get(m, [])) for m in models]
            model = self.rng.choices(models, weights=weights)[0]
        pool = self.by_model.get(model) or self.hosts
        first = self.rng.randrange(len(pool))
        return [pool[(first + i) % len(pool)] for i in range(min(count, len(pool)))]

    def _attempt(self, at: datetime, family: Family, n: int):
        hosts = self._pick_hosts(family)
        job = f"{family.name}-{at:%m%d}-{n:04d}{self.tag}"
        world = len(hosts) * GPUS_PER_HOST
        model = hosts[0]["model"]
        config = dict(family.config)
        versions = {"torch": "2.5.1", "nccl": "2.21.5", "cuda": "12.4", "driver": "550.54.15"}
        for i, host in enumerate(hosts):
            ranks = list(range(i * GPUS_PER_HOST, (i + 1) * GPUS_PER_HOST))
            self._report(
                job=job,
                job_name=family.name,
                event="start",
                at=at.isoformat(),
                host=host["name"],
                ranks=ranks,
                world_size=world,
                gpu_model=host["model"],
                rack=host["rack"],
                config=config,
                versions=versions,
            )
        self.truth.attempts += 1
        fault = self._fault(family, hosts, model)
        end = min(at + timedelta(minutes=self.rng.randint(20, 600)), self.end)

        def finish() -> None:
            if fault is None:
                self._report(job=job, event="end", status="succeeded", at=end.isoformat())
                return
            self.truth.failures += 1
            self._report(job=job, event="end", status="failed", at=end.isoformat())
            # Every artifact of the attempt is sent here: it is classified once, when they are
            # all in (the embedded default would otherwise wait out the settle window).
            with eager_countdowns.batch():
                self._fail(job, hosts, world, fault, end, family)
            if self.on_incident:
                self.on_incident(end)

        return end, finish

    def _fault(self, family: Family, hosts: list[dict], model: str) -> str | None:
        names = {h["name"] for h in hosts}
        rng = self.rng
        if self.bad_host in names and rng.random() < 0.8:
            return "bad_gpu_host"
        if (
            len(hosts) > 1
            and any(h["rack"] == self.socket_rack for h in hosts)
            and rng.random() < 0.6
        ):
            return "socket_rack"
        if family.name == "llama-pretrain" and rng.random() < 0.25:
            return "slow_mount"
        if family.name == "dit-infer" and model == "L40S" and rng.random() < 0.85:
            return "pp_on_l40s"
        if family.name == "sft-unseeded" and rng.random() < 0.6:
            return "unseeded_split"
        if family.name == "asr-train" and model == "A100" and rng.random() < 0.6:
            return "loader_on_a100"
        if rng.random() < 0.012:
            return rng.choice(["noise_oom", "noise_lag", "noise_silent_timeout"])
        return None

    # --- what a failed attempt leaves behind ----------------------------------------------

    def _fail(self, job, hosts, world, fault, at, family) -> None:
        rng = self.rng
        if fault in self.plants:
            self.plants[fault].incidents += 1
            self.plants[fault].failed_at.append(at.isoformat())
        else:
            self.truth.noise_failures += 1
        seq = rng.randint(50, 90_000)
        lag = None
        extra: dict[int, list[str]] = {}
        dmesg: dict[str, list[str]] = {}
        host_names = [h["name"] for h in hosts]
        if fault == "bad_gpu_host":
            i = host_names.index(self.bad_host)
            lag = i * GPUS_PER_HOST + 3
            if rng.random() < 0.5:
                code = rng.choice([79, 48, 94])
                dmesg[self.bad_host] = [
                    f"[{rng.randint(10**5, 10**7)}.{rng.randint(0, 999999):06d}] NVRM: Xid "
                    f"(PCI:0000:3b:00): {code}, pid={rng.randint(1000, 99999)}, name=python, "
                    + ("GPU has fallen off the bus." if code == 79 else "Ch 00000010")
                ]
        elif fault in ("slow_mount", "noise_lag"):
            lag = 0 if fault == "slow_mount" else rng.randrange(world)
            if fault == "slow_mount":
                dmesg[host_names[0]] = [
                    f"[{rng.randint(10**5, 10**7)}.000000] nfs: server {self.slow_mount} not "
                    "responding, still trying",
                    f"[{rng.randint(10**5, 10**7)}.000000] INFO: task python:"
                    f"{rng.randint(1000, 99999)} blocked for more than 120 seconds.",
                ]
        elif fault == "unseeded_split":
            silent = rng.randrange(world)
            extra[silent] = [f"[rank{silent}]: Training completed. Saving model checkpoint."]
        elif fault == "noise_oom":
            victim = rng.randrange(world)
            extra[victim] = [f"[rank{victim}]: {line}" for line in OOM_TRACEBACK.splitlines()]
        for i, host in enumerate(hosts):
            # The job's prolog runs lscpu on every host.
            lines: list[str] = [f"CPU(s):                          {CPUS_BY_MODEL[host['model']]}"]
            for local in range(GPUS_PER_HOST):
                rank = i * GPUS_PER_HOST + local
                lines += self._rank_lines(
                    fault, family, host, rank, local, world, seq, at, lag, extra
                )
            self._upload(job, host["name"], f"{job}-{host['name']}.log", "\n".join(lines) + "\n")
        for host, text in dmesg.items():
            self._upload(job, host, f"{host}-dmesg.log", "\n".join(text) + "\n")

    def _rank_lines(self, fault, family, host, rank, local, world, seq, at, lag, extra):
        p = f"[rank{rank}]:"
        stamp = _stamp(at)
        lines = [
            f"{p}2026-11-20 10:00:00,000 INFO train.py:88 config: "
            + ", ".join(f"{k}={v}" for k, v in family.config.items())
        ]
        nccl_host = f"{host['name']}:{4000 + local}:{4000 + local}"
        if fault == "socket_rack" and host["rack"] == self.socket_rack:
            lines += [
                f"{p}{nccl_host} [{local}] NCCL INFO NET/IB : No device found.",
                f"{p}{nccl_host} [{local}] NCCL INFO NET/Socket : Using [0]eth0:10.1.0.{local}<0>",
                f"{p}{nccl_host} [{local}] NCCL INFO Using network Socket",
            ]
        else:
            lines.append(f"{p}{nccl_host} [{local}] NCCL INFO Using network IB")
        lines.append(
            f"{p}{nccl_host} [{local}] NCCL INFO comm 0x55d0c3a0 rank {rank} nranks "
            f"{world} cudaDev {local} busId {local + 1}b000 - Init COMPLETE"
        )
        lines += extra.get(rank, [])
        if rank in extra and fault in ("unseeded_split", "noise_oom"):
            return lines
        if rank == lag:
            lines.append(
                f"{p}[E{stamp} ProcessGroupNCCL.cpp:1987] {PG0.format(r=rank)} Received a dump "
                f"signal due to a collective timeout from  rank {0 if rank else 1} and we will "
                f"try our best to dump the debug info. Last enqueued NCCL work: {seq - 1}, last "
                f"completed NCCL work: {seq - 1}."
            )
            return lines
        if fault == "pp_on_l40s":
            op, s, pg = ("SEND", 0, 37) if rank == 0 else ("COALESCED", 29, 35)
            numel = 7208960 if op == "SEND" else 18446744073709551615
            lines += [
                f"{p}[E{stamp} ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog caught "
                f"collective operation timeout: WorkNCCL(SeqNum={s}, OpType={op}, NumelIn={numel}, "
                f"NumelOut={numel}, Timeout(ms)=600000) ran for 600011 milliseconds before "
                "timing out.",
                f"{p}[E{stamp} ProcessGroupNCCL.cpp:1664] [PG {pg} Rank {rank}] Exception (either "
                f"an error or timeout) detected by watchdog at work: {s}, last enqueued NCCL "
                f"work: {s}, last completed NCCL work: {max(s - 1, 0)}.",
            ]
            return lines
        timeout = 1_800_000 if fault == "loader_on_a100" else 600_000
        lines += [
            f"{p}[E{stamp} ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=25165824, "
            f"NumelOut=25165824, Timeout(ms)={timeout}) ran for {timeout + 40} milliseconds "
            "before timing out.",
            f"{p}[E{stamp} ProcessGroupNCCL.cpp:2168] {PG0.format(r=rank)}  failure detected by "
            f"watchdog at work sequence id: {seq} PG status: last enqueued work: {seq}, last "
            f"completed work: {seq - 1}",
        ]
        return lines


def _incidents_before(plant: dict, score) -> int:
    """How many of the plant's own failures had happened when ``score`` was first flagged. An
    entity's own count can hold others' incidents too (a setting that a noise failure of the
    same job family also implicated), so the truth's times are what is counted."""
    return sum(datetime.fromisoformat(t) <= score.first_flagged_at for t in plant["failed_at"])


def evaluate(truth: dict, scores) -> dict:
    """Per planted culprit: flagged or not, after how many of its incidents; and overall
    precision and recall of the flagged culprits. ``scores`` are CulpritScore rows."""
    flagged = {f"{s.entity.kind}:{s.entity.key}": s for s in scores if s.flagged}
    per_plant = []
    matched: set[str] = set()
    for plant in truth["plants"]:
        hits = [flagged[e] for e in plant["entities"] if e in flagged]
        matched |= {e for e in plant["entities"] if e in flagged}
        first = min(hits, key=lambda s: s.first_flagged_at) if hits else None
        per_plant.append(
            {
                "id": plant["id"],
                "planted": plant["kind"],
                "culprit": plant["culprit"],
                "incidents": plant["incidents"],
                "flagged": bool(hits),
                "flagged_as": [f"{s.entity.kind}:{s.entity.key}" for s in hits],
                "after_incidents": _incidents_before(plant, first) if first else None,
                "explanation": first.explanation if first else "",
            }
        )
    false = sorted(set(flagged) - matched)
    plants_found = sum(p["flagged"] for p in per_plant)
    return {
        "plants": per_plant,
        "flagged": len(flagged),
        "false_positives": false,
        "precision": round(len(matched) / len(flagged), 3) if flagged else 1.0,
        "recall": round(plants_found / len(per_plant), 3) if per_plant else 1.0,
        "failures": truth.get("failures"),
        "attempts": truth.get("attempts"),
        "noise_failures": truth.get("noise_failures"),
        "culprits_flagged": dict(Counter(s.culprit for s in flagged.values())),
    }
