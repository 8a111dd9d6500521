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
    ],
)
def test_a_library_that_states_its_version_requirement_names_the_software_stack(line):
    verdict = verdict_of(line + "\n")
    assert verdict.culprit == "software_version"
    assert "known_library_bug" in verdict.rule_ids


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
