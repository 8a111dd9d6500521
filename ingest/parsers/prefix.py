"""Strip the prefixes that launchers and log collectors put before a line.

A line as it reaches us may carry several, outermost first, for example
``2024-03-21T02:07:08Z (WorkerDict pid=349) [rank3]:[E321 02:07:08.4 ProcessGroupNCCL.cpp:607] …``.
The rank they name is the *global* rank (``[rankN]:``, ``srun --label``) or the local rank inside
a torchrun agent (``[defaultN]:``); we keep them apart because only the first identifies a rank
across hosts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PREFIXES = re.compile(
    r"""
    \s*(?:
        # kubectl logs --timestamps / journald export: an ISO timestamp
        (?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s
      | # Ray actors: "(WorkerDict pid=3490362) "
        \((?P<ray>[\w.]+)\s+pid=\d+(?:,\s*ip=[\d.]+)?\)\s
      | # PyTorch >= 2.2 c10 logging and torchrun --log-line-prefix-template: "[rank3]:"; the
        # same tag followed by a space is how trainers' own loggers name the rank ("[rank0] …")
        \[rank(?P<rank>\d+)\](?::\s?|\s)
      | # torchrun --tee / --redirects (elastic agent): "[default0]:" names the LOCAL rank
        \[(?P<role>[A-Za-z_]\w*?)(?P<local>\d+)\]:\s?
      | # a line counter some log viewers prepend: "[80746] "
        \[\d+\]\s(?=\S)
      | # srun --label / mpirun --tag-output: "3: " or "[1,3]<stderr>:"
        (?P<srun>\d{1,6}):\s
      | \[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:\s?
    )
    """,
    re.VERBOSE,
)


# pdsh (DeepSpeed's multi-node launcher, `pdsh -w`) puts "host: " before every line of every
# node: outermost, and a host name has a digit in it ("ip-10-0-7-12", "gpu-a101"). Stripped so
# that what follows reads as it would on one node (a traceback, a bar, the rank's own prefix);
# exactly the one space pdsh adds goes, the line's own indentation stays.
_PDSH = re.compile(r"(?P<host>[A-Za-z][\w.-]*\d[\w.-]*): ")


@dataclass(frozen=True, slots=True)
class Prefix:
    rank: int | None
    local_rank: int | None
    rest: str
    # The srun/mpirun task id when it is what ``rank`` was read from: the global rank when the
    # launcher starts one task per rank, a node's index when it starts one launcher per node.
    task: int | None = None


def split_prefix(text: str) -> Prefix:
    rank = local_rank = task = None
    pos = 0
    pdsh = _PDSH.match(text) if ": " in text[:64] else None
    if pdsh is not None:
        pos = pdsh.end()
    for _ in range(6):  # a bounded number of nested prefixes
        m = _PREFIXES.match(text, pos)
        if not m or m.end() == pos:
            break
        if m.group("rank") is not None:
            rank, task = int(m.group("rank")), None
        elif m.group("local") is not None:
            local_rank = int(m.group("local"))
        elif m.group("srun") is not None and rank is None:
            rank = task = int(m.group("srun"))
        elif m.group("mpi") is not None and rank is None:
            rank = task = int(m.group("mpi"))
        pos = m.end()
    return Prefix(rank, local_rank, text[pos:], task)


# A rank's own file is usually named for it: rank3.log, rank_3.txt, worker-rank-3.out, r3.log,
# trace_rank1.json. Shared by `fleetwatch diagnose` and the agent.
RANK_IN_NAME = re.compile(r"(?:^|[^a-z])(?:rank|r)[_-]?(\d{1,6})(?:\D|$)", re.IGNORECASE)
