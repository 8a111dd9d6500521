"""``fleetwatch probe`` on a real 3-rank gloo group with one slow rank."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agents.probe import analyse

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


WORKER = """
import datetime, json, sys
import torch.distributed as dist
from agents.probe import measure
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3,
                        timeout=datetime.timedelta(seconds=30))
result = measure(small=1024, large=1 << 16, repeat=3, max_pairs=64,
                 delay_s=0.02 if rank == 2 else 0.0)
if result is not None:
    print(json.dumps(result))
dist.destroy_process_group()
"""


def test_the_probe_names_the_slow_rank_of_a_real_gloo_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(r), str(port)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)},
        )
        for r in range(3)
    ]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    result = json.loads(outputs[0])
    assert result["slow_ranks"] == [2], result
    assert set(result["pair_gbs"]) == {"0-1", "0-2", "1-2"}
    assert "slow rank 2" in result["verdict"]


def test_one_slow_pair_is_a_slow_link_not_a_slow_rank():
    per_rank = [
        {"rank": 0, "host": "a", "pairs": {"0-1": 0.001, "0-2": 0.001, "0-3": 0.001}},
        {"rank": 1, "host": "a", "pairs": {"1-2": 0.001, "1-3": 0.01}},
        {"rank": 2, "host": "b", "pairs": {"2-3": 0.001}},
        {"rank": 3, "host": "b", "pairs": {}},
    ]
    result = analyse(per_rank, 1 << 20)
    assert result["slow_ranks"] == [] and result["slow_links"] == ["1-3"]
