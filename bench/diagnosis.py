"""The diagnosis scenario: how fast the diagnosis pass reads big training logs, against peers.

Every figure is a ratio against a peer measured in the same run on the same bytes, so the
result says something on any machine; no absolute time is asserted anywhere. Each log mix of
``bench.logs`` (INFO-heavy, quiet, a WARN storm, a traceback storm, the first training mix) gets
the same rows, so no mix is reported alone:

  - ``bytes.count(b"\\n")`` over the file read in 1 MiB blocks: the fastest a pure-Python pass
    could touch every byte. Goal: at least 0.3x of its lines/s.
  - Drain3's ``TemplateMiner``, the usual way to mine log templates, and the diagnosis pass on
    the same in-memory prefix (Drain3 does ~20k lines/s: a whole 1 GB file would take hours).
    Goal: at least 50x its lines/s.
  - The pass must count every line and find every planted watchdog timeout; a fast pass that
    finds nothing is not a result, and the run says so loudly.

Then, on the INFO mix: peak RSS and throughput in a fresh process on 1/8 of the size and on all
of it (memory flat: at most 1.2x; time linear: the big file no slower per line than 0.8x), and a
healthy log that ends in a failure, whose verdict must be what its last 2 MiB alone get.

``python -m bench.diagnosis --child PATH`` is the fresh process of the memory measurement.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from .logs import WORLD, Planted, _watchdog_line, append_failure, write_log
from .report import scenario

REPO = Path(__file__).resolve().parent.parent
BLOCK = 1 << 20
CHILD_TIMEOUT_S = 900


def diagnose(source: str | Path | bytes):
    """The pass being measured, exactly as the diagnosis entry points run it, on a file or on
    bytes already in memory (a prefix)."""
    from analysis.classify import classify
    from ingest.parsers import parse_log

    if isinstance(source, bytes):
        parsed = parse_log(source)
    else:
        with open(source, "rb") as stream:
            parsed = parse_log(stream)
    return parsed, classify(parsed.events)


def _best(
    fn: Callable[[], object], repeat: int, clock: Callable[[], float] = time.perf_counter
) -> tuple[float, object]:
    """Fastest of ``repeat`` runs: the least disturbed by the rest of the machine. With
    ``clock=time.process_time`` the CPU time, for a scaling check (does time per line grow with
    the number of lines?): work done, which other processes add to the wall clock, not to it."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = clock()
        result = fn()
        best = min(best, clock() - start)
    return best, result


def count_newlines(path: str | Path) -> int:
    """The floor: read every block and count its newlines, nothing else."""
    lines = 0
    with open(path, "rb") as stream:
        while block := stream.read(BLOCK):
            lines += block.count(b"\n")
    return lines


def read_prefix(path: str | Path, size: int) -> bytes:
    """The first ``size`` bytes of the file, cut back to the last whole line."""
    with open(path, "rb") as stream:
        head = stream.read(size)
    return head[: head.rfind(b"\n") + 1]


def drain3_lines_per_s(prefix: bytes) -> tuple[float, int, int]:
    """Feed every line of ``prefix`` to a default, in-memory Drain3 ``TemplateMiner``.

    Returns (seconds, lines, clusters). The default config is built explicitly so that a stray
    ``drain3.ini`` in the working directory cannot change what is measured.
    """
    import logging

    from drain3 import TemplateMiner
    from drain3.template_miner_config import TemplateMinerConfig

    logging.getLogger("drain3").setLevel(logging.WARNING)
    miner = TemplateMiner(config=TemplateMinerConfig())
    lines = 0
    start = time.perf_counter()
    for raw in prefix.split(b"\n")[:-1]:
        miner.add_log_message(raw.decode("utf-8", "replace"))
        lines += 1
    return time.perf_counter() - start, lines, len(miner.drain.clusters)


def _child_report(path: str) -> dict:
    start = time.perf_counter()
    parsed, verdict = diagnose(path)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "seconds": seconds,
        # Linux reports KiB, macOS bytes.
        "peak_rss_bytes": peak if sys.platform == "darwin" else peak * 1024,
        "lines": parsed.lines,
        "events": dict(Counter(e.kind for e in parsed.events)),
        "dropped_events": parsed.dropped_events,
        "culprit": verdict.culprit,
    }


def peak_rss(path: str | Path) -> dict:
    """Run the diagnosis pass on ``path`` in a fresh interpreter and return its report."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.diagnosis", "--child", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"diagnosis child failed on {path}:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _mib(n: float) -> float:
    return n / (1 << 20)


# The mixes in the order the report lists them; ``info`` is what a fleet with NCCL_DEBUG=INFO
# writes, the headline. Every mix gets the same figures: no mix is reported alone.
MIX_ORDER = ("info", "quiet", "warn_storm", "traceback_storm", "training")
# The tail that must be enough on its own (the ending scenario): what an agent's last upload of a
# dying job's log would hold.
TAIL_BYTES = 2 << 20


def _mix(
    workdir: Path, mix: str, size_bytes: int, drain_bytes: int, seed: int, repeat: int, say
) -> tuple[list[dict], dict, Planted]:
    """One mix: the pass against the floor on the whole file, and against Drain3 on one prefix
    that both read. The file is left for the caller to reuse or delete."""
    path = workdir / f"{mix}.log"
    start = time.perf_counter()
    planted = write_log(path, size_bytes, seed, mix)
    say(
        f"{mix}: generated {_mib(planted.bytes):.1f} MiB / {planted.lines:,} lines in "
        f"{time.perf_counter() - start:.1f}s; planted {planted.incidents}"
    )
    # The pass and the floor, alternated so that both see the same machine state.
    diag_s = floor_s = float("inf")
    parsed = verdict = None
    floor_lines = 0
    for _ in range(repeat):
        seconds, (parsed, verdict) = _best(lambda: diagnose(path), 1)
        diag_s = min(diag_s, seconds)
        seconds, floor_lines = _best(lambda: count_newlines(path), 1)
        floor_s = min(floor_s, seconds)
    assert parsed is not None and verdict is not None
    # Drain3 and the pass on the very same in-memory prefix: Drain3 slows down as its template
    # tree grows, so comparing the whole file against Drain3 on a prefix would flatter neither.
    prefix = read_prefix(path, drain_bytes)
    drain_s, drain_lines, clusters = drain3_lines_per_s(prefix)
    prefix_s, _ = _best(lambda: diagnose(prefix), repeat)
    say(
        f"{mix}: diagnosis {diag_s:.2f}s, floor {floor_s:.3f}s; on the first "
        f"{_mib(len(prefix)):.1f} MiB Drain3 {drain_s:.1f}s ({clusters} templates), diagnosis "
        f"{prefix_s:.3f}s"
    )
    found = Counter(e.kind for e in parsed.events)
    lines = planted.lines
    prefix_note = f"first {_mib(len(prefix)):.1f} MiB ({drain_lines:,} lines)"
    rows = [
        scenario(
            f"diagnosis vs bytes.count floor, {mix} mix",
            "lines/s",
            lines / diag_s,
            'bytes.count(b"\\n"), 1 MiB reads',
            floor_lines / floor_s,
            ">=",
            0.3,
            note=f"{_mib(planted.bytes):.0f} MiB; diagnosis {_mib(planted.bytes) / diag_s:.0f} "
            f"MiB/s, floor {_mib(planted.bytes) / floor_s:.0f} MiB/s",
        ),
        scenario(
            f"diagnosis vs Drain3, {mix} mix",
            "lines/s",
            drain_lines / prefix_s,
            f"Drain3 TemplateMiner, {prefix_note}",
            drain_lines / drain_s,
            ">=",
            50,
            note="both over the same in-memory prefix",
        ),
        scenario(
            f"lines counted by the pass, {mix} mix",
            "lines",
            parsed.lines,
            "lines written by the generator",
            lines,
            "==",
            1,
            gate=True,
        ),
        _found(f"watchdog timeouts found, {mix} mix", "watchdog_timeout", found, planted, mix),
        _found(f"progress lines found, {mix} mix", "work_progress", found, planted, mix),
    ]
    details = {
        "file": {"bytes": planted.bytes, "lines": lines, "planted": planted.incidents},
        "incident_lines": planted.incident_lines,
        "diagnosis": {
            "seconds": diag_s,
            "lines_per_s": lines / diag_s,
            "mib_per_s": _mib(planted.bytes) / diag_s,
            "lines_seen": parsed.lines,
            "events": dict(found),
            "dropped_events": parsed.dropped_events,
            "folded_lines": parsed.folded_lines,
            "issues": len(parsed.issues),
            "culprit": verdict.culprit,
            "confidence": verdict.confidence,
            "repeat": repeat,
        },
        "floor": {"seconds": floor_s, "lines": floor_lines, "repeat": repeat},
        "drain3": {
            "seconds": drain_s,
            "lines": drain_lines,
            "prefix_bytes": len(prefix),
            "templates": clusters,
            "diagnosis_same_prefix_seconds": prefix_s,
        },
    }
    return rows, details, planted


def _memory_and_scale(workdir: Path, full: Planted, seed: int, say) -> tuple[list[dict], dict]:
    """Peak memory and throughput of the INFO mix at its full size (the file the mix rows read)
    and at 1/8 of it, each in a fresh process: memory must stay flat and time linear."""
    small_path, full_path = workdir / "info-eighth.log", Path(full.path)
    small = write_log(small_path, full.bytes // 8, seed, "info")
    rss_small = peak_rss(small_path)
    rss_full = peak_rss(full_path)
    say(
        f"peak RSS {_mib(rss_small['peak_rss_bytes']):.1f} MiB on 1/8, "
        f"{_mib(rss_full['peak_rss_bytes']):.1f} MiB on the full file; "
        f"{rss_small['seconds']:.2f}s and {rss_full['seconds']:.2f}s"
    )
    rows = [
        scenario(
            "peak memory, full file vs 1/8, info mix",
            "peak RSS MiB",
            _mib(rss_full["peak_rss_bytes"]),
            f"same pass on 1/8 of the size ({_mib(small.bytes):.0f} MiB)",
            _mib(rss_small["peak_rss_bytes"]),
            "<=",
            1.2,
            note="fresh process each; ru_maxrss of the child",
        ),
        scenario(
            "throughput, full file vs 1/8, info mix",
            "lines/s",
            full.lines / rss_full["seconds"],
            f"same pass on 1/8 of the size ({_mib(small.bytes):.0f} MiB)",
            small.lines / rss_small["seconds"],
            ">=",
            0.8,
            note="time linear in size: the bigger file is read no slower per line",
        ),
        _found(
            "watchdog timeouts found, info mix, fresh process",
            "watchdog_timeout",
            Counter(rss_full["events"]),
            full,
            "fresh process",
        ),
    ]
    small_path.unlink()
    return rows, {"eighth": rss_small, "full": rss_full}


def _ending(workdir: Path, size_bytes: int, seed: int, say) -> tuple[list[dict], dict]:
    """A healthy stretch of INFO-heavy log that ends in a failure (an Xid 79, the other ranks'
    timeouts): the whole file must get the verdict its last lines get alone."""
    path = workdir / "info-ending.log"
    noise = write_log(path, size_bytes, seed, "info", incidents=False)
    append_failure(path, seed)
    with open(path, "rb") as stream:
        stream.seek(max(0, path.stat().st_size - TAIL_BYTES))
        tail = stream.read()
    tail = tail[tail.find(b"\n") + 1 :]
    whole, whole_verdict = diagnose(path)
    _, tail_verdict = diagnose(tail)
    say(
        f"ending: whole file {whole_verdict.culprit} ({len(whole.events):,} events, "
        f"{whole.dropped_events:,} dropped), last {_mib(len(tail)):.1f} MiB alone "
        f"{tail_verdict.culprit}"
    )
    path.unlink()
    rows = [
        scenario(
            "a failure in the last lines: whole file's verdict is the tail's",
            "verdict matches",
            float(whole_verdict.culprit == tail_verdict.culprit != "unknown"),
            f"the last {_mib(len(tail)):.0f} MiB diagnosed alone ({tail_verdict.culprit})",
            1.0,
            "==",
            1,
            gate=True,
            note=f"{_mib(noise.bytes):.0f} MiB of healthy INFO-mix log, then an Xid 79 and "
            f"{WORLD - 1} timeouts; whole file: {whole_verdict.culprit}, "
            f"{len(whole.events):,} events kept, {whole.dropped_events:,} dropped",
        )
    ]
    return rows, {
        "whole": whole_verdict.culprit,
        "tail": tail_verdict.culprit,
        "events": len(whole.events),
        "dropped_events": whole.dropped_events,
    }


def _timeout_storm(lines: int, repeat: int, say) -> tuple[list[dict], dict]:
    """A log of nothing but watchdog timeouts (every rank of a 64-rank job, thousands of
    collectives each: a wrapper that retries and reprints, or a hostile upload): every line is
    an event every cross-rank rule reads. Time per line must not grow with their number (a
    lookup per timeout that scanned every group's evidence made 8,000 of them take 17 s)."""

    def storm(n: int) -> bytes:
        return "".join(
            _watchdog_line(
                f"[rank{i % 64}]:[E1126 04:10:21.000000000 ProcessGroupNCCL.cpp:",
                i % 64,
                i // 64,
                "ALLREDUCE",
                1,
                1,
                40,
            )
            + "\n"
            for i in range(n)
        ).encode()

    small, big = storm(lines // 4), storm(lines)
    # CPU time, fewest of three at least: the quarter-size run lasts a tenth of a second, where
    # a CPU burner beside the bench moved the wall-clock ratio from 1.0 to 0.66.
    t_small, _ = _best(lambda: diagnose(small), max(repeat, 3), time.process_time)
    t_big, (parsed, verdict) = _best(lambda: diagnose(big), max(repeat, 3), time.process_time)
    say(f"timeout storm: {lines // 4:,} lines {t_small:.2f} s CPU, {lines:,} lines {t_big:.2f} s")
    rows = [
        scenario(
            "throughput, timeout storm, 4x the lines",
            "lines per CPU second",
            lines / t_big,
            f"same pass on a quarter of the lines ({lines // 4:,})",
            (lines // 4) / t_small,
            ">=",
            0.8,
            gate=True,
            note="every line a watchdog timeout of a 64-rank job: no per-timeout cost that "
            f"grows with their number; {len(parsed.events):,} events, verdict {verdict.culprit}",
        )
    ]
    return rows, {"lines": lines, "seconds_quarter": t_small, "seconds": t_big}


def run(
    workdir: Path,
    size_bytes: int,
    drain_bytes: int,
    *,
    seed: int = 4187,
    repeat: int = 3,
    say: Callable[[str], None] = print,
    mixes: tuple[str, ...] = MIX_ORDER,
) -> dict:
    """Generate the logs, measure everything, return ``{"scenarios": [...], "details": {...}}``.
    Each mix's file is deleted once measured, so the run needs the disk of one file at a time."""
    scenarios: list[dict] = []
    details: dict = {"seed": seed, "size_bytes": size_bytes, "mixes": {}}
    info = None
    for mix in mixes:
        rows, mix_details, planted = _mix(workdir, mix, size_bytes, drain_bytes, seed, repeat, say)
        scenarios += rows
        details["mixes"][mix] = mix_details
        if mix == "info":
            info = planted  # read again in fresh processes below
        else:
            Path(planted.path).unlink()
    if info is not None:
        rows, details["memory"] = _memory_and_scale(workdir, info, seed, say)
        scenarios += rows
        Path(info.path).unlink()
    rows, details["ending"] = _ending(workdir, size_bytes, seed, say)
    scenarios += rows
    # 64 ranks x 500 collectives at 1 GiB mixes, a quarter of that in quick runs.
    storm_lines = 32_000 if size_bytes >= 256 << 20 else 8_000
    rows, details["timeout_storm"] = _timeout_storm(storm_lines, repeat, say)
    scenarios += rows
    return {"scenarios": scenarios, "details": details}


def _found(name: str, kind: str, found: Counter, planted: Planted, where: str) -> dict:
    where = where if where == "fresh process" else f"{where} mix"
    return scenario(
        name,
        f"{kind} events",
        found.get(kind, 0),
        f"planted in the generated log ({where})",
        planted.incidents.get(kind, 0),
        "==",
        1,
        gate=True,
    )


def _child_main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--child":
        print("usage: python -m bench.diagnosis --child PATH", file=sys.stderr)
        return 2
    print(json.dumps(_child_report(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
