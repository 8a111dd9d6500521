"""Two stories behind rules written this session (a data-preparation bar placing an old-era
watchdog wait; NCCL failing to allocate its buffers), each told several ways and with near
misses by a helper blind to the rules (blind_stories/README.md). Scored before anything was
changed: 9 of 10; the miss (NCCL's numbered "Cuda failure 2 'out of memory'") was a parser gap,
fixed. A third story (a build without the GPU's architecture, gpu_arch_build-*) scored 5 of 6
before anything changed; the miss (torchrun's crash table outranking the error that explained
the crash) became the build_mismatch rule's rank. A fourth (a full disk, disk_full-*) scored 5 of
6 before anything changed; the miss (torch.save's writer error, which names no errno) became part
of the disk_full rule. A fifth (DataLoader workers outnumbering the host's CPUs, loader_cores-*)
scored 4 of 8 before anything changed; the misses were ways of printing the worker count, the
processes per host and the CPUs that were not read, and a silent rank read as a desync. A sixth
(a GPU's PCIe link correcting errors faster than NVIDIA's limit, pcie_link-*) scored 6 of 8
before anything changed; the misses were the watchdog's group-local "[Rank N]" read as global
ranks (a desync by absence) and an NFS stall that had answered again within seconds. A seventh
(GPU Xid faults and their look-alikes, gpu_xid-*) scored 6 of 8 before anything changed: a host
OOM kill made classification fail outright, and an Xid from before the node's reboot was read as
this job's. An eighth (jobs that ended cleanly among alarming lines, healthy_noisy-*) scored 8
of 8. A ninth (a rank that crashed, rank_crash-*) scored 5 of 8 before anything changed: a
segfault's dump of a helper thread (pin_memory) read as the rank waiting on data, DeepSpeed's
launcher exit code (-9) not read and its srun task ids taken for ranks (a desync by absence), and
a recovered OOM (still missed). A tenth (the network, net_transport-*) scored 6 of 8: srun task
ids taken for ranks when the watchdog named higher ones, and a bootstrap connect that ran out of
retries (ncclRemoteError) not read as the bootstrap failing. An eleventh (one rank working alone
while the others wait, lone_work-*) scored 4 of 8: work mid-training (a decode, a faiss k-means,
a checkpoint conversion) reported as timestamped lines rather than a bar was not read, nor placed
beside a training step's collective; and a pdsh host prefix was taken for a bar's description. A
twelfth (storage stalling one rank, storage_stall-*) scored 6 of 8 before anything changed: a
backup's rsync hung on NFS taken for the job's stall (only the job's own processes count now).
A thirteenth (ranks on other code paths, code_paths-*) scored 5 of 8: DDP's "Expected to have
finished reduction" (a rank's forward skipped parameters) was read as a plain crash; it is a
knowledge-base entry naming its cause now. A fourteenth (stalled input pipelines, loader_stall-*)
scored 3 of 8, two of the misses wrong names: step lines in the ImageNet example's meters and in
pipes not read (a data-starved rank taken for a desync), pdsh's host prefix hiding tracebacks,
mp.spawn's report of a watchdog abort taken for a crash, py-spy dumps of a num_workers=0
process or of a pid not tied to their rank. A fifteenth (one process still preparing at start-up,
startup_prep-*) scored 5 of 8: a unit-scaled bar ("2.01M/6.18M") not read (a desync named
instead) and transformers' "convert squad examples to features" not known as preparation.
A sixteenth (a parallel or launch layout that does not fit, layout-*) scored 5 of 8: layout
checks that stop every rank at start-up (torchtitan's "Invalid parallel dims", Megatron's
ensure_divisibility) were no failure at all; they are knowledge-base entries naming their cause
now."""

import json
from pathlib import Path

import pytest

from fleet.cli import diagnose

ROOT = Path(__file__).resolve().parent / "blind_stories"
CASES = sorted(p for p in ROOT.iterdir() if (p / "expected.json").exists())

# case -> the culprit it gets today, where that is not what the story says: measured, not
# wished. Fixing one (or breaking a right case) fails until this table is updated.
KNOWN_MISSES: dict[str, str] = {
    # NCCL on sockets between nodes because the container has no libibverbs, every rank timing
    # out alike: a multi-node socket transport is only a lead (DESIGN case 5's red herring), and
    # nothing in the logs says the hosts had InfiniBand to use. An abstention, not a wrong name.
    "net_transport-a": "unknown",
    # A CUDA OOM the trainer recovered from (it skipped the batch) hours before an unrelated
    # timeout: the recovery shows only as its own progress lines ("Epoch 3, batch 12300"), which
    # are not read as steps, so the OOM is taken for the cause.
    "rank_crash-f": "oom_or_crash",
    # Rank 0 generates validation videos alone mid-training: eight 50-step bars of ~90 s each
    # with no description and no timestamps. No one bar approaches the 600 s timeout, and bars
    # are kept per description (the furthest state), so their sum is not known.
    "lone_work-d": "unknown",
    # A checkpoint save to a gcsfuse mount that never returns: the evidence is a py-spy dump of
    # an unnamed process (pid only) inside safetensors' save_file, and earlier saves that took
    # ~100 s. Nothing ties the pid to the lagging rank, and a save in progress is as much a big
    # save outlasting the timeout as a stalled mount.
    "storage_stall-e": "unknown",
    # PyTorch 1.8's watchdog lines name no SeqNum: rank 0's BROADCAST and rank 2's ALLREDUCE
    # cannot be placed at one call site, so their difference proves no other code path.
    "code_paths-a": "unknown",
    # Same SeqNum, same op, different sizes (3 against 9,441,792): the watchdog_op_mismatch rule
    # fires, but its calibration on dev (named once, on a case whose thread found no cause)
    # keeps it below naming.
    "code_paths-c": "unknown",
    # Megatron builds its dataset indices on rank 0 at start-up and says so only in its own INFO
    # lines ("Build and save the GPTDataset train indices"), with no times and no bar: nothing
    # read shows that work still running when the barrier at SeqNum 8 expired.
    "startup_prep-f": "unknown",
    # A DeepSpeed pipeline whose SEND/RECV time out at different SeqNums, all on the default
    # group: point-to-point pairs keep their own order per pair, so seqs of one group differ
    # between pairs in a healthy schedule too; only several groups out of step are read.
    "layout-f": "unknown",
}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_story_told_blind_gets_its_verdict_and_a_near_miss_does_not(case):
    expected = json.loads((case / "expected.json").read_text())
    verdict = diagnose([str(p) for p in sorted(case.glob("*.log"))], jobs=1)
    if case.name in KNOWN_MISSES:
        assert verdict.culprit == KNOWN_MISSES[case.name], verdict.summary
        return
    if "culprit" in expected:
        assert verdict.culprit == expected["culprit"], verdict.summary
    else:
        assert verdict.culprit != expected["not"], verdict.summary
