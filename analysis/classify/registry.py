"""The rule registry: every rule of the core, what it implicates for fleet memory, and its basis.

A rule's id, culprit, strength, fix and predicate live with its predicate (rules.py, crossrank.py,
hardware.py); this table adds, per rule id, what a verdict that matched it implicates across the
fleet (``analysis.memory.incident_implicate`` reads it: no rule id is spelled out there) and the
source its mechanism rests on. ``tests/analysis/test_registry.py`` holds every rule to an entry
here and pins a hash of the whole registry to ``RULESET_VERSION``: a rule that changes meaning
without a new version fails it.

What a rule may implicate (``analysis.memory`` knows how to find each):
  ``hardware_hosts``   hosts and GPUs of the hardware events (Xid, off the bus, AER, CUDA HW)
  ``network_hosts``    hosts and HCAs of the NCCL network errors
  ``socket_racks``     racks (else hosts) whose NCCL fell back to sockets
  ``stall_mounts``     mounts (else hosts) whose storage stalled
  ``signature_hosts``  hosts whose logs hold the known-issue signature
  ``suspect_hosts``    hosts of the verdict's suspected ranks and hosts
  ``config:K,…``       the job's settings K (and the same on each GPU model it ran on)
  ``job_family``       the job family's code path; ``job_family_weak`` only as a weak sign
  ``versions``         the versions the job ran with
"""

from __future__ import annotations

import hashlib
import json

from ingest.parsers.signatures import known_issues

from .crossrank import CROSSRANK_RULES
from .hardware import HARDWARE_RULES
from .rules import RULES, RULESET_VERSION, Rule

ALL_RULES: tuple[Rule, ...] = RULES + CROSSRANK_RULES + HARDWARE_RULES

LOADER_KEYS = "config:num_workers,prefetch,prefetch_factor"

IMPLICATES: dict[str, tuple[str, ...]] = {
    "gpu_hardware_fault": ("hardware_hosts",),
    "pcie_link_replaying": ("hardware_hosts",),
    "rank_crashed_first": ("job_family_weak",),
    "collective_mismatch": ("job_family",),
    "watchdog_op_mismatch": ("job_family",),
    "watchdog_seq_spread": ("job_family",),
    "stack_waits_on_data": ("suspect_hosts", LOADER_KEYS),
    "network_errors": ("network_hosts",),
    "nccl_bootstrap_socket_failed": ("config:nccl_socket_ifname",),
    "known_library_bug": ("versions",),
    "known_network_issue": ("signature_hosts",),
    "known_host_issue": ("signature_hosts",),
    "known_layout_issue": ("job_family",),
    "known_code_path_issue": ("job_family",),
    "build_mismatch": ("versions",),
    "known_version_issue": ("versions",),
    "storage_stall": ("stall_mounts",),
    "disk_full": ("job_family",),
    "preprocessing_outlasted_timeout": ("job_family",),
    "startup_work_running": ("job_family",),
    "prep_cut_at_default_wait": ("job_family",),
    "first_barrier_timed_out": ("job_family",),
    "dataloader_oversubscribed": (LOADER_KEYS,),
    "p2p_schedule_desync": ("config:pipeline_parallel",),
    "rank_left_early": ("job_family",),
    "old_communication_stack": ("versions",),
    "socket_transport_multinode": ("socket_racks",),
    "laggard_waits_on_data": ("suspect_hosts", LOADER_KEYS),
    "laggard_left_path": ("job_family",),
    "logging_rank_slows": ("suspect_hosts",),
    # Cross-rank and host-counter rules implicate nothing of their own yet: their verdicts reach
    # fleet memory through the lagging rank's host (analysis.memory.entities) when they explain
    # nothing else.
    "straggler_last_to_start": (),
    "fr_missing_rank_hardware": (),
    "fr_rank_ran_more_steps": (),
    "fr_collective_mismatch": (),
    "slow_rank_storage_io": (),
    "slow_rank_dataloader": (),
    "fr_rank_missing": (),
    "straggler_rank": (),
    "gpu_error_counters": (),
    "data_order_mismatch": (),
    "gpu_throttled": (),
    "host_cpu_memory_exhausted": (),
    "disk_io_saturated": (),
}

_C10D = "PyTorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp"
BASIS: dict[str, str] = {
    "gpu_hardware_fault": "NVIDIA Xid catalog (primary Xids 48, 63, 64, 74, 79, 94, 95…); PCIe AER "
    "uncorrected errors (PCIe base spec); CUDA errors that name the device",
    "pcie_link_replaying": "DCGM_LIMIT_MAX_PCIREPLAY_RATE (dcgmlib GpuHardwareLimits.h): '8 "
    "replays per minute is the maximum recommended by RM'; a corrected Data Link/Physical Layer "
    "error is a replay (PCIe base spec, Data Link Layer retry)",
    "rank_crashed_first": "torchelastic ChildFailedError root cause (first observed failure per "
    "agent); a survivor's timeout or lost peer is an echo, SIGABRT (-6) is the NCCL watchdog",
    "collective_mismatch": "TORCH_DISTRIBUTED_DEBUG=DETAIL collective fingerprint checks (c10d "
    "ProcessGroupWrapper)",
    "watchdog_op_mismatch": f"{_C10D}: seqCollective_ numbers each group's collectives in issue "
    "order (p2p on its own counter since 2.4)",
    "watchdog_seq_spread": f"{_C10D}: seqCollective_ per group in issue order; one call site "
    "reached at different seqs means different numbers of prior collectives",
    "stack_waits_on_data": "py-spy dump / faulthandler: the rank's main thread blocked in a "
    "queue get under torch.utils.data's DataLoader (or a trainer's data iterator)",
    "network_errors": "libibverbs ibv_wc_status codes; NCCL net_ib/socket WARN strings",
    "nccl_bootstrap_socket_failed": "NCCL bootstrap.cc: the bootstrap is TCP sockets on "
    "NCCL_SOCKET_IFNAME (NCCL environment-variable docs); nccl.h: ncclSystemError = 2, a "
    "failed system call",
    "known_library_bug": "ingest/parsers/known_issues.json entries (release notes, issues)",
    "known_network_issue": "ingest/parsers/known_issues.json entries (NCCL docs, issues)",
    "known_host_issue": "ingest/parsers/known_issues.json entries (NCCL troubleshooting guide)",
    "known_layout_issue": "CUDA runtime API: cudaErrorInvalidDevice (device ordinal not valid)",
    "known_code_path_issue": "torch/csrc/distributed/c10d/reducer.cpp "
    "Reducer::ensure_prior_reduction_finished (parameters that received no gradient)",
    "build_mismatch": "ingest/parsers/known_issues.json entries marked names_its_cause (CUDA "
    "runtime API: cudaErrorNoKernelImageForDevice, cudaErrorInsufficientDriver; torch.cuda "
    "capability check)",
    "known_version_issue": "ingest/parsers/known_issues.json bounded affected ranges",
    "storage_stall": "Linux NFS client / hung-task detector / Lustre client messages",
    "disk_full": "errno ENOSPC (write(2), fallocate(2)); POSIX shm and semaphores live in /dev/shm "
    "(shm_overview(7), sem_overview(7)), whose ENOSPC is shared memory's, not storage's",
    "preprocessing_outlasted_timeout": "the default process-group timeout (torch.distributed "
    "default_pg_timeout, 30 min; HF ddp_timeout) against the progress bar's elapsed time or a "
    "phase's reported length; "
    "barrier-sized waits: ProcessGroupNCCL::barrier all-reduces one element; the c10d store "
    "wait (socket.cpp waitForInput) expires at the same timeout",
    "startup_work_running": "torch.distributed default_pg_timeout (30 min) against start-up "
    "work seen still running; faiss/Clustering.cpp verbose output ('Clustering N points in "
    "dD to k clusters', 'Iteration i (t s, search s s)')",
    "prep_cut_at_default_wait": "torch/distributed/constants.py default_pg_timeout (30 min), HF "
    "ddp_timeout (1800 s), ProcessGroupNCCL.hpp kProcessGroupNCCLDefaultTimeout (10 min, 2.2+); "
    "the latency to a kill: TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC (480 s), torchrun's "
    "monitor_interval and 30 s SIGTERM grace",
    "first_barrier_timed_out": "the first collectives time out only when a rank is late at "
    "start-up",
    "dataloader_oversubscribed": "torch.utils.data.DataLoader check_worker_number_rationality "
    "(workers against the host's usable CPUs)",
    "p2p_schedule_desync": f"{_C10D}: p2p work on per-pair communicators, seq per group",
    "rank_left_early": f"{_C10D}: a collective completes on every member or none; a member "
    "whose own log shows no timeout was not in it",
    "old_communication_stack": "older than torch.distributed's own floor: PyTorch 1.8 dropped "
    "CUDA 9.2 builds (release notes), and ProcessGroupNCCL's point-to-point ops need NCCL >= "
    "2.7 ('only supports send for NCCL lib version >= 2.7.0')",
    "socket_transport_multinode": "NCCL docs: NCCL_SOCKET_IFNAME / NET/Socket vs NET/IB transport",
    "laggard_waits_on_data": "mmengine IterTimerHook / detectron2 data_time: the wait for the "
    "batch; Flight Recorder says which rank the others waited for",
    "laggard_left_path": "Flight Recorder: the rank never entered the collective; its own steps "
    "show no slowdown and it raised nothing",
    "logging_rank_slows": "rank 0 is where trainers log and checkpoint; its own step time grew "
    "while its data wait did not",
    "straggler_last_to_start": "Kineto trace record_param_comms Seq joined to Flight Recorder "
    "collective_seq_id: the rank that starts last",
    "fr_missing_rank_hardware": "Flight Recorder missing rank + NVIDIA Xid on its host",
    "fr_rank_ran_more_steps": "Flight Recorder: one rank still in a step's collective while the "
    "others moved on",
    "fr_collective_mismatch": "Flight Recorder entries at one collective_seq_id (op, sizes, "
    "dtypes), as torch.distributed.flight_recorder's fr_trace checks them",
    "slow_rank_storage_io": "Kineto trace: share of the laggard's step in file writes/fsync",
    "slow_rank_dataloader": "Kineto trace: share of the laggard's step in DataLoader __next__",
    "fr_rank_missing": "Flight Recorder: a member never entered the collective",
    "straggler_rank": "Kineto trace: last into collectives on every profiled step",
    "gpu_error_counters": "NVML ECC, row-remap, NVLink and PCIe replay counters",
    "data_order_mismatch": "the integration's per-epoch dataset and sampler fingerprints",
    "gpu_throttled": "NVML clocks_event_reasons (thermal, power)",
    "host_cpu_memory_exhausted": "/proc/stat and /proc/meminfo of the agent's host readings",
    "disk_io_saturated": "/proc/diskstats busy time and await of the agent's host readings",
}


def registry_hash() -> str:
    """A digest of everything a verdict depends on in the registry and the knowledge base (not
    the predicates' code, which the ruleset version stands for): a knowledge-base entry that
    names a culprit changes verdicts as a rule does."""
    rows = [
        {
            "id": rule.id,
            "culprit": rule.culprit,
            "confidence": rule.confidence,
            "fix": rule.fix,
            "needs": list(rule.needs),
            "marks_failure": rule.marks_failure,
            "implicates": list(IMPLICATES.get(rule.id, ("?",))),
            "basis": BASIS.get(rule.id, "?"),
        }
        for rule in ALL_RULES
    ]
    rows += [
        {key: entry.get(key) for key in ("id", "culprit", "signature", "affected", "fix")}
        for entry in sorted(known_issues().values(), key=lambda entry: entry["id"])
    ]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


__all__ = ["ALL_RULES", "BASIS", "IMPLICATES", "RULESET_VERSION", "registry_hash"]
