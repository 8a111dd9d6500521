"""The known-issues knowledge base (ingest/parsers/known_issues.json): every entry sourced and
well formed, every signature matching the line it was written from, and a version outside an
entry's affected range never blamed on it."""

import json
import re

import pytest

from analysis.classify import classify
from analysis.classify.model import CULPRITS
from ingest.parsers import parse_log
from ingest.parsers.signatures import known_issues


def verdict_of(text: str):
    return classify(parse_log(text.encode(), source="excerpt.log").events)


def _version(text):
    return tuple(int(p) for p in re.findall(r"\d+", text or "")[:3]) or None


@pytest.mark.parametrize("entry", list(known_issues().values()), ids=lambda e: e["id"])
def test_every_entry_is_sourced_and_well_formed(entry):
    assert entry["culprit"] in CULPRITS and entry["culprit"] != "unknown"
    assert entry["source_url"].startswith("https://")
    assert entry["fix"].strip() and entry["title"].strip() and entry["source_quote"].strip()
    low, high = _version(entry["affected"]["min"]), _version(entry["affected"]["max_excluded"])
    assert low is None or high is None or low < high
    if entry.get("fixed_in"):
        assert _version(entry["fixed_in"]) == high
    signature = entry.get("signature")
    if signature:
        assert signature["trigger"].strip()
        if signature.get("regex"):
            re.compile(signature["regex"])


def test_the_base_holds_at_least_thirty_entries_with_unique_ids():
    from ingest.parsers.signatures import KNOWLEDGE_FILE

    ids = [e["id"] for e in json.loads(KNOWLEDGE_FILE.read_text())["entries"]]
    assert len(ids) >= 30 and len(ids) == len(set(ids))


@pytest.mark.parametrize(
    "line",
    [
        # cudaGetErrorString(cudaErrorInsufficientDriver), as torch and NCCL surface it
        "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version",
        # torch/cuda/__init__.py _check_driver / _lazy_init
        "RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please "
        "update your GPU driver by downloading and installing a new version",
        # NCCL src/misc/strongstream.cc
        "host:1394:1394 [0] misc/strongstream.cc:53 NCCL WARN NCCL cannot be captured in a graph "
        "if either it wasn't built with CUDA runtime >= 11.3 or if the installed CUDA driver < "
        "R465.",
        # cudaGetErrorString(cudaErrorNoKernelImageForDevice)
        "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        # NCCL's kernels looked up at communicator init (enqueue.cc) without an image for the GPU
        "gcn75:2336636:2336906 [0] enqueue.cc:58 NCCL WARN Cuda failure 'named symbol not found'",
        # torch/cuda/__init__.py _check_capability
        "NVIDIA H100 80GB HBM3 with CUDA capability sm_90 is not compatible with the current "
        "PyTorch installation.",
    ],
)
def test_a_library_that_states_its_version_requirement_names_the_software_stack(line):
    verdict = verdict_of(line + "\n")
    assert verdict.culprit == "software_version"
    assert "build_mismatch" in verdict.rule_ids


def test_a_build_mismatch_outranks_the_crash_it_caused_and_a_plain_crash_does_not_get_it():
    crash = (
        "[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
        "[rank0]: ncclUnhandledCudaError: Call to CUDA function failed.\n"
        "[rank0]: Last error:\n"
        "[rank0]: Cuda failure '{what}'\n"
        "E0611 10:02:23.881000 2801300 torch/distributed/elastic/multiprocessing/api.py:869] "
        "failed (exitcode: 1) local_rank: 0 (pid: 2801411) of binary: /usr/bin/python3\n"
    )
    warn = "gpu-1:2801411:2801411 [0] enqueue.cc:58 NCCL WARN Cuda failure '{what}'\n"
    what = "named symbol not found"
    built = verdict_of(warn.format(what=what) + crash.format(what=what))
    assert built.culprit == "software_version", built.summary
    other = "an illegal memory access was encountered"
    plain = verdict_of(warn.format(what=other) + crash.format(what=other))
    assert plain.culprit != "software_version", plain.summary


def test_gloo_that_cannot_find_its_interface_names_the_network_setting():
    verdict = verdict_of(
        "RuntimeError: [enforce fail at ../gloo/transport/tcp/device.cc:84] ifa != nullptr. "
        "Unable to find address for: ^lo\n"
    )
    assert verdict.culprit == "network_transport"
    assert "known_network_issue" in verdict.rule_ids


def test_a_printed_version_outside_the_affected_range_clears_the_entry():
    # nccl_comm_abort_multithread_stuck: fixed in 2.19.1, signed by its own stack frame.
    entry = known_issues()["nccl_comm_abort_multithread_stuck"]
    line = entry["signature"]["trigger"]
    inside = verdict_of(f"NCCL version 2.18.5+cuda12.1\n{line}\n")
    fixed = verdict_of(f"NCCL version 2.21.5+cuda12.4\n{line}\n")
    assert "known_library_bug" in inside.rule_ids
    assert "known_library_bug" not in fixed.rule_ids


def test_cuda_refusing_work_until_the_system_is_ready_names_the_host():
    # cudaGetErrorString(cudaErrorSystemNotReady), as nccl-tests prints it on an NVSwitch host
    # whose fabric manager is stopped.
    verdict = verdict_of(
        "# Using devices\n"
        "test: Test CUDA failure common.cu:941 'system not yet initialized'\n"
        " .. test pid 54340: Test failure common.cu:891\n"
    )
    assert verdict.culprit == "bad_node_hardware"
    assert "known_host_issue" in verdict.rule_ids
