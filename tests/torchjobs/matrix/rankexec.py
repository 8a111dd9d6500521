"""Harness shim between torchrun and train.py: one per rank, records the rank's exit code.

    torchrun ... -m tests.torchjobs.matrix.rankexec HOST_DIR CODES_DIR -- train.py [args]

torchrun knows the exit codes of the ranks it watches but prints only the failed ones, and only
when it gets to; this shim runs the training script as its child with stdout+stderr in
``HOST_DIR/rank<RANK>.log`` (RANK is the global rank), writes the child's exit code to
``CODES_DIR/rank<RANK>.json`` and then ends the same way (same code, or same signal), so torchrun
sees exactly what it would have seen. torchrun signals the whole process group (this shim, the
trainer and its loader workers): the shim outlives the signal long enough to record the code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    host_dir, codes_dir = Path(argv[0]), Path(argv[1])
    command = argv[3:] if argv[2:3] == ["--"] else argv[2:]
    rank = os.environ.get("RANK", "x")
    seen: list[int] = []

    def note(signum, _frame) -> None:  # a handler, not SIG_IGN: the child gets the default
        seen.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, note)
    # MATRIX_LOG_NAME (run.py --shared-root): logs named by job in a directory jobs share.
    name = os.environ.get("MATRIX_LOG_NAME", "rank{rank}.log").format(rank=rank)
    with (host_dir / name).open("ab") as log:
        child = subprocess.Popen([sys.executable, *command], stdout=log, stderr=subprocess.STDOUT)
        code = child.wait()
    codes_dir.mkdir(parents=True, exist_ok=True)
    (codes_dir / f"rank{rank}.json").write_text(
        json.dumps({"rank": int(rank), "exit_code": code, "pid": child.pid})
    )
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be caught anyway
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
