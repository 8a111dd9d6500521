"""The ``fleetwatch`` command. ``fleetwatch diagnose`` runs the pure core on files: no server,
no database, no Django."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

EXIT_UNREADABLE = 2


def iter_files(paths: list[str]) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            yield path
        else:
            raise FileNotFoundError(f"{raw}: no such file or directory")


def rank_of_file(path: Path, events) -> int | None:
    """The rank a file belongs to: named in the file name, else the one rank all its events
    name (None for shared files such as a kernel log)."""
    from ingest.parsers.prefix import RANK_IN_NAME

    m = RANK_IN_NAME.search(path.name)
    if m:
        return int(m.group(1))
    ranks = {e.rank for e in events if e.rank is not None}
    return ranks.pop() if len(ranks) == 1 else None


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def diagnose(paths: list[str], *, jobs: int = 1):
    """The verdict on these files (``fleetwatch diagnose`` without the similar cases)."""
    return diagnose_with_similar(paths, jobs=jobs)[0]


def diagnose_with_similar(paths: list[str], *, jobs: int = 1, notes: list | None = None):
    """The verdict, and the resolved public incidents most like these files. ``notes``, when
    given, collects what the reader should know of how the files were read (events dropped
    past the bound, repeated lines counted rather than parsed)."""
    from analysis.classify import IncidentContext, classify
    from analysis.corpus.similar import similar_cases
    from ingest.parsers import parse_files

    files = list(iter_files(paths))
    if not files:
        raise FileNotFoundError("no files found under " + " ".join(paths))
    events = []
    ranks: set[int] = set()
    for path, result in zip(files, parse_files(files, jobs=jobs), strict=True):
        if notes is not None and result.dropped_events:
            said = (i.message for i in result.issues if "were dropped" in i.message)
            notes.append(f"{path}: " + next(said, f"{result.dropped_events} events dropped"))
        if notes is not None and result.folded_lines:
            notes.append(
                f"{path}: {result.folded_lines} exact repeats of NCCL warnings or settings were "
                "counted, not parsed"
            )
        rank = rank_of_file(path, result.events)
        if rank is not None:
            ranks.add(rank)
            # A rank's own file speaks for that rank, as an upload's rank does on the server
            # (ingest.services: event_row(default_rank=upload.rank)). A rank read from a file
            # name is a guess ("-r07-" may be a rack): it fills in events that name no rank and,
            # unlike an upload's declared rank, overrides none.
            events.extend(e if e.rank is not None else replace(e, rank=rank) for e in result.events)
        else:
            events.extend(result.events)
    verdict = classify(events, IncidentContext(ranks_uploaded=frozenset(ranks)))
    return verdict, similar_cases(events)


def render_text(verdict, similar=()) -> str:
    lines = [
        f"Culprit:    {verdict.culprit} (confidence {verdict.confidence:.2f})",
        f"Summary:    {verdict.summary}",
        f"Fix:        {verdict.fix}",
    ]
    if verdict.suspects:
        lines.append("Suspects:")
        lines += [f"  {s.kind} {s.id}: {s.why}" for s in verdict.suspects]
    if verdict.alternatives:
        lines.append(
            "Also possible: "
            + ", ".join(f"{a.culprit} ({a.confidence:.2f})" for a in verdict.alternatives)
        )
    if verdict.evidence:
        lines.append("Evidence:")
        lines += [f"  {e.file}:{e.line} [{e.signal}] {e.text[:200]}" for e in verdict.evidence]
    if similar:
        lines.append("Similar resolved public incidents (leads, not the verdict):")
        for s in similar:
            lines.append(f"  {s.similarity:.2f} {s.culprit}: {s.title[:80]} <{s.source_url}>")
            lines.append(f"      fix: {s.fix[:160]}")
    lines.append(f"Ruleset {verdict.ruleset_version}")
    return "\n".join(lines)


def to_json(verdict, similar=()) -> dict:
    out = verdict.to_dict()
    out["similar"] = [s.to_dict() for s in similar]
    return {
        key: out[key]
        for key in (
            "culprit",
            "confidence",
            "summary",
            "fix",
            "suspects",
            "evidence",
            "alternatives",
            "ruleset_version",
            "similar",
        )
    }


def _quiet_broken_pipe() -> None:
    """``fleetwatch eval | head``: a reader that stops early ends the command quietly, as other
    command-line tools do, instead of a BrokenPipeError traceback."""
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the console script, not a test calling main([...])
        _quiet_broken_pipe()
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "probe":
        # The collective health probe lives with the agent (torch.distributed, no Django).
        from agents.probe import main as probe_main

        return probe_main(argv[1:])
    parser = argparse.ArgumentParser(prog="fleetwatch", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("probe", help="collective health probe across a job's ranks (see --help)")
    diag = sub.add_parser(
        "diagnose", help="name the culprit of one incident from the files it left behind"
    )
    diag.add_argument(
        "paths",
        nargs="+",
        help="logs, Flight Recorder dumps, profiler traces, hardware stats, or directories of "
        "them (.gz read as well)",
    )
    diag.add_argument("--json", action="store_true", help="print one JSON object")
    diag.add_argument(
        "--jobs",
        type=int,
        default=usable_cpus(),
        help="processes that parse files at once (default: the CPUs this may use; 1 for none)",
    )
    ev = sub.add_parser(
        "eval", help="score the diagnosis on the labelled corpus of real incidents (see README)"
    )
    ev.add_argument("--split", choices=("dev", "test", "all"), default="dev")
    ev.add_argument(
        "--cases",
        metavar="DIR",
        help="score another corpus in the same format (a fleet's own labelled incidents, from "
        "`manage.py export_corpus`): every case in it, whatever --split says",
    )
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    ev.add_argument(
        "--no-perturb", action="store_true", help="skip the perturbation check (5x faster)"
    )
    ev.add_argument(
        "--calibrate",
        action="store_true",
        help="measure each rule's precision on dev and write the table verdicts report "
        "confidence from (analysis/classify/calibration.json); dev only",
    )
    args = parser.parse_args(argv)

    if args.command == "eval":
        from analysis.corpus import cases_on
        from analysis.corpus.evaluate import calibrate, evaluate, render

        if args.calibrate:
            if args.split != "dev":
                print("fleetwatch eval: --calibrate measures on dev only", file=sys.stderr)
                return EXIT_UNREADABLE
            from analysis.classify.engine import CALIBRATION_FILE

            table = calibrate(cases_on("dev"))
            CALIBRATION_FILE.write_text(json.dumps(table, indent=1) + "\n")
            print(f"wrote {CALIBRATION_FILE.name}: {len(table['rules'])} rules")
            return 0

        if args.cases:
            from analysis.corpus import CorpusError, load_cases

            if args.calibrate:
                print("fleetwatch eval: --calibrate measures on dev only", file=sys.stderr)
                return EXIT_UNREADABLE
            try:
                cases, split = load_cases(Path(args.cases), strict=True), args.cases
            except (OSError, CorpusError) as exc:
                print(f"fleetwatch eval: {exc}", file=sys.stderr)
                return EXIT_UNREADABLE
        else:
            cases, split = cases_on(args.split), args.split
        figures = evaluate(cases, perturb=not args.no_perturb)
        figures["split"] = split
        print(json.dumps(figures, indent=2) if args.json else render(figures, split))
        return 0
    if args.command == "diagnose":
        try:
            # parse_files keeps jobs in 1..files
            notes: list[str] = []
            verdict, similar = diagnose_with_similar(args.paths, jobs=args.jobs, notes=notes)
        except OSError as exc:
            print(f"fleetwatch diagnose: {exc}", file=sys.stderr)
            return EXIT_UNREADABLE
        for note in notes:
            print(f"fleetwatch diagnose: {note}", file=sys.stderr)
        if args.json:
            print(json.dumps(to_json(verdict, similar), indent=2))
        else:
            print(render_text(verdict, similar))
        return 0
    return 1  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
