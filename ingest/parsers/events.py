"""Typed events that the parsers produce and the diagnosis core consumes.

Every event remembers where it came from (``line``, ``text``) so a verdict can cite its evidence,
and which rank printed it when the log says so. Events are plain frozen dataclasses: they cross
from the parser to the database and back (``to_row`` / ``from_row``) and into the pure core.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

# Evidence text is untrusted and unbounded; this is what we keep of one line.
MAX_EVENT_TEXT = 2000
# Event.rank and Event.line are 32-bit integer columns.
MAX_STORED_INT = 2**31 - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    kind: ClassVar[str] = "event"
    line: int
    text: str
    rank: int | None = None  # global rank when the log says it
    source: str = ""  # file name or upload label the line came from

    def attrs(self) -> dict[str, Any]:
        """The kind-specific fields, for storage in a JSON column."""
        base = {f.name for f in dataclasses.fields(Event)}
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in base
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchdogTimeout(Event):
    """``Watchdog caught collective operation timeout: WorkNCCL(...) ran for N milliseconds``."""

    kind: ClassVar[str] = "watchdog_timeout"
    pg: str | None = None  # process group id or name as printed ("0", "37", "default_pg")
    pg_rank: int | None = None  # the rank inside that process group
    seq: int | None = None  # SeqNum; absent before PyTorch 1.9
    op: str = ""  # OpType, e.g. ALLREDUCE, _ALLGATHER_BASE, SEND, COALESCED
    numel_in: int | None = None
    numel_out: int | None = None
    timeout_ms: int | None = None
    ran_for_ms: int | None = None
    # Where ``rank`` was read: "launcher" (a "[rank3]:" or srun prefix: the global rank),
    # "watchdog" (the line's own "[Rank 3]", which is the rank inside the timed-out process
    # group; global only on the default group), "" (stored before this was recorded).
    rank_from: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkProgress(Event):
    """The process group's progress when the watchdog fired: which seq failed, what was last
    enqueued and last completed on this rank (``last completed NCCL work: 18``)."""

    kind: ClassVar[str] = "work_progress"
    pg: str | None = None
    pg_rank: int | None = None
    failed_seq: int | None = None
    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None


def storable_text(text: str) -> str:
    """``text`` as every database backend can store it. Untrusted input reaches events as a NUL
    (a log line, a JSON ``"\\u0000"``), which PostgreSQL refuses in text and jsonb, and as a lone
    surrogate (a JSON ``"\\ud800"``), which no UTF-8 encoder takes: both become U+FFFD, as
    invalid UTF-8 in a log does."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def storable(value: Any) -> Any:
    """A parsed value as a JSON column can hold it: text made storable, NaN and infinities
    (valid Python floats, refused by PostgreSQL's jsonb) as None, tuples as lists."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {storable_text(str(k)): storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(v) for v in value]
    return value


def storable_rank(rank: Any) -> int | None:
    """A rank a crafted artifact names (``[rank99999999999]``, ``"rank": 1e18``) that no job
    can have is no rank: None, rather than an integer column overflowing."""
    if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank <= MAX_STORED_INT:
        return rank
    return None


def in_rank_file(event: Event, file_rank: int | None) -> Event:
    """``event`` as read from the file of rank ``file_rank`` (an upload's rank, a rankN.log): an
    event that names no rank is that rank's, and so is a watchdog line whose only rank is its
    own "[Rank N]" — the rank inside the timed-out group, while the file's rank is global."""
    if file_rank is None:
        return event
    if event.rank is None:
        return dataclasses.replace(event, rank=file_rank)
    if getattr(event, "rank_from", "") == "watchdog" and event.rank != file_rank:
        return dataclasses.replace(event, rank=file_rank, rank_from="file")
    return event


def event_row(event: Event, *, default_rank: int | None = None) -> dict[str, Any]:
    """The columns of one stored event (rank, line, text, attrs), bounded and storable."""
    default_rank = storable_rank(default_rank)
    event = in_rank_file(event, default_rank)
    rank = storable_rank(event.rank)  # a crafted rank no job can have is none: the upload's
    return {
        "rank": rank if rank is not None else default_rank,
        "line": min(max(event.line, 0), MAX_STORED_INT),
        "text": storable_text(event.text[:MAX_EVENT_TEXT]),
        "attrs": storable(event.attrs()),
    }


EVENT_TYPES: dict[str, type[Event]] = {}


def register(cls: type[Event]) -> type[Event]:
    EVENT_TYPES[cls.kind] = cls
    return cls


for _cls in (WatchdogTimeout, WorkProgress):
    register(_cls)


@functools.cache
def _field_names(cls: type[Event]) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def event_from_row(
    kind: str, *, line: int, text: str, rank: int | None, source: str, attrs: dict[str, Any]
) -> Event | None:
    """Rebuild an event stored by the server. Unknown kinds (from a newer parser) are skipped."""
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        return None
    names = _field_names(cls)
    # JSON storage turns tuples into lists; events are frozen and hashable again after this.
    known = {k: _frozen(v) for k, v in attrs.items() if k in names}
    return cls(line=line, text=text, rank=rank, source=source, **known)


@dataclass(frozen=True, slots=True, kw_only=True)
class DumpSignal(Event):
    """A rank was told to dump debug info. ``from_rank`` None means "from this local rank";
    the line also carries this rank's progress, which is how we learn where ranks that did not
    time out themselves had got to."""

    kind: ClassVar[str] = "dump_signal"
    pg: str | None = None
    pg_rank: int | None = None
    from_rank: int | None = None
    via_store: bool = False
    last_enqueued: int | None = None
    last_completed: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatTimeout(Event):
    """The watchdog thread itself got stuck (``Heartbeat monitor timed out!``)."""

    kind: ClassVar[str] = "heartbeat_timeout"
    pg: str | None = None
    pg_rank: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveStack(Event):
    """The Python frames of the failed collective (Flight Recorder enabled)."""

    kind: ClassVar[str] = "collective_stack"
    frames: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class DesyncReport(Event):
    """``TORCH_NCCL_DESYNC_DEBUG`` analysis: ranks that never joined, or that joined a
    collective but did not finish it."""

    kind: ClassVar[str] = "desync_report"
    never_joined: tuple[int, ...] = ()
    not_finished: tuple[int, ...] = ()
    seq: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveMismatch(Event):
    """``TORCH_DISTRIBUTED_DEBUG=DETAIL`` found two ranks in different collectives."""

    kind: ClassVar[str] = "collective_mismatch"
    seq: int | None = None
    rank_a: int | None = None
    op_a: str = ""
    shape_a: str = ""
    rank_b: int | None = None
    op_b: str = ""
    shape_b: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchdogAbort(Event):
    """The watchdog took the process down after a failed or timed-out collective, seen from its
    abort message or the C++ frame of its timeout check (the timeout line may be missing)."""

    kind: ClassVar[str] = "watchdog_abort"


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreTimeout(Event):
    """A rank's wait on the c10d TCPStore expired (torch/csrc/distributed/c10d/socket.cpp, 2.2+:
    ``[c10d] waitForInput: socket SocketImpl(...) timed out after 1800000ms``): it waited for a
    key another rank had not yet written (a store-based barrier, an object exchange), as long as
    the process group's timeout."""

    kind: ClassVar[str] = "store_timeout"
    timeout_ms: int | None = None


for _cls in (
    StoreTimeout,
    WatchdogAbort,
    DumpSignal,
    HeartbeatTimeout,
    CollectiveStack,
    DesyncReport,
    CollectiveMismatch,
):
    register(_cls)


# --- NCCL debug output (nccl.py) -------------------------------------------------------------
# NCCL prints ``host:pid:tid [cudaDev] NCCL INFO …``; ``host`` and ``local_rank`` (the bracketed
# device index of the printing process) say where a line came from when no ``[rankN]:`` does.


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclNetwork(Event):
    """``NCCL INFO Using network IB`` / ``IBext_v8`` / ``Socket``: the inter-node transport."""

    kind: ClassVar[str] = "nccl_network"
    host: str = ""
    local_rank: int | None = None
    network: str = ""  # as printed: "IB", "IBext", "IBext_v8", "Socket", "AWS Libfabric"…


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclNetDevices(Event):
    """``NET/IB : Using [0]mlx5_0:1/IB …``, ``NET/Socket : Using [0]eth0:10.0.0.1<0>``,
    ``Bootstrap : Using eth0:10.0.0.1<0>``: the interfaces NCCL chose."""

    kind: ClassVar[str] = "nccl_net_devices"
    host: str = ""
    local_rank: int | None = None
    transport: str = ""  # "IB", "Socket" or "Bootstrap"
    devices: tuple[str, ...] = ()  # "mlx5_0:1/IB", "eth0:10.0.0.1"
    link_local: bool = False  # the first device has an IPv6 link-local (fe80::) address


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclIbUnavailable(Event):
    """InfiniBand is not used: ``NET/IB : No device found``, ``Failed to open libibverbs``,
    ``NCCL_IB_DISABLE set by environment to 1``. NCCL then falls back to sockets."""

    kind: ClassVar[str] = "nccl_ib_unavailable"
    host: str = ""
    local_rank: int | None = None
    reason: str = ""  # "no_device", "no_libibverbs", "disabled_by_env"


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclChannel(Event):
    """``Channel 00/0 : 0[0] -> 1[1] via P2P/IPC``. NCCL prints one per channel and peer; the
    parser keeps the first line of each transport per printing process."""

    kind: ClassVar[str] = "nccl_channel"
    host: str = ""
    local_rank: int | None = None
    transport: str = ""  # "P2P", "SHM", "NET/IB", "NET/Socket", "NET/<plugin>", "CollNet", "NVLS"
    path: str = ""  # as printed after "via": "P2P/IPC/read", "NET/IB/0/GDRDMA", "SHM/direct/direct"
    gdr: bool = False  # GPUDirect RDMA in use


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclInit(Event):
    """``… rank 3 nranks 8 cudaDev 3 busId 47000 … - Init COMPLETE``: rank → GPU placement."""

    kind: ClassVar[str] = "nccl_init"
    host: str = ""
    local_rank: int | None = None
    comm: str = ""  # communicator address, "0x55d0c3a0"
    comm_id: str = ""  # commId (NCCL >= 2.19), shared by every rank of one communicator
    comm_rank: int | None = None  # the rank inside this communicator
    nranks: int | None = None
    cuda_dev: int | None = None
    bus_id: str = ""  # as printed: "47000", "0000:47:00.0"


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclIbError(Event):
    """``NET/IB : Got completion from peer … with error 12`` — an InfiniBand work completion
    failed. ``status`` is the ``ibv_wc_status``; ``follow_on`` marks statuses that only report
    the queue pair being torn down after an earlier error (5 = flush)."""

    kind: ClassVar[str] = "nccl_ib_error"
    host: str = ""
    local_rank: int | None = None
    status: int | None = None
    status_name: str = ""  # "IBV_WC_RETRY_EXC_ERR"
    meaning: str = ""
    follow_on: bool = False
    peer: str = ""  # "10.1.1.2<45678>" when printed (NCCL >= 2.12)
    opcode: int | None = None
    vendor_err: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclIbCallFailed(Event):
    """``Call to ibv_modify_qp failed`` and friends: the verbs layer refused an operation."""

    kind: ClassVar[str] = "nccl_ib_call_failed"
    host: str = ""
    local_rank: int | None = None
    call: str = ""  # "ibv_modify_qp"
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclConnectFailed(Event):
    """``NCCL WARN Connect to 10.0.0.2<43019> failed : Connection timed out``."""

    kind: ClassVar[str] = "nccl_connect_failed"
    host: str = ""
    local_rank: int | None = None
    address: str = ""
    reason: str = ""  # "Connection timed out", "Connection refused", "No route to host"
    link_local: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclError(Event):
    """An NCCL error result, from an NCCL WARN line or from PyTorch's
    ``NCCL error in: …, unhandled system error, NCCL version 2.14.3``."""

    kind: ClassVar[str] = "nccl_error"
    host: str = ""
    local_rank: int | None = None
    error: str = ""  # canonical: "system", "cuda", "internal", "invalid_usage", "invalid_argument",
    #                  "remote", "in_progress", "timeout", "aborted"
    code: int | None = None  # the ncclResult_t value (2 = system error …) when known
    detail: str = ""  # what the line adds (the failing call, "Last error: …")


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclBootstrapFailed(Event):
    """NCCL's own return trace through its bootstrap with ncclSystemError (2): ``bootstrap.cc:270
    -> 2`` (``bootstrap.cu:45 -> 2 [Net]`` before 2.4). The bootstrap is TCP sockets on
    NCCL_SOCKET_IFNAME, so a system error there is a socket call that failed: one process per
    host and code."""

    kind: ClassVar[str] = "nccl_bootstrap_failed"
    host: str = ""
    local_rank: int | None = None
    code: int = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclPeerClosed(Event):
    """``[Service thread] Connection closed by localRank 2``: a process on this host went away
    (crash, OOM) while its peers were still connected to it."""

    kind: ClassVar[str] = "nccl_peer_closed"
    host: str = ""
    local_rank: int | None = None
    peer_local_rank: int | None = None


# --- Kernel and driver (kernel.py) -----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuXid(Event):
    """``NVRM: Xid (PCI:0000:3b:00): 79, pid=…, name=python, GPU has fallen off the bus.``
    ``primary`` is True for codes that are a hardware fault in themselves, False for codes that
    are usually an application error or the consequence of another fault."""

    kind: ClassVar[str] = "gpu_xid"
    pci: str = ""  # "0000:3b:00"
    code: int | None = None
    pid: int | None = None
    process: str = ""
    detail: str = ""
    meaning: str = ""
    primary: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuOffBus(Event):
    """``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`` without an Xid."""

    kind: ClassVar[str] = "gpu_off_bus"
    pci: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelBoot(Event):
    """The kernel's boot banner (``Linux version 5.15.0-119-generic (buildd@…) …``): what a
    kernel log says before it happened a previous boot of the host."""

    kind: ClassVar[str] = "kernel_boot"


@dataclass(frozen=True, slots=True, kw_only=True)
class PcieAer(Event):
    """``PCIe Bus Error: severity=Corrected, type=Data Link Layer`` (kernel AER driver)."""

    kind: ClassVar[str] = "pcie_aer"
    device: str = ""  # the reporting port or device, "0000:00:03.0"
    severity: str = ""  # "corrected", "uncorrected_nonfatal", "uncorrected_fatal"
    error_type: str = ""  # "Data Link Layer", "Physical Layer", "Transaction Layer"
    clock: str = ""  # the line's clock: "boot" (dmesg), "wall", "syslog" (no year); "" none
    at: float | None = None  # seconds on that clock


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuUnreachable(Event):
    """The driver or nvidia-smi cannot talk to a GPU: ``Unable to determine the device handle for
    GPU 0000:03:00.0: Unknown Error``, ``GPU is lost``, ``RmInitAdapter failed``."""

    kind: ClassVar[str] = "gpu_unreachable"
    pci: str = ""
    reason: str = ""


# --- Launcher, crashes and memory (launcher.py) ----------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerFailed(Event):
    """A worker process died: torchrun's ``failed (exitcode: -6) local_rank: 0 (pid: 48096) of
    binary: …``, a shell's ``12345 Killed python train.py`` or srun's ``task 3: Killed``."""

    kind: ClassVar[str] = "worker_failed"
    local_rank: int | None = None
    pid: int | None = None
    exitcode: int | None = None
    signal: str = ""  # "SIGABRT" when the exit code is a negative signal number


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureRecord(Event):
    """One entry of the elastic ``ChildFailedError`` table (``Root Cause (first observed
    failure)`` or ``Failures:``)."""

    kind: ClassVar[str] = "failure_record"
    root_cause: bool = False
    host: str = ""
    local_rank: int | None = None
    exitcode: int | None = None
    pid: int | None = None
    signal: str = ""
    error_file: str = ""
    traceback: str = ""  # the table's traceback field ("Signal 9 (SIGKILL) received by PID 1")
    time: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class TracebackCut(Event):
    """A Python traceback that ends without its exception line (a paste cut short, or the
    process killed while printing it) and whose innermost frame is a torch.distributed call
    (``distributed_c10d.py … in barrier``): that collective raised, what it raised is not here."""

    kind: ClassVar[str] = "traceback_cut"
    location: str = ""  # "distributed_c10d.py:3328 in barrier"
    call: str = ""  # "barrier"


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSignal(Event):
    """``Sending process 48099 closing signal SIGTERM``: the agent stopping the survivors
    after another worker failed, so those exits are consequences."""

    kind: ClassVar[str] = "agent_signal"
    pid: int | None = None
    signal: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CudaOom(Event):
    """``torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB …``."""

    kind: ClassVar[str] = "cuda_oom"
    gpu: int | None = None
    requested_bytes: int | None = None
    capacity_bytes: int | None = None
    free_bytes: int | None = None
    # "nccl": NCCL's own allocation failed (NCCL WARN Cuda failure 'out of memory'); NCCL does
    # not recover from it, the call returns ncclUnhandledCudaError.
    via: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostOomKill(Event):
    """The kernel OOM killer: ``Out of memory: Killed process 1234 (python)``."""

    kind: ClassVar[str] = "host_oom_kill"
    pid: int | None = None
    process: str = ""
    cgroup: bool = False  # a memory cgroup limit (container) rather than the whole host


@dataclass(frozen=True, slots=True, kw_only=True)
class PythonException(Event):
    """The last line of a Python traceback (or an exception line printed without one)."""

    kind: ClassVar[str] = "python_exception"
    exc_type: str = ""  # "torch.distributed.DistBackendError"
    message: str = ""
    location: str = ""  # innermost frame: 'train.py:120 in save_model'
    traceback_line: int | None = None  # where "Traceback (most recent call last):" was


@dataclass(frozen=True, slots=True, kw_only=True)
class CudaError(Event):
    """``CUDA error: an illegal memory access was encountered`` and the other CUDA runtime
    errors PyTorch raises (uncorrectable ECC, launch failure, device-side assert…)."""

    kind: ClassVar[str] = "cuda_error"
    error: str = ""  # the runtime's message, lower case
    hardware: bool = False  # ECC / "GPU has fallen off the bus" style errors


@dataclass(frozen=True, slots=True, kw_only=True)
class RendezvousError(Event):
    """The TCPStore / rendezvous failed (``DistStoreError: Socket Timeout``, rendezvous
    timeouts, ``DistNetworkError``): ranks could not even meet."""

    kind: ClassVar[str] = "rendezvous_error"
    error_type: str = ""
    message: str = ""


# --- Configuration (config.py, and nccl.py for NCCL's own settings) --------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigValue(Event):
    """A setting the job printed: an environment variable, a framework argument, a version.
    ``key`` is canonical (lower case, one name per concept, e.g. ``num_workers`` for
    ``dataloader_num_workers``); ``raw_key`` keeps the spelling; ``number`` is the value as a
    number in canonical units (seconds for timeouts) when it is one."""

    kind: ClassVar[str] = "config_value"
    key: str = ""
    value: str = ""
    raw_key: str = ""
    number: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressBar(Event):
    """The last state of a tqdm progress bar (``Running tokenizer on dataset: 9%| … [29:55<…``).
    One event per description, at its furthest point: long preprocessing shows here."""

    kind: ClassVar[str] = "progress_bar"
    desc: str = ""
    elapsed_s: int | None = None  # None: the bar was cut before its times
    done: int | None = None
    total: int | None = None
    percent: int | None = None


for _cls in (
    NcclNetwork,
    NcclNetDevices,
    NcclIbUnavailable,
    NcclChannel,
    NcclInit,
    NcclIbError,
    NcclIbCallFailed,
    NcclConnectFailed,
    NcclBootstrapFailed,
    NcclError,
    NcclPeerClosed,
    GpuXid,
    GpuOffBus,
    PcieAer,
    KernelBoot,
    GpuUnreachable,
    WorkerFailed,
    FailureRecord,
    TracebackCut,
    AgentSignal,
    CudaOom,
    HostOomKill,
    PythonException,
    CudaError,
    RendezvousError,
    ConfigValue,
    ProgressBar,
):
    register(_cls)


def _frozen(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value
