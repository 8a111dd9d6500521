"""NCCL INFO/WARN lines and the NCCL errors PyTorch raises, as the real software prints them."""

import pytest

from ingest.parsers import parse_log
from ingest.parsers.nccl import IBV_WC_STATUS


def events(text: str, kind: str):
    return parse_log(text.encode()).of_kind(kind)


CASES = [
    # (what, line, kind, expected attributes)
    (
        "network IB",
        "gpu-a:2340:3744 [2] NCCL INFO Using network IB",
        "nccl_network",
        {"host": "gpu-a", "local_rank": 2, "network": "IB"},
    ),
    (
        "network from a plugin, with a collector timestamp",
        "[2026-04-28 14:14:42] pod-vf07:15718:15726 [0] NCCL INFO Using network IBext_v8",
        "nccl_network",
        {"host": "pod-vf07", "network": "IBext_v8"},
    ),
    (
        "network Socket",
        "node-1:97:221 [0] NCCL INFO Using network Socket",
        "nccl_network",
        {"network": "Socket"},
    ),
    (
        "IB devices with the OOB interface",
        "node-2:5776:5898 [0] NCCL INFO NET/IB : Using [0]ibP111p0s0:1/IB [1]rdmaP1111p0s2:1/RoCE"
        " [RO]; OOB eth0:10.2.0.4<0>",
        "nccl_net_devices",
        {"transport": "IB", "devices": ("ibP111p0s0:1/IB", "rdmaP1111p0s2:1/RoCE")},
    ),
    (
        "socket transport on a link-local tunnel",
        "NvYt-dcf4:97:221 [0] NCCL INFO NET/Socket : Using [0]ip6tnl0:fe80::e866:19ff:fe1e:a688"
        "%ip6tnl0<0> [1]veth0:2a02:6b8:fc1d:3606:0:4457:edef:600a<0>",
        "nccl_net_devices",
        {"transport": "Socket", "link_local": True},
    ),
    (
        "bootstrap interface, NCCL 2.4-2.18",
        "job-0:305:305 [0] NCCL INFO Bootstrap : Using eth0:10.241.101.227<0>",
        "nccl_net_devices",
        {"transport": "Bootstrap", "devices": ("eth0:10.241.101.227",), "link_local": False},
    ),
    (
        "no IB device",
        "node-1:1234:1234 [0] NCCL INFO NET/IB : No device found.",
        "nccl_ib_unavailable",
        {"reason": "no_device"},
    ),
    (
        "no libibverbs",
        "job-0:306:324 [1] NCCL INFO Failed to open libibverbs.so[.1]",
        "nccl_ib_unavailable",
        {"reason": "no_libibverbs", "local_rank": 1},
    ),
    (
        "IB disabled by the environment",
        "NvYt-dcf4:97:221 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.",
        "nccl_ib_unavailable",
        {"reason": "disabled_by_env"},
    ),
    (
        "channel over NVLink/PCIe P2P",
        "gpu-a:1234:5678 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P/IPC/read",
        "nccl_channel",
        {"transport": "P2P", "path": "P2P/IPC/read", "gdr": False},
    ),
    (
        "channel over P2P/CUMEM, NCCL 2.19+",
        "gpu-a:1234:5678 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM",
        "nccl_channel",
        {"transport": "P2P", "path": "P2P/CUMEM"},
    ),
    (
        "channel over IB with GPUDirect RDMA",
        "gpu-a:1234:5678 [0] NCCL INFO Channel 00/1 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
        "nccl_channel",
        {"transport": "NET/IB", "gdr": True},
    ),
    (
        "channel over sockets",
        "gpu-a:1234:5678 [0] NCCL INFO Channel 00/0 : 4[0] -> 0[0] [receive] via NET/Socket/0",
        "nccl_channel",
        {"transport": "NET/Socket"},
    ),
    (
        "channel through shared memory, NCCL <= 2.11",
        "gpu-a:1234:5678 [0] NCCL INFO Channel 00 : 0[1b000] -> 1[1c000] via SHM/direct/direct",
        "nccl_channel",
        {"transport": "SHM"},
    ),
    (
        "Init COMPLETE, NCCL 2.7-2.18",
        "funasr-m-0:14054:14825 [3] NCCL INFO comm 0x9bc5a80 rank 11 nranks 16 cudaDev 3 busId "
        "4e000 - Init COMPLETE",
        "nccl_init",
        {"comm_rank": 11, "nranks": 16, "cuda_dev": 3, "bus_id": "4e000", "comm_id": ""},
    ),
    (
        "Init COMPLETE, NCCL 2.19+",
        "tpgds-aihub0007:222224:222224 [3] NCCL INFO ncclCommInitRank comm 0x560d47aa6b30 rank 3 "
        "nranks 16 cudaDev 3 nvmlDev 3 busId 5d000 commId 0xde4443395863ef4a - Init COMPLETE",
        "nccl_init",
        {"comm_rank": 3, "bus_id": "5d000", "comm_id": "0xde4443395863ef4a"},
    ),
    (
        "Init COMPLETE, NCCL 2.4-2.6 without busId",
        "gpu-a:1234:1300 [0] NCCL INFO comm 0x7f1f2c001b40 rank 0 nranks 4 cudaDev 0 nvmlDev 0 - "
        "Init COMPLETE",
        "nccl_init",
        {"comm_rank": 0, "nranks": 4, "bus_id": ""},
    ),
    (
        "IB completion error, NCCL 2.12-2.18",
        "node-2:5776:5902 [0] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from "
        "peer 10.2.0.5<33092> with error 12, opcode 0, len 0, vendor err 129 (Recv)",
        "nccl_ib_error",
        {
            "status": 12,
            "status_name": "IBV_WC_RETRY_EXC_ERR",
            "peer": "10.2.0.5<33092>",
            "vendor_err": 129,
            "follow_on": False,
        },
    ),
    (
        "IB completion error, NCCL <= 2.11",
        "node-2:5776:5902 [0] NCCL WARN NET/IB : Got completion with error 12, opcode 1, len "
        "32768, vendor err 129",
        "nccl_ib_error",
        {"status": 12, "opcode": 1, "peer": ""},
    ),
    (
        "IB completion error, NCCL 2.19-2.22",
        "[2026-03-03 12:11:38] tpgds-aihub0007:185303:186751 [1] transport/net_ib.cc:2453 NCCL "
        "WARN NET/IB: Got completion from peer 10.99.91.63<51161> with status=4 opcode=32614 "
        "len=32614 vendor err 81 (Send) localGid ::ffff:10.99.92.59 hca mlx5_1",
        "nccl_ib_error",
        {"status": 4, "status_name": "IBV_WC_LOC_PROT_ERR", "vendor_err": 81},
    ),
    (
        "IB completion error, NCCL 2.23+ with status names",
        "ubuntu2:319733:319761 [1] transport/net_ib/p2p.cc:648 NCCL WARN NET/IB: Got completion "
        "from peer 10.153.235.13<40554> with status=IBV_WC_RETRY_EXC_ERR(12) "
        "opcode=IBV_WC_RECV_RDMA_WITH_IMM(129) vendor_err=129 hca mlx5_1",
        "nccl_ib_error",
        {"status": 12, "opcode": 129, "vendor_err": 129},
    ),
    (
        "flush errors are follow-ons",
        "node-2:5776:5902 [0] NCCL WARN NET/IB : Got completion from peer 10.2.0.5<33092> with "
        "error 5, opcode 0, len 0, vendor err 249 (Recv)",
        "nccl_ib_error",
        {"status": 5, "follow_on": True},
    ),
    (
        "a verbs call failed",
        "node-1:1:1 [0] NCCL WARN Call to ibv_modify_qp failed with error Connection timed out",
        "nccl_ib_call_failed",
        {"call": "ibv_modify_qp"},
    ),
    (
        "connect timed out to a link-local address",
        "NCCL WARN Connect to fe80::745d:60ff:fef9:e1dd%ip6tnl0<46681> failed : Connection timed "
        "out",
        "nccl_connect_failed",
        {"reason": "Connection timed out", "link_local": True},
    ),
    (
        "connect refused, NCCL 2.19+",
        "gpu-b:77:90 [4] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
        "10.0.0.2<43019> failed : Connection refused",
        "nccl_connect_failed",
        {"address": "10.0.0.2<43019>", "reason": "Connection refused", "link_local": False},
    ),
    (
        "a local process went away",
        "funasr-w-0:15325:16199 [2] NCCL INFO [Service thread] Connection closed by localRank 2",
        "nccl_peer_closed",
        {"peer_local_rank": 2, "local_rank": 2, "host": "funasr-w-0"},
    ),
    (
        "PyTorch NCCL error, 1.x-2.x",
        "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, "
        "unhandled system error, NCCL version 2.14.3",
        "nccl_error",
        {"error": "system", "code": 2},
    ),
    (
        "PyTorch remote error, 2.2+",
        "[rank3]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/"
        "c10d/NCCLUtils.hpp:275, remote process exited or there was a network error, NCCL "
        "version 2.20.5",
        "nccl_error",
        {"error": "remote", "code": 6, "rank": 3},
    ),
    (
        "PyTorch cuda error",
        "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, "
        "unhandled cuda error, NCCL version 2.7.8",
        "nccl_error",
        {"error": "cuda", "code": 1},
    ),
    (
        "old c10d numbered error",
        "RuntimeError: NCCL Error 2: unhandled system error",
        "nccl_error",
        {"error": "system", "code": 2},
    ),
    (
        "result name line on its own",
        "ncclInternalError: Internal check failed.",
        "nccl_error",
        {"error": "internal", "code": 3},
    ),
    (
        "aborted communicator",
        "[rank1]: torch.distributed.DistBackendError: NCCL communicator was aborted on rank 1. "
        "Original reason for failure was: [Rank 1] Watchdog caught collective operation timeout",
        "nccl_error",
        {"error": "aborted"},
    ),
    (
        "WARN cuda failure",
        "gpu-a:1:2 [0] enqueue.cc:1100 NCCL WARN Cuda failure 'an illegal memory access was "
        "encountered'",
        "nccl_error",
        {"error": "cuda", "detail": "an illegal memory access was encountered"},
    ),
    (
        "WARN cuda failure out of memory is the rank running out of memory",
        "gpu-a:1:2 [3] alloc.h:58 NCCL WARN Cuda failure 'out of memory'",
        "cuda_oom",
        {"gpu": 3, "via": "nccl"},
    ),
    (
        "WARN cuda failure with the error's number (newer NCCL)",
        "gpu-a:1:2 [5] transport/nvls.cc:208 NCCL WARN Cuda failure 2 'out of memory'",
        "cuda_oom",
        {"gpu": 5, "via": "nccl"},
    ),
    (
        "NCCL version on an INFO line",
        "gpu-a:1234:1234 [0] NCCL INFO NCCL version 2.18.5+cuda12.1",
        "config_value",
        {"key": "nccl_version", "value": "2.18.5"},
    ),
    (
        "NCCL version printed bare by old NCCL",
        "NCCL version 2.5.6+cuda10.0",
        "config_value",
        {"key": "nccl_version", "value": "2.5.6"},
    ),
    (
        "any NCCL_* variable NCCL reports",
        "bigo:1884:2298 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to LOC",
        "config_value",
        {"key": "nccl_p2p_level", "value": "LOC", "raw_key": "NCCL_P2P_LEVEL"},
    ),
]


@pytest.mark.parametrize(("what", "line", "kind", "expected"), CASES, ids=[c[0] for c in CASES])
def test_nccl_lines_become_typed_events(what, line, kind, expected):
    found = events(line, kind)
    assert len(found) == 1, found
    for name, value in expected.items():
        assert getattr(found[0], name) == value, name


def test_an_exception_and_its_result_name_line_are_one_error():
    log = (
        "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, "
        "unhandled system error, NCCL version 2.14.3\n"
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
        "device error.\n"
    )
    assert len(events(log, "nccl_error")) == 1


def test_channel_lines_are_reported_once_per_transport_and_process():
    log = (
        "".join(
            f"gpu-a:1234:5678 [0] NCCL INFO Channel {c:02d}/0 : 0[0] -> 1[1] via P2P/IPC\n"
            for c in range(32)
        )
        + "gpu-a:1234:5678 [0] NCCL INFO Channel 00/1 : 0[0] -> 8[0] [send] via NET/Socket/0\n"
    )
    assert [e.transport for e in events(log, "nccl_channel")] == ["P2P", "NET/Socket"]


def test_a_warning_repeated_word_for_word_on_one_host_is_read_once_and_counted():
    # A RoCE link flapping: NCCL's async thread warns on every event, thousands of times.
    flap = "gpu-a:1234:{tid} [{dev}] NCCL WARN NET/IB : mlx5_1:1 Got async event : {what}\n"
    change = "GID table change"
    log = "".join(flap.format(tid=5000 + i, dev=i % 8, what=change) for i in range(500))
    log += flap.format(tid=1, dev=0, what=change).replace("gpu-a", "gpu-b")
    log += flap.format(tid=2, dev=0, what=change).replace("mlx5_1", "mlx5_3")
    parsed = parse_log(log.encode())
    seen = [(e.text.split(":", 1)[0], e.text.split(" : ")[1][:6]) for e in parsed.events]
    assert seen == [("gpu-a", "mlx5_1"), ("gpu-b", "mlx5_1"), ("gpu-a", "mlx5_3")]
    assert {e.kind for e in parsed.events} == {"known_signature"}
    assert parsed.folded_lines == 499
    assert "499 exact repeats" in parsed.issues[0].message
    assert parsed.lines == 502


def test_a_setting_printed_by_every_communicator_is_read_once_per_process_device():
    using = "gpu-a:1234:{tid} [{dev}] NCCL INFO Using network {net}\n"
    log = "".join(using.format(tid=i, dev=i % 2, net="IB") for i in range(40))
    log += using.format(tid=99, dev=0, net="Socket")  # a later communicator fell back
    found = [(e.local_rank, e.network) for e in events(log, "nccl_network")]
    assert found == [(0, "IB"), (1, "IB"), (0, "Socket")]


def test_errors_and_inits_are_never_folded_as_settings():
    init = (
        "gpu-a:1234:5678 [0] NCCL INFO comm 0x5612 rank {r} nranks 2 cudaDev 0 busId 1000 - "
        "Init COMPLETE\n"
    )
    log = init.format(r=0) + init.format(r=0).replace("0x5612", "0x7734")
    assert len(events(log, "nccl_init")) == 2


def test_an_info_line_that_is_a_known_issue_signature_is_not_skipped():
    # NCCL 2.25.1 says it in INFO (2.26 makes it an error): the Blackwell entry of the
    # knowledge base.
    line = (
        "GENOA-06:4766:4780 [0] NCCL INFO ncclMaxSharedMem 82240 exceeds device/fn maxSharedMem "
        "79856"
    )
    (hit,) = events(line, "known_signature")
    assert hit.signature == "nccl_2_25_blackwell_shared_memory"


def test_uninteresting_info_lines_produce_nothing():
    log = (
        "gpu-a:1234:5678 [0] NCCL INFO Connected all rings\n"
        "gpu-a:1234:5678 [0] NCCL INFO threadThresholds 8/8/64 | 128/8/64 | 512 | 512\n"
        "gpu-a:1234:5678 [0] NCCL INFO NET/Plugin : No plugin found, using internal "
        "implementation\n"
    )
    assert parse_log(log.encode()).events == ()


@pytest.mark.parametrize("status", [4, 5, 10, 12, 13])
def test_the_common_ibv_wc_statuses_have_a_meaning(status):
    name, meaning, _ = IBV_WC_STATUS[status]
    assert name.startswith("IBV_WC_") and meaning


def test_only_the_flush_status_is_a_follow_on():
    assert [s for s, (_, _, follow_on) in IBV_WC_STATUS.items() if follow_on] == [5]


def test_a_system_error_in_the_bootstrap_is_one_event_per_process_in_every_era():
    trace = (
        # NCCL 2.3 (no "NCCL" in the line), then 2.18 with its socket frames before it
        "seyun:17281:17552 [1] INFO bootstrap.cu:45 -> 2 [Net]\n"
        "seyun:17281:17552 [1] INFO bootstrap.cu:259 -> 2\n"
        "node-03:2330:2658 [2] NCCL INFO misc/socket.cc:567 -> 2\n"
        "node-03:2330:2658 [2] NCCL INFO bootstrap.cc:270 -> 2\n"
        "node-03:2330:2658 [2] NCCL INFO bootstrap.cc:554 -> 2\n"
    )
    found = events(trace, "nccl_bootstrap_failed")
    assert [(e.host, e.local_rank, e.code) for e in found] == [("seyun", 1, 2), ("node-03", 2, 2)]


def test_other_bootstrap_results_are_not_socket_failures():
    # ncclInternalError (3), as "Message truncated" returns it: not a failed system call.
    line = "compute-2:4827:6900 [4] NCCL INFO bootstrap.cc:554 -> 3\n"
    assert events(line, "nccl_bootstrap_failed") == []
