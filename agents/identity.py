"""Who a job is and where its ranks run, from the scheduler's environment.

Order of trust: ``FLEETWATCH_JOB`` (set by whoever launches the job), then Slurm, then
torchelastic, then Kubernetes. The attempt is the scheduler's restart count.
"""

from __future__ import annotations

import re
import socket
from dataclasses import asdict, dataclass

# The job's environment worth keeping: NCCL and PyTorch knobs, and the few others that change
# how collectives behave. Keys with these words are secrets and never leave the host.
ENV_PREFIXES = ("NCCL_", "TORCH_", "TORCHELASTIC_", "CUDA_", "OMP_", "PYTORCH_", "MASTER_", "GLOO_")
SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
JOB_ID = re.compile(r"[^\w.:@+/=-]")


@dataclass(frozen=True)
class Identity:
    job: str
    attempt: int = 0
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    node_rank: int | None = None
    scheduler: str = "none"
    job_name: str = ""
    host: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _int(environ, *names: str) -> int | None:
    for name in names:
        value = environ.get(name, "")
        if value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def clean_job_id(raw: str) -> str:
    """What the API accepts as a job id (``[\\w.:@+/=-]{1,255}``)."""
    return JOB_ID.sub("_", raw.strip())[:255] or "unknown"


def job_identity(environ, host: str = "") -> Identity:
    host = host or environ.get("FLEETWATCH_HOST") or socket.gethostname()
    rank = _int(environ, "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
    local_rank = _int(environ, "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
    world = _int(environ, "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
    node_rank = _int(environ, "GROUP_RANK", "NODE_RANK", "SLURM_NODEID")
    attempt = _int(environ, "FLEETWATCH_ATTEMPT")
    common = {"rank": rank, "local_rank": local_rank, "world_size": world, "node_rank": node_rank}
    if environ.get("FLEETWATCH_JOB"):
        return Identity(
            clean_job_id(environ["FLEETWATCH_JOB"]),
            attempt or _int(environ, "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT") or 0,
            scheduler="fleetwatch",
            job_name=environ.get("FLEETWATCH_JOB_NAME", ""),
            host=host,
            **common,
        )
    if environ.get("SLURM_JOB_ID"):
        job = environ.get("SLURM_ARRAY_JOB_ID")
        job = f"{job}_{environ['SLURM_ARRAY_TASK_ID']}" if job else environ["SLURM_JOB_ID"]
        return Identity(
            clean_job_id(f"slurm:{job}"),
            attempt if attempt is not None else _int(environ, "SLURM_RESTART_COUNT") or 0,
            scheduler="slurm",
            job_name=environ.get("SLURM_JOB_NAME", ""),
            host=host,
            **common,
        )
    run_id = environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return Identity(
            clean_job_id(f"elastic:{run_id}"),
            attempt if attempt is not None else _int(environ, "TORCHELASTIC_RESTART_COUNT") or 0,
            scheduler="torchelastic",
            host=host,
            **common,
        )
    if environ.get("KUBERNETES_SERVICE_HOST"):
        # Kubeflow's PyTorchJob names pods <job>-master-0 / <job>-worker-N; a batch Job's pods
        # are <job>-<hash>. The downward API can say it outright through FLEETWATCH_JOB.
        pod = environ.get("POD_NAME") or environ.get("HOSTNAME", "")
        job = environ.get("JOB_NAME") or re.sub(r"-(master|worker)-\d+$|-[a-z0-9]{5}$", "", pod)
        namespace = environ.get("POD_NAMESPACE", "default")
        return Identity(
            clean_job_id(f"k8s:{namespace}/{job}"),
            attempt or _int(environ, "TORCHELASTIC_RESTART_COUNT") or 0,
            scheduler="kubernetes",
            job_name=job,
            host=host,
            **common,
        )
    return Identity(
        clean_job_id(f"local:{host}"), attempt or 0, scheduler="none", host=host, **common
    )


def job_env(environ) -> dict[str, str]:
    """The job's NCCL/TORCH settings, secrets left out, values capped for the API."""
    out = {}
    for key in sorted(environ):
        if key.startswith(ENV_PREFIXES) and not SECRET.search(key):
            out[key[:100]] = str(environ[key])[:500]
        if len(out) >= 150:
            break
    return out


def slug(text: str) -> str:
    """A file-name-safe form of a job id."""
    return re.sub(r"[^\w.-]", "_", text)[:120]
