"""NCCL's own debug output (``NCCL_DEBUG=INFO`` / ``WARN``) and the NCCL errors PyTorch raises.

NCCL lines look like ``host:pid:tid [cudaDev] NCCL INFO <message>``; since NCCL 2.20 WARN lines
also name the source file (``transport/net_ib.cc:1296 NCCL WARN …``), and log collectors put
timestamps in front. Messages we read, by what they tell the diagnosis:

- transport: ``Using network IB|IBext_v8|Socket``, ``NET/IB : No device found``,
  ``NET/Socket : Using …``, ``Bootstrap : Using …``, ``Failed to open libibverbs``,
  ``NCCL_* set by environment to …``, channel paths (``via P2P/IPC``, ``via NET/IB/0/GDRDMA``);
- placement: ``… rank 3 nranks 8 cudaDev 3 busId 47000 … - Init COMPLETE``;
- failures: IB work completions with their ``ibv_wc_status``, ``Call to ibv_* failed``,
  ``Connect to … failed``, NCCL result strings, ``Connection closed by localRank N``.

A job with ``NCCL_DEBUG=INFO`` prints hundreds of INFO lines per rank at start-up, and all of them
reach ``feed`` (they share the ``NCCL`` trigger), so every check here is a substring test first.
"""

from __future__ import annotations

import re

from .events import (
    ConfigValue,
    CudaOom,
    Event,
    NcclBootstrapFailed,
    NcclChannel,
    NcclConnectFailed,
    NcclError,
    NcclIbCallFailed,
    NcclIbError,
    NcclIbUnavailable,
    NcclInit,
    NcclNetDevices,
    NcclNetwork,
    NcclPeerClosed,
)
from .lines import Line
from .prefix import Prefix

# "NCCL" covers every NCCL INFO/WARN line, "NCCL version", "NCCL error in:", NCCL_* variables
# and PyTorch's ProcessGroupNCCL lines; "Error" the ncclSystemError-style lines of PyTorch
# exceptions that do not repeat the word NCCL.
# "Connect to" the socket failures PyTorch 1.13+ reprints after "Last error:" on a line of their
# own, without the NCCL WARN header.
# "bootstrap.c" NCCL's return trace through its bootstrap, which NCCL before 2.4 printed as
# "host:pid:tid [0] INFO bootstrap.cu:45 -> 2 [Net]", without the word NCCL.
TRIGGERS: tuple[bytes, ...] = (
    b"NCCL",
    b"Error",
    b"Connect to ",
    b"connectFullMesh failed",
    b"bootstrap.c",
)
# NCCL's return trace ("<file>:<line> -> <ncclResult_t>"), through bootstrap.cc/.cu.
_BOOTSTRAP_TRACE = re.compile(r"\bbootstrap\.cc?u?:\d+ -> (?P<code>\d+)")
NCCL_SYSTEM_ERROR = 2  # ncclResult_t ncclSystemError (nccl.h): a system call failed
# ncclRemoteError (nccl.h, 2.13+): "A call failed possibly due to a network error or a remote
# process exiting". From 2.19 NCCL's socket layer returns it when a connect exceeds its retries
# (misc/socket.cc socketPollConnect "exceeded timeouts"); inside the bootstrap no transport
# exists yet, so the network it names is the bootstrap's sockets (a peer that died is read from
# its own crash, which then outranks this).
NCCL_REMOTE_ERROR = 6
BOOTSTRAP_SOCKET_ERRORS = (NCCL_SYSTEM_ERROR, NCCL_REMOTE_ERROR)

# ibv_wc_status (libibverbs <infiniband/verbs.h>) → name, meaning, and whether it is usually a
# follow-on (the queue pair was already in error because of an earlier failure).
IBV_WC_STATUS: dict[int, tuple[str, str, bool]] = {
    0: ("IBV_WC_SUCCESS", "success", False),
    1: (
        "IBV_WC_LOC_LEN_ERR",
        "local length error: a message longer than the receive buffer",
        False,
    ),
    2: ("IBV_WC_LOC_QP_OP_ERR", "local QP operation error (bad work request)", False),
    3: ("IBV_WC_LOC_EEC_OP_ERR", "local EE context operation error", False),
    4: (
        "IBV_WC_LOC_PROT_ERR",
        "local protection error: the HCA may not access the registered memory "
        "(often GPUDirect RDMA / peer memory not working)",
        False,
    ),
    5: (
        "IBV_WC_WR_FLUSH_ERR",
        "work request flushed: the QP was already in error, a follow-on of an earlier failure",
        True,
    ),
    6: ("IBV_WC_MW_BIND_ERR", "memory window bind error", False),
    7: ("IBV_WC_BAD_RESP_ERR", "bad response from the remote side", False),
    8: ("IBV_WC_LOC_ACCESS_ERR", "local access error", False),
    9: ("IBV_WC_REM_INV_REQ_ERR", "remote invalid request", False),
    10: ("IBV_WC_REM_ACCESS_ERR", "remote access error: the peer rejected the RDMA access", False),
    11: ("IBV_WC_REM_OP_ERR", "remote operation error", False),
    12: (
        "IBV_WC_RETRY_EXC_ERR",
        "transport retry counter exceeded: no ACK from the peer (link down, peer process dead, "
        "congestion or a bad cable/switch port)",
        False,
    ),
    13: (
        "IBV_WC_RNR_RETRY_EXC_ERR",
        "receiver-not-ready retry counter exceeded: the peer posted no receive in time",
        False,
    ),
    14: ("IBV_WC_LOC_RDD_VIOL_ERR", "local RDD violation", False),
    15: ("IBV_WC_REM_INV_RD_REQ_ERR", "remote invalid RD request", False),
    16: ("IBV_WC_REM_ABORT_ERR", "remote aborted", False),
    17: ("IBV_WC_INV_EECN_ERR", "invalid EE context number", False),
    18: ("IBV_WC_INV_EEC_STATE_ERR", "invalid EE context state", False),
    19: ("IBV_WC_FATAL_ERR", "fatal error of the HCA", False),
    20: ("IBV_WC_RESP_TIMEOUT_ERR", "response timeout", False),
    21: ("IBV_WC_GENERAL_ERR", "general error", False),
}

# ncclResult_t (nccl.h): value → (canonical error, the strings NCCL and PyTorch print for it).
NCCL_RESULTS: dict[int, tuple[str, tuple[str, ...]]] = {
    1: ("cuda", ("unhandled cuda error", "ncclUnhandledCudaError")),
    2: ("system", ("unhandled system error", "ncclSystemError")),
    3: ("internal", ("internal error", "ncclInternalError")),
    4: ("invalid_argument", ("invalid argument", "ncclInvalidArgument")),
    5: ("invalid_usage", ("invalid usage", "ncclInvalidUsage")),
    6: ("remote", ("remote process exited or there was a network error", "ncclRemoteError")),
    7: ("in_progress", ("NCCL operation in progress", "ncclInProgress")),
}
_RESULT_BY_TEXT = {
    text: (code, name) for code, (name, texts) in NCCL_RESULTS.items() for text in texts
}

# The "host:pid:tid [cudaDev]" header of an NCCL line (all NCCL versions).
_HEADER = re.compile(r"(?P<host>[\w.\-]+):\d+:\d+ \[(?P<dev>\d+)\]")
# "NCCL version 2.18.5+cuda12.1": rank 0's INFO line (2.4+), a bare stdout line (<= 2.8), and the
# tail of PyTorch's "NCCL error in: …, NCCL version 2.14.3".
_VERSION = re.compile(r"NCCL version (?P<ver>\d+\.\d+\.\d+)(?:[-+.]\w*)*")
_NETWORK = re.compile(r"Using network (?P<net>\S.*?)\s*$")  # 2.4+
# "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>" (2.4+),
# "NET/Socket : Using [0]eth0:10.0.0.1<0>", "Bootstrap : Using eth0:10.0.0.1<0>" (2.4-2.18) and
# "Bootstrap: Using [0]…" (2.19+, no space before the colon).
_USING = re.compile(r"(?P<what>NET/IB|NET/Socket|Bootstrap)\s?: Using (?P<devs>.*)")
_DEVICE = re.compile(r"(?:\[\d+\])?(?P<dev>[^\s\[\];<]+)(?:<\d+>)?")
_ENV = re.compile(r"\b(?P<key>NCCL_\w+) set by environment to (?P<value>\S*?)\.?\s*$")  # all eras
# "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC" (2.12+), "Channel 00 : 0[1b000] -> 1[1c000] via
# P2P/IPC" (<= 2.11), "Channel 00/1 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA" (2.12+).
_CHANNEL = re.compile(r"Channel \d+(?:/\d+)? : .*? via (?P<path>\S.*?)\s*$")
# Init COMPLETE in every era:
#   2.4-2.6 : "comm 0x7f1f2c001b40 rank 0 nranks 4 cudaDev 0 nvmlDev 0 - Init COMPLETE"
#   2.7-2.18: "comm 0x55d0c3a0 rank 3 nranks 8 cudaDev 3 busId 47000 - Init COMPLETE"
#   2.19+   : "ncclCommInitRank comm 0x… rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 18000
#              commId 0x… [localSize 296 used … bytes on core 19] - Init COMPLETE"
_INIT = re.compile(
    r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) "
    r"cudaDev (?P<dev>\d+)(?: nvmlDev \d+)?(?: busId (?P<bus>[0-9a-fA-F:.]+))?"
    r"(?: commId (?P<cid>0x[0-9a-fA-F]+))?.*?- Init COMPLETE"
)
# IB work completion errors:
#   <= 2.11  : "NET/IB : Got completion with error 12, opcode 1, len 32768, vendor err 129"
#   2.12-2.18: "NET/IB : Got completion from peer 10.1.1.2<45678> with error 12, opcode 0,
#               len 0, vendor err 129 (Recv)"
#   2.19-2.22: "NET/IB: Got completion from peer 10.0.0.2<51161> with status=4 opcode=0 len=0
#               vendor err 81 (Send) localGid … hca mlx5_1"
#   2.23+    : "… with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RECV_RDMA_WITH_IMM(129)
#               vendor_err=129 …"
_IB_COMPLETION = re.compile(
    r"Got completion (?:from peer (?P<peer>\S+) )?with (?:error |status=)"
    r"(?:(?P<sname>IBV_WC_\w+)\()?(?P<status>\d+)\)?"
    r"(?:,? opcode[ =](?:\w+\()?(?P<opcode>\d+)\)?)?"
    r"(?:.*?vendor[ _]err[ =](?P<vendor>\d+))?"
)
_IB_CALL = re.compile(r"Call to (?P<call>ibv_\w+) failed\s*(?P<detail>.*)$")  # all eras
# "Connect to 10.0.0.2<43019> failed : Connection timed out" (2.4+; "socketStartConnect: "
# in front since 2.19).
_CONNECT = re.compile(r"Connect to (?P<addr>\S+) failed\s*:\s*(?P<reason>.*?)\s*$")
# PyTorch: "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, unhandled
# system error, NCCL version 2.14.3" (1.6+), "NCCL error: unhandled system error" (c10d 1.0-1.5),
# "NCCL Error 2: unhandled system error" (THD / c10d <= 1.1).
_PT_ERROR = re.compile(
    r"NCCL (?:[Ee]rror(?: in: \S+?,|:)|Error (?P<code>\d+):)\s*(?P<what>[^,\n]*?)\s*(?:,|$)"
)
# PyTorch 1.13+ adds the result name on the next line: "ncclSystemError: System call …".
_RESULT_NAME = re.compile(
    r"\b(?P<name>nccl(?:UnhandledCuda|System|Internal|InvalidArgument|"
    r"InvalidUsage|Remote)Error|ncclInProgress)\b:?\s*(?P<detail>.*)"
)
_ABORTED = re.compile(r"NCCL communicator was aborted(?: on rank (?P<rank>\d+))?")  # 1.9+
_PEER_CLOSED = re.compile(r"Connection closed by localRank (?P<peer>\d+)")  # 2.12+
# NCCL WARN, all eras; newer CUDACHECKs print the cudaError_t number first ("Cuda failure 2 'out
# of memory'", src/include/checks.h), as the knowledge base's NVLS entry reads it.
_CUDA_FAILURE = re.compile(r"Cuda failure (?:\d+ )?'(?P<what>[^']*)'")
_REMOTE_CLOSED = re.compile(r"(?:Connection closed by remote peer|Connection reset by peer)")


# Every INFO message _debug_line reads holds one of these (skip_raw drops the rest undecoded).
_INFO_WANTED: tuple[bytes, ...] = (
    b"Init COMPLETE",
    b"set by environment",
    b"Using",
    b"No device found",
    b"libibverbs",
    b"Connection closed",
    b"NCCL version",
    b"Got completion",
    b"Call to ibv_",
    b"Connect to",
    b"rror",
    b"failed",
    b"Cuda failure",
    b"reset by peer",
    b"bootstrap.c",
    # The knowledge base's NCCL 2.25 Blackwell entry: an INFO line in 2.25.1, a WARN later.
    b"exceeds device/fn maxSharedMem",
)


# What the ``NCCL`` trigger means to a pattern scanner (Hyperscan): the lines ``skip_raw`` may
# keep, so that the INFO lines it would drop (a third of a ``NCCL_DEBUG=INFO`` log are the
# per-collective ``NCCL_DEBUG_SUBSYS=COLL`` lines) never reach Python at all. A superset of what
# skip_raw keeps, built from the same table: "NCCL" not followed by " INFO" (ProcessGroupNCCL,
# NCCL WARN, "NCCL error"), and INFO lines with a channel's transport or a wanted word after the
# tag. One pattern per word: Hyperscan splits "literal.*literal" into two literal searches,
# where one alternation after ``.*`` runs an automaton over every INFO line (twice the time on
# an INFO-heavy log). ``.`` stops at a newline, so each pattern stays inside one line.
TRIGGER_SHAPES: dict[bytes, tuple[bytes, ...]] = {
    b"NCCL": (
        rb"NCCL(?:[^ ]|$| (?:[^I]|$)| I(?:[^N]|$)| IN(?:[^F]|$)| INF(?:[^O]|$))",
        *(rb"NCCL INFO.*" + re.escape(word) for word in (b" via ", *_INFO_WANTED)),
    )
}

# The wanted INFO lines that state a setting rather than an event: their exact repeats fold.
_INFO_SETTINGS = frozenset((b"set by environment", b"Using", b"NCCL version"))


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


class NcclParser:
    """Stateful only to print each channel transport and each setting once per process."""

    triggers = TRIGGERS
    trigger_shapes = TRIGGER_SHAPES

    def __init__(self) -> None:
        self._channels: set[tuple[str, str, str]] = set()
        self._settings: set[tuple[str, str, str]] = set()
        self._raw_channels: set[tuple[bytes, bytes]] = set()
        self._raw_warnings: set[tuple[bytes, bytes]] = set()
        self._raw_settings: set[tuple[bytes, bytes, bytes]] = set()
        self.folded = 0  # lines skipped as exact repeats (see skip_raw)
        self._inits: set[tuple[str, str, str, str]] = set()
        self._last_error: tuple[int, str] | None = None
        self._bootstrap: set[str] = set()

    def feed(self, line: Line, pre: Prefix, follow) -> list[Event]:
        text = pre.rest
        if "bootstrap.c" in text and " -> " in text:
            return self._bootstrap_trace(line, pre, text)
        if "NCCL" in text:
            if "NCCL INFO" in text or "NCCL WARN" in text:
                return self._debug_line(line, pre, text)
            return self._other_line(line, pre, text) + self._reprinted_connect(line, pre, text)
        out = self._result_name(line, pre, text) if "nccl" in text else []
        return out + self._reprinted_connect(line, pre, text)

    def _bootstrap_trace(self, line: Line, pre: Prefix, text: str) -> list[Event]:
        m = _BOOTSTRAP_TRACE.search(text)
        if not m or int(m.group("code")) not in BOOTSTRAP_SOCKET_ERRORS:
            return []
        head = _HEADER.search(text)
        host, dev = (head.group("host"), int(head.group("dev"))) if head else ("", None)
        # One per host and device (a rank's process), whatever thread printed the frame.
        process = f"{host}/{dev}" if head else f"rank {pre.rank}"
        if process in self._bootstrap or len(self._bootstrap) > 10_000:
            return []  # the trace's next frames, and the same process's other threads
        self._bootstrap.add(process)
        return [
            NcclBootstrapFailed(
                line=line.number,
                text=line.text,
                rank=pre.rank,
                host=host,
                local_rank=dev,
                code=int(m.group("code")),
            )
        ]

    def _reprinted_connect(self, line: Line, pre: Prefix, text: str) -> list[Event]:
        """``Last error:`` followed by NCCL's own WARN text (PyTorch 1.13+), e.g.
        ``socketStartConnect: Connect to 127.0.0.1<45069> failed : Connection refused``; and
        gloo's ``Gloo connectFullMesh failed with [.../pair.cc:144] …`` (ProcessGroupGloo could
        not connect its ranks to each other when the group was created: the hosts do not reach
        each other on the interface gloo chose, GLOO_SOCKET_IFNAME)."""
        if "connectFullMesh failed" in text:
            return [
                NcclConnectFailed(
                    line=line.number,
                    text=line.text,
                    rank=pre.rank,
                    reason="Gloo connectFullMesh failed",
                )
            ]
        if "Connect to" not in text or "failed" not in text:
            return []
        m = _CONNECT.search(text)
        if not m:
            return []
        address = m.group("addr")
        return [
            NcclConnectFailed(
                line=line.number,
                text=line.text,
                rank=pre.rank,
                address=address[:200],
                reason=m.group("reason")[:200],
                link_local=address.lower().startswith("fe80:"),
            )
        ]

    def flush(self) -> list[Event]:
        return []

    def skip_raw(self, raw: bytes) -> bool:
        """INFO lines that tell nothing new: all but the first channel line of each transport
        per printing process, and the INFO shapes no parser reads (tuning, topology, timings)."""
        cut = raw.find(b"NCCL INFO")
        if cut < 0:
            return self._repeated_warning(raw)
        if raw.find(b" via ", cut) >= 0:
            path = raw[raw.rfind(b" via ") + 5 :].split(b"/", 2)
            # One line per transport per host (or rank prefix) says all a diagnosis needs; the
            # pid:tid part differs per communicator and thread and would let thousands through.
            key = (
                raw[:cut].split(b":", 1)[0],
                b"/".join(path[:2]) if path[0] == b"NET" else path[0],
            )
            if key in self._raw_channels:
                return True
            if len(self._raw_channels) < 10_000:
                self._raw_channels.add(key)
            return False
        # The message is what follows the tag (see TRIGGER_SHAPES).
        for word in _INFO_WANTED:
            if raw.find(word, cut) >= 0:
                return word in _INFO_SETTINGS and self._repeated_setting(raw, cut)
        return True

    def _repeated_setting(self, raw: bytes, cut: int) -> bool:
        """A settings line ("Using network IB", "NCCL_IB_HCA set by environment to …") that this
        process's device already printed word for word: every communicator a job creates prints
        them again, and the first says it all."""
        head = raw[:cut]
        key = (head.split(b":", 1)[0], head.rsplit(b"[", 1)[-1], raw[cut + 9 :].strip())
        return self._fold(self._raw_settings, key)

    def _repeated_warning(self, raw: bytes) -> bool:
        """A WARN line whose message this host (or rank prefix) already printed word for word: an
        IB port flapping makes NCCL's async thread print the same event thousands of times. The
        first of each is parsed; the repeats add no fact a rule reads (rules ask whether and where
        an error was seen, never how often), so they are counted, not parsed."""
        cut = raw.find(b"NCCL WARN")
        if cut < 0:
            return False
        return self._fold(self._raw_warnings, (raw[:cut].split(b":", 1)[0], raw[cut + 9 :].strip()))

    def _fold(self, seen: set, key: tuple) -> bool:
        """True (and counted) when ``key`` was seen; remembered otherwise, up to a bound."""
        if key in seen:
            self.folded += 1
            return True
        if len(seen) < 10_000:
            seen.add(key)
        return False

    # -- NCCL's own lines -------------------------------------------------------------------

    def _where(self, text: str) -> tuple[str, int | None]:
        m = _HEADER.search(text)
        if not m:
            return "", None
        return m.group("host"), int(m.group("dev"))

    def _debug_line(self, line: Line, pre: Prefix, text: str) -> list[Event]:
        cut = text.find("NCCL INFO")
        warn = cut < 0
        if warn:
            cut = text.find("NCCL WARN")
        msg = text[cut + 10 :]
        where = text[:cut]
        ctx = {"line": line.number, "text": line.text, "rank": pre.rank}

        # Ordered by how often each shape occurs in a real INFO dump.
        if " via " in msg and "Channel" in msg:
            m = _CHANNEL.search(msg)
            if not m:
                return []
            path = m.group("path")
            parts = path.split("/")
            transport = "/".join(parts[:2]) if parts[0] == "NET" else parts[0]
            host, dev = self._where(where)
            key = (host, str(dev), transport)
            if key in self._channels or len(self._channels) > 10_000:
                return []
            self._channels.add(key)
            return [
                NcclChannel(
                    **ctx,
                    host=host,
                    local_rank=dev,
                    transport=transport,
                    path=path,
                    gdr="GDRDMA" in path,
                )
            ]
        if "Init COMPLETE" in msg:
            m = _INIT.search(msg)
            if not m:
                return []
            host, dev = self._where(where)
            key = (host, str(dev), m.group("comm"), m.group("rank"))
            if key in self._inits or len(self._inits) > 100_000:
                return []  # the same communicator reported twice (log collected twice)
            self._inits.add(key)
            return [
                NcclInit(
                    **ctx,
                    host=host,
                    local_rank=dev,
                    comm=m.group("comm"),
                    comm_id=m.group("cid") or "",
                    comm_rank=int(m.group("rank")),
                    nranks=int(m.group("nranks")),
                    cuda_dev=int(m.group("dev")),
                    bus_id=m.group("bus") or "",
                )
            ]
        if "set by environment" in msg:
            return self._env(ctx, where, msg)
        if "Using" in msg:
            m = _NETWORK.search(msg)
            if m:
                host, dev = self._where(where)
                return [NcclNetwork(**ctx, host=host, local_rank=dev, network=m.group("net"))]
            m = _USING.search(msg)
            if m:
                what = m.group("what")
                devices = tuple(d.group("dev") for d in _DEVICE.finditer(m.group("devs")))
                if ";" in m.group("devs"):  # "; OOB eth0:…" is the bootstrap side of IB
                    devices = tuple(
                        d.group("dev") for d in _DEVICE.finditer(m.group("devs").split(";")[0])
                    )
                devices = tuple(d for d in devices if d and d != "RO")[
                    :16
                ]  # "[RO]": relaxed ordering
                host, dev = self._where(where)
                return [
                    NcclNetDevices(
                        **ctx,
                        host=host,
                        local_rank=dev,
                        transport=what.removeprefix("NET/"),
                        devices=devices,
                        link_local=bool(devices) and "fe80:" in devices[0].lower(),
                    )
                ]
        if "No device found" in msg and "NET/IB" in msg:  # 2.4+
            host, dev = self._where(where)
            return [NcclIbUnavailable(**ctx, host=host, local_rank=dev, reason="no_device")]
        if "libibverbs" in msg and ("Failed to open" in msg or "Unable to open" in msg):
            host, dev = self._where(where)
            return [NcclIbUnavailable(**ctx, host=host, local_rank=dev, reason="no_libibverbs")]
        if "Connection closed by localRank" in msg:
            m = _PEER_CLOSED.search(msg)
            host, dev = self._where(where)
            return [
                NcclPeerClosed(
                    **ctx, host=host, local_rank=dev, peer_local_rank=_int(m and m.group("peer"))
                )
            ]
        if "NCCL version" in msg:
            return self._version(ctx, msg)
        if "Got completion" in msg:
            return self._ib_completion(ctx, where, msg)
        if "Call to ibv_" in msg:
            m = _IB_CALL.search(msg)
            if m:
                host, dev = self._where(where)
                return [
                    NcclIbCallFailed(
                        **ctx,
                        host=host,
                        local_rank=dev,
                        call=m.group("call"),
                        detail=m.group("detail")[:200],
                    )
                ]
        if "Connect to" in msg and "failed" in msg:
            m = _CONNECT.search(msg)
            if m:
                host, dev = self._where(where)
                address = m.group("addr")
                return [
                    NcclConnectFailed(
                        **ctx,
                        host=host,
                        local_rank=dev,
                        address=address,
                        reason=m.group("reason")[:200],
                        link_local=address.lower().startswith("fe80:"),
                    )
                ]
        if warn:
            return self._warn(ctx, where, msg)
        return []

    def _warn(self, ctx: dict, where: str, msg: str) -> list[Event]:
        error = detail = ""
        code = None
        m = _CUDA_FAILURE.search(msg)
        if m:
            error, code, detail = "cuda", 1, m.group("what")
        elif _REMOTE_CLOSED.search(msg):
            error, code, detail = "remote", 6, msg.strip()
        else:
            for text, (result, name) in _RESULT_BY_TEXT.items():
                if text in msg:
                    error, code, detail = name, result, msg.strip()
                    break
        if not error:
            return []
        host, dev = self._where(where)
        out: list[Event] = [
            NcclError(**ctx, host=host, local_rank=dev, error=error, code=code, detail=detail[:300])
        ]
        if error == "cuda" and detail == "out of memory":
            # CUDACHECK (src/include/checks.h) prints cudaGetErrorString(cudaErrorMemoryAllocation)
            # and returns ncclUnhandledCudaError: NCCL could not allocate its buffers, the GPU
            # was full. That is the rank running out of memory, not a recovered warning.
            out.append(CudaOom(**ctx, gpu=dev, via="nccl"))
        return out

    def _env(self, ctx: dict, where: str, msg: str) -> list[Event]:
        m = _ENV.search(msg)
        if not m:
            return []
        key, value = m.group("key"), m.group("value")
        host, dev = self._where(where)
        out: list[Event] = []
        seen = (key, value, host)
        if seen not in self._settings:
            self._settings.add(seen)
            out.append(
                ConfigValue(**ctx, key=key.lower(), value=value, raw_key=key, number=_number(value))
            )
        if key == "NCCL_IB_DISABLE" and value.strip() not in ("", "0"):
            out.append(
                NcclIbUnavailable(**ctx, host=host, local_rank=dev, reason="disabled_by_env")
            )
        return out

    def _version(self, ctx: dict, msg: str) -> list[Event]:
        m = _VERSION.search(msg)
        if not m:
            return []
        seen = ("nccl_version", m.group("ver"), "")
        if seen in self._settings:
            return []
        self._settings.add(seen)
        return [
            ConfigValue(**ctx, key="nccl_version", value=m.group("ver"), raw_key="NCCL version")
        ]

    def _ib_completion(self, ctx: dict, where: str, msg: str) -> list[Event]:
        m = _IB_COMPLETION.search(msg)
        if not m:
            return []
        status = int(m.group("status"))
        name, meaning, follow_on = IBV_WC_STATUS.get(status, ("", "unknown ibv_wc_status", False))
        host, dev = self._where(where)
        return [
            NcclIbError(
                **ctx,
                host=host,
                local_rank=dev,
                status=status,
                status_name=m.group("sname") or name,
                meaning=meaning,
                follow_on=follow_on,
                peer=m.group("peer") or "",
                opcode=_int(m.group("opcode")),
                vendor_err=_int(m.group("vendor")),
            )
        ]

    # -- lines that mention NCCL but are not NCCL's own debug output -------------------------

    def _other_line(self, line: Line, pre: Prefix, text: str) -> list[Event]:
        ctx = {"line": line.number, "text": line.text, "rank": pre.rank}
        if "rror" in text:
            m = _PT_ERROR.search(text)
            if m:
                what = m.group("what").strip()
                code = _int(m.group("code"))
                result = _RESULT_BY_TEXT.get(what)
                if result is None and code in NCCL_RESULTS:
                    result = (code, NCCL_RESULTS[code][0])
                if result is not None:
                    self._last_error = (line.number, result[1])
                    return [NcclError(**ctx, error=result[1], code=result[0], detail=what)]
        if "communicator was aborted" in text:
            m = _ABORTED.search(text)
            return [
                NcclError(
                    **ctx,
                    error="aborted",
                    detail=text[m.end() : m.end() + 300].strip(" .:") if m else "",
                )
            ]
        if "set by environment" in text:
            return self._env(ctx, "", text)
        if "NCCL version" in text:
            return self._version(ctx, text)
        if "nccl" in text:
            return self._result_name(line, pre, text)
        return []

    def _result_name(self, line: Line, pre: Prefix, text: str) -> list[Event]:
        if "Error" not in text and "InProgress" not in text:
            return []
        m = _RESULT_NAME.search(text)
        if not m:
            return []
        code, error = _RESULT_BY_TEXT[m.group("name")]
        last = self._last_error
        if last is not None and last[1] == error and line.number - last[0] <= 2:
            return []  # the second line of an exception already reported
        self._last_error = (line.number, error)
        return [
            NcclError(
                line=line.number,
                text=line.text,
                rank=pre.rank,
                error=error,
                code=code,
                detail=m.group("detail")[:300],
            )
        ]


def _number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None
