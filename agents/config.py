"""Agent configuration: a TOML or INI file, then ``FLEETWATCH_*`` environment variables.

Every field can be set in the file (``[agent]`` table/section, or top level in TOML) and
overridden by ``FLEETWATCH_<FIELD>`` (``FLEETWATCH_SERVER``, ``FLEETWATCH_LOGS``…). Lists are
TOML arrays, or comma-separated in INI files and the environment. Bad values fail loudly at
start, never silently half-way through a job.
"""

from __future__ import annotations

import configparser
import dataclasses
import os
import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ENV_PREFIX = "FLEETWATCH_"
# /var/tmp survives reboots (evidence of a crash must); the directories are created 0750.
DEFAULT_ROOT = Path("/var/tmp/fleetwatch")  # noqa: S108


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class AgentConfig:
    server: str = ""  # base URL, e.g. https://fleetwatch.example.com
    key: str = ""  # an upload-scoped key (or key_file)
    key_file: str = ""
    # A read-scoped key for `fleetwatch-agent check` (the host's verdict); else the key above.
    read_key_file: str = ""
    host: str = field(default_factory=socket.gethostname)
    spool_dir: str = str(DEFAULT_ROOT / "spool")
    # Where the torch integration writes heartbeats, Flight Recorder dumps and dump pipes.
    run_dir: str = str(DEFAULT_ROOT / "run")
    spool_max_bytes: int = 256 << 20
    spool_max_items: int = 10_000
    job: str = ""  # job id for files that do not name one (else the running job's)
    attempt: int = 0
    logs: tuple[str, ...] = ()  # files and globs to follow
    # Regex over a log path with optional named groups job, attempt and rank.
    log_path_pattern: str = ""
    fr_dirs: tuple[str, ...] = ()  # Flight Recorder dump directories beyond run_dir/fr
    trace_dirs: tuple[str, ...] = ()  # profiler trace directories
    trace_keep_s: float = 7 * 24 * 3600.0  # raw traces kept on the host this long
    request_poll_s: float = 60.0  # ask the server this often which kept artifacts it wants
    kernel_logs: tuple[str, ...] = ("/dev/kmsg",)  # /dev/kmsg or dmesg output files
    ib_sysfs: str = "/sys/class/infiniband"  # InfiniBand/RoCE port counters
    poll_s: float = 1.0
    stats_interval_s: float = 60.0
    log_flush_s: float = 10.0  # ship followed log lines at least this often
    chunk_bytes: int = 4 << 20  # and at most this many bytes per upload
    stall_factor: float = 10.0  # heartbeat silent for this × median step time: dump FR
    stall_min_s: float = 30.0  # … and never sooner than this
    backoff_base_s: float = 1.0
    backoff_max_s: float = 300.0
    request_timeout_s: float = 30.0
    nice: int = 10
    io_idle: bool = True  # idle I/O scheduling class where the kernel supports it

    def api_key(self) -> str:
        if self.key:
            return self.key
        if self.key_file:
            return Path(self.key_file).read_text().strip()
        return ""


def _coerce(name: str, kind, raw):
    try:
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
        if kind == "tuple[str, ...]":
            if isinstance(raw, list | tuple):
                return tuple(str(x) for x in raw)
            return tuple(p.strip() for p in str(raw).split(",") if p.strip())
        return str(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {raw!r} is not a valid {kind}") from None


def _types() -> dict[str, object]:
    hints = {"int": int, "float": float, "bool": bool, "str": str}
    return {f.name: hints.get(f.type, f.type) for f in dataclasses.fields(AgentConfig)}


def _read_file(path: Path) -> dict:
    text = path.read_text()
    if path.suffix in (".ini", ".cfg", ".conf"):
        parser = configparser.ConfigParser(interpolation=None)
        parser.read_string(text)
        return dict(parser["agent"]) if parser.has_section("agent") else {}
    try:
        parsed = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return dict(parsed.get("agent", parsed))


def load_config(
    path: str | Path | None = None, environ: dict[str, str] | None = None, **overrides
) -> AgentConfig:
    environ = os.environ if environ is None else environ
    types = _types()
    values: dict = {}
    path = path or environ.get(ENV_PREFIX + "CONFIG")
    if path:
        for name, raw in _read_file(Path(path)).items():
            if name not in types:
                raise ConfigError(f"{path}: unknown setting {name!r}")
            values[name] = _coerce(name, types[name], raw)
    for name, kind in types.items():
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = _coerce(name, kind, raw)
    values.update({k: v for k, v in overrides.items() if v is not None})
    config = AgentConfig(**values)
    if config.server and not config.server.startswith(("http://", "https://")):
        raise ConfigError(f"server: {config.server!r} must start with http:// or https://")
    if config.spool_max_bytes < 1 << 16 or config.spool_max_items < 1:
        raise ConfigError("spool_max_bytes must be at least 64 KiB and spool_max_items >= 1")
    return config
