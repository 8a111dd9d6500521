"""The torch integration: one call at the top of a training script.

    from agents import torch as fleetwatch_torch
    fw = fleetwatch_torch.install()          # before init_process_group
    for epoch in range(epochs):
        fw.epoch_start(epoch, dataset=train_set, loader=train_loader)
        for batch in train_loader:
            ...
            fw.step()

What it does:

- sets the Flight Recorder environment before the process group exists (buffer size, dump on
  timeout, dump file, debug pipe), so NCCL jobs leave per-rank dumps when they time out and the
  agent can ask for one on demand through ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` (PyTorch opens
  ``<stem><rank>.pipe``; writing anything to it dumps to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``
  + rank). Gloo has a Flight Recorder but neither the pipe nor dump-on-timeout, so for gloo the
  integration serves the same pipe itself and dumps when a collective raises; on any backend it
  dumps when the launcher stops the rank with SIGTERM (then lets the signal through);
- ``step()`` records step times for the progress heartbeat the agent watches: two attribute
  writes and a deque append on the training thread, nothing else;
- ``epoch_start()`` records each rank's dataset length, steps per epoch and fingerprints of its
  data and sample order, so ranks that split data differently are caught at step 0;
- everything else (JSON, files, fsync) happens on one daemon thread fed by a queue: the
  training thread never waits for a disk.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import logging
import os
import queue
import re
import signal
import socket
import statistics
import sys
import threading
import time
from collections import deque
from pathlib import Path

from . import records
from .identity import Identity, job_env, job_identity, slug
from .spool import Spool, write_atomic

log = logging.getLogger("fleetwatch.torch")

DEFAULT_ROOT = Path(os.environ.get("FLEETWATCH_ROOT", "/var/tmp/fleetwatch"))  # noqa: S108
FR_BUFFER_SIZE = "2000"
HEARTBEAT_EVERY_S = 1.0
# Collectives whose failure on gloo triggers a Flight Recorder dump.
WRAPPED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "broadcast",
    "barrier",
    "reduce",
    "gather",
    "scatter",
    "all_to_all_single",
    "send",
    "recv",
)
FINGERPRINT_ITEMS = 16  # dataset items hashed when the dataset has no identity of its own
ORDER_PREFIX = 4096  # sample indices hashed per rank and epoch

_installed: Integration | None = None


def fr_environment(run_dir: Path, ident: Identity, torch_version: str = "") -> dict[str, str]:
    """The Flight Recorder settings for one job, keyed by the names the running PyTorch reads:
    the buffer size is ``TORCH_FR_BUFFER_SIZE`` since 2.6, and 2.13 warns on every rank when
    it is given the old ``TORCH_NCCL_TRACE_BUFFER_SIZE`` ("is deprecated; use
    TORCH_FR_BUFFER_SIZE instead"); older releases read only the old name."""
    stem = f"{slug(ident.job)}.{ident.attempt}.rank_"
    return {
        _buffer_variable(torch_version): FR_BUFFER_SIZE,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(run_dir / "fr" / stem),
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(run_dir / "pipes" / stem),
    }


def _buffer_variable(torch_version: str) -> str:
    parts = [int(p) for p in re.findall(r"\d+", torch_version)[:2]]
    return "TORCH_FR_BUFFER_SIZE" if parts >= [2, 6] else "TORCH_NCCL_TRACE_BUFFER_SIZE"


class Integration:
    def __init__(
        self,
        *,
        spool_dir: Path,
        run_dir: Path,
        ident: Identity,
        environ=None,
        heartbeat_every_s: float = HEARTBEAT_EVERY_S,
    ) -> None:
        self.environ = os.environ if environ is None else environ
        self.spool = Spool(spool_dir)
        self.run_dir = run_dir
        self.ident = ident
        self.heartbeat_every_s = heartbeat_every_s
        self.started_at = time.time()
        # The default process group's collective timeout once init_process_group ran: the agent
        # asks for a Flight Recorder dump of a silent rank before the watchdog fires at it.
        self.pg_timeout_s: float | None = None
        # Where this rank's stdout and stderr go (torchrun's redirects, the recipe's
        # `> logs/rank$RANK.log`): the agent attributes those files to this job and rank even
        # when two jobs write into one directory.
        self.outputs = _output_files()
        # Written by the training thread, read by the background thread: plain attributes and
        # a deque whose append and copy are each atomic under the GIL.
        self.steps = 0
        self._last_step = None  # perf_counter of the last step() call
        self._durations: deque[float] = deque(maxlen=256)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._dumped_for: set[str] = set()
        self._failed = False
        self._finished = False
        self.data_order: dict | None = None
        self.fr_prefix = self.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "")
        self.pipe_stem = self.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "")
        self._pipe_fd: int | None = None
        self._thread = threading.Thread(target=self._run, name="fleetwatch", daemon=True)

    # --- on the training thread: as little as possible -----------------------------------------

    def step(self) -> None:
        now = time.perf_counter()
        last = self._last_step
        if last is not None:
            self._durations.append(now - last)
        self._last_step = now
        self.steps += 1

    def epoch_start(self, epoch: int, dataset=None, *, loader=None, sampler=None, ids=None):
        """Record this rank's data for ``epoch``. Call after ``sampler.set_epoch(epoch)``.

        The dataset fingerprint must match across ranks (they should all start from the same
        data); ``steps`` must match too, or some rank will wait in a collective the others
        never run. The order fingerprint is per rank (a DistributedSampler shards on purpose)
        and is kept for the record."""
        if loader is not None:
            dataset = dataset if dataset is not None else getattr(loader, "dataset", None)
            sampler = sampler if sampler is not None else getattr(loader, "sampler", None)
        record = {
            "type": "data_order",
            "rank": self.ident.rank,
            "epoch": int(epoch),
            "world_size": self.ident.world_size,
            "dataset_len": _length(dataset),
            "steps": _length(loader) if loader is not None else _length(sampler),
            "dataset_fingerprint": dataset_fingerprint(dataset, ids),
            "order_fingerprint": order_fingerprint(sampler),
            "sampler": type(sampler).__name__ if sampler is not None else "",
            "seed": getattr(sampler, "seed", None),
        }
        self.data_order = record
        self._queue.put(("record", record, f"data_order.rank{self.ident.rank}.epoch{epoch}"))

    def record(self, record: dict, name: str = "record") -> None:
        """Queue any small record for upload (never blocks)."""
        self._queue.put(("record", record, name))

    # --- collective failures ---------------------------------------------------------------

    def collective_failed(self, op: str, exc: BaseException) -> None:
        """A collective raised on this rank: dump the Flight Recorder where PyTorch does not
        (gloo), once per failure, and queue a record of the error."""
        if self._failed:
            return
        self._failed = True
        self._queue.put(
            (
                "record",
                {
                    "type": "collective_failure",
                    "rank": self.ident.rank,
                    "op": op,
                    "error": f"{type(exc).__name__}: {exc}"[:2000],
                    "step": self.steps,
                },
                f"collective_failure.rank{self.ident.rank}",
            )
        )
        if self._backend() != "nccl":
            self.dump_flight_recorder("collective_failure")

    def dump_flight_recorder(self, reason: str) -> Path | None:
        if not self.fr_prefix or self.ident.rank is None:
            return None
        try:
            from torch._C._distributed_c10d import _dump_fr_trace_json
        except ImportError:
            return None
        try:
            payload = _dump_fr_trace_json(True, False)
        except Exception as exc:  # the recorder is best-effort evidence, never a new failure
            log.warning("fleetwatch: Flight Recorder dump failed: %s", exc)
            return None
        path = Path(f"{self.fr_prefix}{self.ident.rank}")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, payload)
        log.warning("fleetwatch: Flight Recorder dumped to %s (%s)", path, reason)
        return path

    def _backend(self) -> str:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return str(dist.get_backend())
        except Exception:  # no process group yet or a torch without distributed
            return ""
        return ""

    # --- the background thread -------------------------------------------------------------

    def start(self) -> Integration:
        (self.run_dir / "progress").mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def heartbeat_path(self) -> Path:
        i = self.ident
        return self.run_dir / "progress" / f"{slug(i.job)}.{i.attempt}.{i.rank}.json"

    def heartbeat(self) -> dict:
        durations = self._durations.copy()
        last = self._last_step
        now = time.time()
        median = statistics.median(durations) if durations else None
        return {
            **self.ident.to_dict(),
            "pid": os.getpid(),
            "backend": self._backend(),
            "steps": self.steps,
            "last_step_at": now - (time.perf_counter() - last) if last is not None else None,
            "median_step_s": median,
            "recent_step_s": list(durations)[-16:],
            "started_at": self.started_at,
            "pg_timeout_s": self.pg_timeout_s,
            "outputs": self.outputs,
            "updated_at": now,
            "finished": self._finished,
            "failed": self._failed,
            "fr_prefix": self.fr_prefix,
            "pipe_stem": self.pipe_stem,
            "data_order": self.data_order,
        }

    def _write_heartbeat(self) -> None:
        # Ephemeral and rewritten every second: atomic but not fsynced.
        write_atomic(self.heartbeat_path(), records.encode(self.heartbeat()), durable=False)

    def _run(self) -> None:
        written_steps = -1
        last_write = 0.0
        while not self._stop.is_set():
            self._drain_queue()
            self._serve_pipe()
            now = time.monotonic()
            if self.steps != written_steps or now - last_write > 10 * self.heartbeat_every_s:
                try:
                    self._write_heartbeat()
                    written_steps, last_write = self.steps, now
                except OSError as exc:
                    log.debug("fleetwatch: heartbeat not written: %s", exc)
            self._stop.wait(self.heartbeat_every_s)

    def _drain_queue(self) -> None:
        batch: list[tuple[dict, str]] = []
        while True:
            try:
                what, record, name = self._queue.get_nowait()
            except queue.Empty:
                break
            if what == "record":
                batch.append((record, name))
            elif what == "attempt":
                self._spool_attempt(record)
        for record, name in batch:
            self._spool_record(record, name)

    def _spool_record(self, record: dict, name: str) -> None:
        i = self.ident
        doc = records.document([record], host=i.host, job=i.job, attempt=i.attempt, rank=i.rank)
        header = records.upload_header(
            host=i.host,
            job=i.job,
            attempt=i.attempt,
            rank=i.rank,
            kind="hw_stats",
            filename=f"{name}.json",
        )
        try:
            self.spool.put(header, records.encode(doc))
        except OSError as exc:
            log.warning("fleetwatch: could not spool %s: %s", name, exc)

    def _spool_attempt(self, report: dict) -> None:
        try:
            self.spool.put(records.attempt_header(), records.encode(report))
        except OSError as exc:
            log.warning("fleetwatch: could not spool the attempt report: %s", exc)

    def _serve_pipe(self) -> None:
        """For gloo, serve the NCCL-style debug pipe: any write asks for a dump."""
        if not self.pipe_stem or self.ident.rank is None:
            return
        if self._pipe_fd is None:
            backend = self._backend()
            if backend in ("", "nccl"):
                return  # not started yet, or ProcessGroupNCCL serves the pipe itself
            path = f"{self.pipe_stem}{self.ident.rank}.pipe"
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                if os.path.exists(path):
                    os.unlink(path)
                os.mkfifo(path, 0o666)
                self._pipe_fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as exc:
                log.debug("fleetwatch: no debug pipe: %s", exc)
                self.pipe_stem = ""
                return
        try:
            asked = os.read(self._pipe_fd, 128)
        except BlockingIOError:
            asked = b""
        if asked:
            self.dump_flight_recorder("asked through the debug pipe")

    # --- start and end of the attempt ------------------------------------------------------

    def report_attempt(self, event: str, status: str = "") -> None:
        i = self.ident
        report = {
            "job": i.job,
            "attempt": i.attempt,
            "event": event,
            "host": i.host,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if i.rank is not None:
            report["ranks"] = [i.rank]
        if i.world_size:
            report["world_size"] = i.world_size
        if i.job_name:
            report["job_name"] = i.job_name
        if event == "start":
            report["config"] = job_env(self.environ)
            report["versions"] = _versions()
        else:
            report["status"] = status
        self._queue.put(("attempt", report, "attempt"))

    def finish(self, status: str | None = None) -> None:
        """Mark the attempt ended (atexit does this) and flush what is queued."""
        if self._finished:
            return
        self._finished = True
        if status is None:
            status = "failed" if self._failed else "succeeded"
        self.report_attempt("end", status)
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._drain_queue()
        with contextlib.suppress(OSError):
            self._write_heartbeat()


def _length(thing) -> int | None:
    try:
        return len(thing) if thing is not None else None
    except TypeError:
        return None


def dataset_fingerprint(dataset, ids=None) -> str:
    """What the rank's data is, so that ranks can be compared. Hugging Face datasets carry a
    ``_fingerprint`` that changes with every transform (a split with another seed included);
    otherwise the caller's sample ids, otherwise a few items spread over the dataset."""
    digest = hashlib.sha256()
    if ids is not None:
        for sample_id in ids:
            digest.update(repr(sample_id).encode()[:256])
        return digest.hexdigest()[:16]
    if dataset is None:
        return ""
    own = getattr(dataset, "_fingerprint", None)
    if isinstance(own, str) and own:
        return own[:32]
    n = _length(dataset)
    digest.update(str(n).encode())
    if n:
        picks = sorted({(k * (n - 1)) // max(1, FINGERPRINT_ITEMS - 1) for k in range(16)})
        for index in picks:
            try:
                item = dataset[index]
            except Exception:  # an iterable-only dataset: its length is all we can compare
                break
            digest.update(_item_bytes(item))
    return digest.hexdigest()[:16]


def _item_bytes(item) -> bytes:
    numpy = getattr(item, "numpy", None)
    if callable(numpy) and hasattr(item, "shape"):
        try:
            return numpy().tobytes()[:4096]
        except Exception:  # a tensor on a device or of an odd type: its repr will do
            return repr(item).encode()[:4096]
    if isinstance(item, tuple | list):
        return b"|".join(_item_bytes(x) for x in item)
    return repr(item).encode()[:4096]


def order_fingerprint(sampler) -> str:
    """A hash of the first sample indices this rank will visit this epoch."""
    if sampler is None:
        return ""
    digest = hashlib.sha256()
    try:
        for count, index in enumerate(iter(sampler)):
            if count >= ORDER_PREFIX:
                break
            digest.update(repr(index).encode())
    except TypeError:
        return ""
    return digest.hexdigest()[:16]


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    try:
        import torch

        out["torch"] = torch.__version__
        if torch.version.cuda:
            out["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:  # versions are a nicety; a broken CUDA must not stop training
        log.debug("fleetwatch: versions incomplete: %s", exc)
    return out


def _wrap_collectives(integration: Integration) -> None:
    import torch.distributed as dist

    for name in WRAPPED:
        original = getattr(dist, name, None)
        if original is None or getattr(original, "_fleetwatch", False):
            continue

        def make(fn, op):
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                try:
                    return fn(*args, **kwargs)
                except Exception as exc:
                    integration.collective_failed(op, exc)
                    raise

            wrapper._fleetwatch = True
            return wrapper

        setattr(dist, name, make(original, name))


def _output_files() -> list[str]:
    out = []
    for fd in (1, 2):
        try:
            path = os.path.realpath(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if os.path.isfile(path) and path not in out:
            out.append(path)
    return out


def _watch_init(integration: Integration) -> None:
    """Record the timeout the job's default process group runs with (its ``timeout=`` or the
    backend's default, torch.distributed.constants: 10 min for NCCL where the constant exists,
    else 30 min)."""
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_fleetwatch", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        integration.pg_timeout_s = _pg_timeout_s(kwargs.get("timeout"), kwargs, args)
        return result

    init_process_group._fleetwatch = True
    dist.init_process_group = init_process_group


def _pg_timeout_s(timeout, kwargs: dict, args: tuple) -> float | None:
    if timeout is not None:
        return timeout.total_seconds()
    from torch.distributed import constants

    backend = str(kwargs.get("backend") or (args[0] if args else "")).lower()
    default = getattr(constants, "default_pg_nccl_timeout", None) if "nccl" in backend else None
    default = default or constants.default_pg_timeout
    return default.total_seconds() if default is not None else None


def _hook_exceptions(integration: Integration) -> None:
    previous = sys.excepthook

    def hook(kind, value, tb):
        # A collective failure raised inside DDP's C++ reducer never passes the wrappers.
        text = f"{kind.__name__} {value}"
        if any(w in text for w in ("DistBackendError", "gloo", "NCCL", "Timed out", "timeout")):
            integration.collective_failed("unknown", value)
        else:
            integration._failed = True
        integration.finish("failed")
        previous(kind, value, tb)

    sys.excepthook = hook


def _write_stack(frame, stream) -> None:
    """Where the main thread was when a signal stopped it, innermost frame first, in
    faulthandler's format (``Current thread 0x… (most recent call first):`` then ``  File "…",
    line N in func``), which the log parser reads as the rank's stack: a rank the others waited
    for shows what it was waiting on itself (its next batch, a write, a sleep)."""
    lines = [f"Current thread 0x{threading.get_ident():016x} (most recent call first):"]
    depth = 0
    while frame is not None and depth < 40:
        code = frame.f_code
        lines.append(f'  File "{code.co_filename}", line {frame.f_lineno} in {code.co_name}')
        frame, depth = frame.f_back, depth + 1
    with contextlib.suppress(OSError, ValueError):  # a closed or broken stderr: nothing to say
        stream.write("\n".join(lines) + "\n")
        stream.flush()


def _hook_sigterm(integration: Integration) -> None:
    """torchrun stops the surviving workers of a failed attempt with SIGTERM and kills them only
    after a grace period (torch/distributed/elastic/multiprocessing/api.py: ``close`` sends
    ``death_sig`` SIGTERM, then SIGKILL after ``timeout``); Slurm's scancel and time limit do the
    same. The rank the others waited for is among those workers, and its Flight Recorder and its
    stack are the evidence of where it was: write them, then let the signal do what it did
    before."""
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; the pipe and exceptions still dump
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        # The launcher signals the whole process group, so the DataLoader's workers die too, and
        # its SIGCHLD handler would raise "DataLoader worker ... killed by signal" in the middle
        # of this: a teardown artifact that reads as a data-loader failure. The rank is going
        # away; its children's deaths are no news.
        if hasattr(signal, "SIGCHLD"):
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        _write_stack(frame, sys.stderr)
        integration.dump_flight_recorder("SIGTERM")
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, handler)


def install(
    *,
    spool_dir: str | Path | None = None,
    run_dir: str | Path | None = None,
    environ=None,
    heartbeat_every_s: float = HEARTBEAT_EVERY_S,
) -> Integration:
    """Call once, before ``init_process_group``. Returns the integration (also kept as the
    module's ``current()``); a second call returns the first."""
    global _installed
    if _installed is not None:
        return _installed
    environ = os.environ if environ is None else environ
    spool_dir = Path(spool_dir or environ.get("FLEETWATCH_SPOOL_DIR") or DEFAULT_ROOT / "spool")
    run_dir = Path(run_dir or environ.get("FLEETWATCH_RUN_DIR") or DEFAULT_ROOT / "run")
    ident = job_identity(environ, environ.get("FLEETWATCH_HOST") or socket.gethostname())
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            log.warning(
                "fleetwatch.install() ran after init_process_group: Flight Recorder settings "
                "apply to process groups created from now on only"
            )
    except ImportError:
        dist = None
    torch_version = getattr(sys.modules.get("torch"), "__version__", "")
    for key, value in fr_environment(run_dir, ident, str(torch_version)).items():
        environ.setdefault(key, value)  # the job's own settings win
    (run_dir / "fr").mkdir(parents=True, exist_ok=True)
    integration = Integration(
        spool_dir=spool_dir,
        run_dir=run_dir,
        ident=ident,
        environ=environ,
        heartbeat_every_s=heartbeat_every_s,
    )
    if dist is not None:
        _wrap_collectives(integration)
        _watch_init(integration)
    _hook_exceptions(integration)
    _hook_sigterm(integration)
    integration.report_attempt("start")
    integration.start()
    atexit.register(integration.finish)
    _installed = integration
    return integration


def current() -> Integration | None:
    return _installed


def step() -> None:
    if _installed is not None:
        _installed.step()


def epoch_start(epoch: int, dataset=None, **kwargs) -> None:
    if _installed is not None:
        _installed.epoch_start(epoch, dataset, **kwargs)
