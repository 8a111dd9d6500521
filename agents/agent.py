"""The agent's loop: collect into the spool, then upload from it. One thread, no sleeps inside
a tick (backoff is a "not before" time), so a slow server never stalls collection.

Collectors, each cheap when nothing changed:

- followed logs (``follow.Follower``), shipped as gzip chunks of whole lines;
- Flight Recorder dumps in ``run_dir/fr`` and ``fr_dirs``, once each when their size settles;
- progress heartbeats of the torch integration (``run_dir/progress``): a rank silent for
  ``stall_factor`` × its median step time gets an on-demand Flight Recorder dump through its
  debug pipe, before the watchdog kills the job;
- profiler traces, summarised on the host when ``ingest.parsers.trace.summarize_trace`` exists;
- kernel log lines (Xid and friends), NVML and host stats every ``stats_interval_s``.
"""

from __future__ import annotations

import errno
import gzip
import json
import logging
import os
import re
import resource
import time
from pathlib import Path

from ingest.parsers.prefix import RANK_IN_NAME

from . import records
from .config import AgentConfig
from .follow import Chunk, Follower
from .readers import HostStats, IbPorts, KernelLog, Nvml
from .spool import TMP_PREFIX, Spool
from .uploader import Uploader

log = logging.getLogger("fleetwatch.agent")

TRAILING_NUMBER = re.compile(r"(\d+)(?:\.\w+)*$")
SETTLE_S = 1.0  # a dump or trace whose size has not changed this long is complete
ACTIVE_S = 600.0  # a heartbeat this recent makes its job the host's current job
MAX_ARTIFACT = 256 << 20


def gz(body: bytes) -> bytes:
    # mtime=0: the same content always compresses to the same bytes, which is what makes a
    # re-sent item a duplicate the server recognises.
    return gzip.compress(body, compresslevel=6, mtime=0)


def pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError) as exc:
        return isinstance(exc, OSError) and exc.errno == errno.EPERM
    return True


STALL_TIMEOUT_SHARE = 0.5  # of the process group's timeout: when a silent rank's dump is asked


class Agent:
    def __init__(self, config: AgentConfig, *, clock=time.time) -> None:
        self.config = config
        self.clock = clock
        self.spool = Spool(
            config.spool_dir, max_bytes=config.spool_max_bytes, max_items=config.spool_max_items
        )
        self.uploader = Uploader(config, self.spool)
        self.run_dir = Path(config.run_dir)
        extra = self.spool.state().extra
        self.follower = Follower(
            config.logs,
            chunk_bytes=config.chunk_bytes,
            flush_s=config.log_flush_s,
            offsets=self._recovered_offsets(dict(extra.get("logs", {}))),
        )
        self.path_pattern = re.compile(config.log_path_pattern) if config.log_path_pattern else None
        self.seen: dict[str, list] = dict(extra.get("seen", {}))
        # summary filename -> the raw trace it was made from and the job it was sent under, so
        # that a request for it sends that one file (never another job's trace of the rank).
        self.summaries: dict[str, dict] = dict(extra.get("summaries", {}))
        self.answered: list[int] = list(extra.get("answered", []))
        self.heartbeats: list[dict] = []
        self.dumped: set[tuple] = set()
        self.mismatches: set[tuple] = set()
        self.kernel = KernelLog(config.kernel_logs)
        self.nvml = Nvml()
        self.host_stats = HostStats()
        self.ib_ports = IbPorts(config.ib_sysfs)
        self.next_stats = 0.0
        self.pending_records: list[dict] = []
        self.unattributed: set[str] = set()

    # --- recovery ------------------------------------------------------------------------------

    def _recovered_offsets(self, offsets: dict) -> dict:
        """A chunk spooled just before a crash may be newer than the saved offset: continue
        after it rather than ship its lines twice."""
        for item in self.spool.items():
            source = item.header.get("source")
            if not source or "end" not in item.header:
                continue
            saved = offsets.get(source)
            if saved and saved[:2] == [item.header.get("dev"), item.header.get("ino")]:
                saved[2] = max(int(saved[2]), int(item.header["end"]))
        return offsets

    # --- the loop ------------------------------------------------------------------------------

    def run(self, stop=None, *, ticks: int | None = None) -> None:
        done = 0
        while not (stop is not None and stop.is_set()):
            started = time.monotonic()
            self.tick()
            done += 1
            if ticks is not None and done >= ticks:
                break
            delay = max(0.0, self.config.poll_s - (time.monotonic() - started))
            if stop is not None:
                stop.wait(delay)
            else:
                time.sleep(delay)

    def tick(self, *, final: bool = False) -> None:
        now = self.clock()
        self.spool.enforce_bounds()
        self.scan_heartbeats(now)
        self.collect_logs(now, final=final)
        self.collect_dumps(now, final=final)
        self.collect_traces(now, final=final)
        self.answer_requests(now)
        self.prune_traces(now)
        self.collect_kernel()
        if now >= self.next_stats or self.pending_records:
            self.collect_stats(now)
        self.uploader.drain(budget_s=max(1.0, self.config.poll_s))

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Ship everything collected so far; True when the spool emptied."""
        self.tick(final=True)
        deadline = time.monotonic() + timeout_s
        while self.spool.names() and time.monotonic() < deadline:
            if self.uploader.ready():
                self.uploader.drain(budget_s=timeout_s)
            else:
                time.sleep(0.05)
        return not self.spool.names()

    # --- jobs on this host ---------------------------------------------------------------------

    def scan_heartbeats(self, now: float) -> None:
        beats = []
        for path in (self.run_dir / "progress").glob("*.json"):
            try:
                beats.append(json.loads(path.read_bytes()))
            except (OSError, ValueError):
                continue  # being replaced right now; next tick
        self.heartbeats = beats
        self._check_stalls(now)
        self._compare_data_order()

    def current_job(self) -> tuple[str, int] | None:
        if self.config.job:
            return self.config.job, self.config.attempt
        recent = [b for b in self.heartbeats if self.clock() - b.get("updated_at", 0) < ACTIVE_S]
        if not recent:
            return None
        newest = max(recent, key=lambda b: b.get("updated_at", 0))
        return newest["job"], int(newest.get("attempt") or 0)

    def active_jobs(self) -> list[tuple[str, int]]:
        jobs = {
            (b["job"], int(b.get("attempt") or 0))
            for b in self.heartbeats
            if self.clock() - b.get("updated_at", 0) < ACTIVE_S
        }
        if self.config.job:
            jobs.add((self.config.job, self.config.attempt))
        return sorted(jobs)

    def _check_stalls(self, now: float) -> None:
        stalled = []
        for beat in self.heartbeats:
            median, last = beat.get("median_step_s"), beat.get("last_step_at")
            if beat.get("finished") or not median or not last or not pid_alive(beat.get("pid")):
                continue
            limit = max(self.config.stall_min_s, self.config.stall_factor * median)
            pg_timeout = beat.get("pg_timeout_s")
            if pg_timeout:
                # Dump before the watchdog fires at the peers: a rank silent for half the
                # collective timeout is the one they will time out waiting for, and after the
                # abort its state is gone (a fixed 30 s never fired before a 6 s timeout).
                limit = min(limit, max(self.config.poll_s, STALL_TIMEOUT_SHARE * pg_timeout))
            key = (beat["job"], beat.get("attempt"), beat.get("rank"), beat.get("steps"))
            if now - last > limit and key not in self.dumped:
                self.dumped.add(key)
                stalled.append(beat)
        for beat in stalled:
            log.warning(
                "job %s rank %s: no step for %.0f s (median step %.2f s): asking every rank "
                "of the job on this host for a Flight Recorder dump",
                beat["job"],
                beat.get("rank"),
                now - beat["last_step_at"],
                beat["median_step_s"],
            )
            self.pending_records.append(
                {
                    "type": "progress_stall",
                    "job": beat["job"],
                    "attempt": beat.get("attempt"),
                    "rank": beat.get("rank"),
                    "silent_s": round(now - beat["last_step_at"], 2),
                    "median_step_s": beat["median_step_s"],
                    "steps": beat.get("steps"),
                }
            )
            for peer in self.heartbeats:
                if (peer["job"], peer.get("attempt")) == (beat["job"], beat.get("attempt")):
                    self.request_dump(peer)

    def request_dump(self, beat: dict) -> bool:
        """Write to the rank's debug pipe: PyTorch (NCCL) or the torch integration (gloo)
        dumps its Flight Recorder to the dump file the agent already watches."""
        stem, rank = beat.get("pipe_stem"), beat.get("rank")
        if not stem or rank is None:
            return False
        path = f"{stem}{rank}.pipe"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:  # ENXIO: nobody reads the pipe (yet); ENOENT: no pipe
            log.info("no dump pipe for rank %s (%s): %s", rank, path, exc.strerror)
            return False
        try:
            os.write(fd, b"1\n")
        except OSError:
            return False
        finally:
            os.close(fd)
        return True

    def _compare_data_order(self) -> None:
        """Ranks of one job on this host that start an epoch with different data: say so now.
        (The server compares all hosts' ranks from the uploaded records.)"""
        by_epoch: dict[tuple, list[dict]] = {}
        for beat in self.heartbeats:
            order = beat.get("data_order")
            if order:
                key = (beat["job"], beat.get("attempt"), order.get("epoch"))
                by_epoch.setdefault(key, []).append(order)
        for key, orders in by_epoch.items():
            if key in self.mismatches or len(orders) < 2:
                continue
            for field in ("steps", "dataset_len", "dataset_fingerprint"):
                values = {o.get("rank"): o.get(field) for o in orders}
                if len(set(values.values())) > 1:
                    self.mismatches.add(key)
                    log.warning(
                        "job %s attempt %s epoch %s: ranks split the data differently "
                        "(%s by rank: %s): they will run different collectives and hang",
                        *key,
                        field,
                        values,
                    )
                    break

    # --- collectors ----------------------------------------------------------------------------

    def _owner_of(self, path: str) -> tuple[str, int, int | None] | None:
        """The job and rank whose process writes its output to this file (the integration's
        heartbeat names the files behind its stdout and stderr)."""
        real = os.path.realpath(path)
        for beat in self.heartbeats:
            if real in (beat.get("outputs") or ()):
                rank = beat.get("rank")
                return beat["job"], int(beat.get("attempt") or 0), rank
        return None

    def _ambiguous(self) -> bool:
        """More than one job is running here and the configuration names none: a file that
        neither its path nor a heartbeat ties to a job cannot be given the newest job's name."""
        return not self.config.job and len(self.active_jobs()) > 1

    def _job_of_path(self, path: str) -> tuple[str, int, int | None] | None:
        match = self.path_pattern.search(path) if self.path_pattern else None
        groups = match.groupdict() if match else {}
        if not groups.get("job"):
            owner = self._owner_of(path)
            if owner is not None:
                return owner
            if self._ambiguous():
                return None
        current = self.current_job()
        job = groups.get("job") or (current[0] if current else None)
        if job is None:
            return None
        attempt = groups.get("attempt")
        attempt = int(attempt) if attempt else (current[1] if current else 0)
        rank = groups.get("rank")
        if rank is None:
            m = RANK_IN_NAME.search(os.path.basename(path))
            rank = m.group(1) if m else None
        return job, attempt, int(rank) if rank is not None else None

    def collect_logs(self, now: float, *, final: bool = False) -> None:
        if not self.config.logs or (self.current_job() is None and not self.path_pattern):
            return  # nothing to attribute lines to yet: leave them in the files
        chunks = self.follower.poll(now, final=final)
        for chunk in chunks:
            where = self._job_of_path(chunk.path)
            if where is None:
                # Not attributable yet (two jobs here, nothing names this file's): read it
                # again later rather than ship it under a guessed job or lose it.
                self.follower.rewind(chunk)
                if chunk.path not in self.unattributed:
                    self.unattributed.add(chunk.path)
                    log.warning("%s: no job to attribute it to yet; holding it", chunk.path)
                continue
            self._spool_chunk(chunk, where)
        if chunks:
            self.spool.save_extra("logs", self.follower.offsets())

    def _spool_chunk(self, chunk: Chunk, where: tuple[str, int, int | None]) -> None:
        job, attempt, rank = where
        header = records.upload_header(
            host=self.config.host,
            job=job,
            attempt=attempt,
            rank=rank,
            kind="log",
            filename=f"{os.path.basename(chunk.path)}@{chunk.start}.gz",
            source=chunk.path,
            dev=chunk.dev,
            ino=chunk.ino,
            end=chunk.end,
        )
        self._put(header, gz(chunk.body))

    def _put(self, header: dict, body: bytes) -> None:
        self.spool.enforce_bounds(incoming=len(body))
        self.spool.put(header, body)

    def _settled_files(self, dirs, now: float, final: bool):
        for directory in dirs:
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                if entry.name.startswith((TMP_PREFIX, ".")) or entry.name.endswith(".pipe"):
                    continue
                try:
                    st = entry.stat()
                except OSError:
                    continue
                if not entry.is_file() or st.st_size == 0 or st.st_size > MAX_ARTIFACT:
                    continue
                stamp = [st.st_size, st.st_mtime_ns]
                if self.seen.get(entry.path) == stamp:
                    continue
                if not final and now - st.st_mtime < SETTLE_S:
                    continue
                yield entry, stamp

    def _job_of_dump(self, name: str) -> tuple[str, int, int | None] | None:
        for beat in self.heartbeats:
            prefix = os.path.basename(beat.get("fr_prefix") or "")
            if prefix and name.startswith(prefix):
                rank = name[len(prefix) :]
                return (
                    beat["job"],
                    int(beat.get("attempt") or 0),
                    (int(rank) if rank.isdigit() else None),
                )
        current = self.current_job()
        if current is None:
            return None
        m = TRAILING_NUMBER.search(name)
        return current[0], current[1], int(m.group(1)) if m else None

    def collect_dumps(self, now: float, *, final: bool = False) -> None:
        dirs = [self.run_dir / "fr", *map(Path, self.config.fr_dirs)]
        changed = False
        for entry, stamp in self._settled_files(dirs, now, final):
            where = self._job_of_dump(entry.name)
            if where is None:
                continue
            try:
                body = Path(entry.path).read_bytes()
            except OSError:
                continue
            job, attempt, rank = where
            header = records.upload_header(
                host=self.config.host,
                job=job,
                attempt=attempt,
                rank=rank,
                kind="fr_dump",
                filename=f"{entry.name}.gz",
            )
            self._put(header, gz(body))
            self.seen[entry.path] = stamp
            changed = True
        if changed:
            self.spool.save_extra("seen", self.seen)

    def collect_traces(self, now: float, *, final: bool = False) -> None:
        if not self.config.trace_dirs:
            return
        current = self.current_job()
        if current is None:
            return
        try:
            from ingest.parsers.trace import summarize_trace
        except ImportError:
            summarize_trace = None
        changed = False
        for entry, stamp in self._settled_files(self.config.trace_dirs, now, final):
            if not entry.name.endswith((".json", ".json.gz")):
                continue
            if self._ambiguous():
                break  # two jobs here: a trace names neither; taken when one is left
            m = RANK_IN_NAME.search(entry.name)
            rank = int(m.group(1)) if m else None
            body, filename = None, entry.name
            if summarize_trace is not None:
                try:
                    opener = gzip.open if entry.name.endswith(".gz") else open
                    with opener(entry.path, "rb") as stream:
                        summary = summarize_trace(stream)
                    # The summary is itself a valid `trace` artifact: the server's trace parser
                    # reads it exactly as it reads a raw trace.
                    body = json.dumps(summary, default=str).encode()
                    filename = entry.name.removesuffix(".gz") + ".summary.json"
                except Exception as exc:  # a summariser bug must not lose the trace
                    log.info("trace %s not summarised (%s): sending it whole", entry.name, exc)
            if body is None:
                raw = Path(entry.path).read_bytes()
                body = raw if raw[:2] == b"\x1f\x8b" else gz(raw)
                filename = entry.name if entry.name.endswith(".gz") else entry.name + ".gz"
            header = records.upload_header(
                host=self.config.host,
                job=current[0],
                attempt=current[1],
                rank=rank,
                kind="trace",
                filename=filename,
            )
            self._put(header, body)
            self.seen[entry.path] = stamp
            if filename.endswith(".summary.json"):
                self.summaries[filename] = {
                    "path": entry.path,
                    "job": str(current[0]),
                    "attempt": int(current[1]),
                    "rank": rank,
                }
            changed = True
        if changed:
            self.spool.save_extra("seen", self.seen)
            self._save_summaries()

    def _save_summaries(self) -> None:
        # Bounded: the newest 2,000 summaries (raw traces older than trace_keep_s are gone).
        if len(self.summaries) > 2000:
            self.summaries = dict(list(self.summaries.items())[-2000:])
        self.spool.save_extra("summaries", self.summaries)

    def answer_requests(self, now: float) -> None:
        """Send the raw trace the server asked for, once per request: the one behind the
        summary it names, for the same job, attempt and rank; then answer the request (``sent``
        or ``none``) so that the server closes it. A request not answered yet (the server was
        away) is answered on the next poll, without sending the file again."""
        if not self.config.trace_dirs or not self.config.server:
            return
        if now < getattr(self, "next_request_poll", 0.0):
            return
        self.next_request_poll = now + self.config.request_poll_s
        for request in self.uploader.artifact_requests(self.config.host):
            if request.get("kind") != "trace" or not isinstance(request.get("id"), int):
                continue
            if request["id"] in self.answered:
                self.uploader.answer_request(request["id"], "sent")
                continue
            path = self._requested_trace(request)
            if path is not None:
                raw = Path(path).read_bytes()
                body = raw if raw[:2] == b"\x1f\x8b" else gz(raw)
                name = Path(path).name
                header = records.upload_header(
                    host=self.config.host,
                    job=str(request["job"]),
                    attempt=int(request.get("attempt") or 0),
                    rank=request.get("rank"),
                    kind="trace",
                    filename=name if name.endswith(".gz") else name + ".gz",
                )
                self._put(header, body)
                self.answered = [*self.answered[-999:], request["id"]]
                self.spool.save_extra("answered", self.answered)
                log.info("sent %s for request %s", name, request["id"])
            outcome = "sent" if path is not None else "none"
            self.uploader.answer_request(request["id"], outcome)

    def _requested_trace(self, request: dict) -> str | None:
        """The raw trace a request asks for, or None: the summary it names must be one this
        agent sent for the same job, attempt and rank, and the raw file must still be here."""
        made = self.summaries.get(str(request.get("filename") or ""))
        if made is None:
            return None
        same = (
            made["job"] == str(request.get("job"))
            and made["attempt"] == int(request.get("attempt") or 0)
            and made["rank"] == request.get("rank")
        )
        return made["path"] if same and Path(made["path"]).is_file() else None

    def prune_traces(self, now: float) -> None:
        """Raw traces already summarised are kept locally for trace_keep_s, then removed."""
        if not self.config.trace_dirs:
            return
        wall = time.time()
        removed = False
        for path in list(self.seen):
            if not any(path.startswith(str(Path(d))) for d in self.config.trace_dirs):
                continue
            try:
                age = wall - Path(path).stat().st_mtime
            except FileNotFoundError:
                del self.seen[path]
                removed = True
                continue
            if age > self.config.trace_keep_s:
                Path(path).unlink(missing_ok=True)
                del self.seen[path]
                removed = True
        if removed:
            self.spool.save_extra("seen", self.seen)

    def collect_kernel(self) -> None:
        lines = self.kernel.read()
        if not lines:
            return
        body = ("\n".join(lines) + "\n").encode()
        for job, attempt in self.active_jobs():
            header = records.upload_header(
                host=self.config.host,
                job=job,
                attempt=attempt,
                rank=None,
                kind="log",
                filename="kernel.log.gz",
            )
            self._put(header, gz(body))

    def collect_stats(self, now: float) -> None:
        self.next_stats = now + self.config.stats_interval_s
        found = (
            self.nvml.read() + self.ib_ports.read() + self.host_stats.read() + self.kernel.status()
        )
        found.append(self.agent_record())
        stalls, self.pending_records = self.pending_records, []
        for job, attempt in self.active_jobs():
            mine = [r for r in stalls if (r.get("job"), r.get("attempt")) in ((job, attempt),)]
            doc = records.document(
                found + mine, host=self.config.host, job=job, attempt=attempt, now=now
            )
            header = records.upload_header(
                host=self.config.host,
                job=job,
                attempt=attempt,
                rank=None,
                kind="hw_stats",
                filename=f"hw_stats.{int(now)}.json",
            )
            self._put(header, records.encode(doc))

    def agent_record(self) -> dict:
        state = self.spool.state()
        items, size = self.spool.usage()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "type": "agent",
            "spool_items": items,
            "spool_bytes": size,
            "spool_dropped_items": state.dropped_items,
            "spool_dropped_bytes": state.dropped_bytes,
            "rejected": int(state.extra.get("rejected", 0)),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "max_rss_mb": round(usage.ru_maxrss / 1024, 1),
        }
