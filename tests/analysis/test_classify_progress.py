"""The diagnosis core on progress alone: who the timed-out ranks were waiting for."""

from analysis.classify import IncidentContext, classify
from ingest.parsers import parse_log

PG = "[PG ID 0 PG GUID 0(default_pg) Rank {r}]"


def timeout(rank: int, seq: int, enq: int, done: int) -> str:
    return (
        f"[rank{rank}]:[E1121 03:12:44.1 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught "
        f"collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=8, "
        f"NumelOut=8, Timeout(ms)=600000) ran for 600031 milliseconds before timing out.\n"
        f"[rank{rank}]:[E1121 03:12:44.1 ProcessGroupNCCL.cpp:2168] {PG.format(r=rank)}  failure "
        f"detected by watchdog at work sequence id: {seq} PG status: last enqueued work: {enq}, "
        f"last completed work: {done}\n"
    )


def dump_from_peer(rank: int, enq: int, done: int) -> str:
    return (
        f"[rank{rank}]:[E1121 03:12:45.1 ProcessGroupNCCL.cpp:1987] {PG.format(r=rank)} Received "
        f"a dump signal due to a collective timeout from  rank 0 and we will try our best to dump "
        f"the debug info. Last enqueued NCCL work: {enq}, last completed NCCL work: {done}.\n"
    )


def events(*texts: str):
    out = []
    for n, text in enumerate(texts):
        out.extend(parse_log(text.encode(), source=f"rank{n}.log").events)
    return out


def suspect_ranks(verdict) -> list[str]:
    return [s.id for s in verdict.suspects if s.kind == "rank"]


def test_the_rank_that_never_enqueued_the_collective_is_the_suspect():
    verdict = classify(
        events(timeout(0, 100, 101, 99), timeout(1, 100, 100, 99), dump_from_peer(2, 99, 99))
    )
    assert suspect_ranks(verdict) == ["2"]
    assert verdict.failed
    assert any(e.signal == "lagging_rank" and e.file == "rank2.log" for e in verdict.evidence)


def test_the_suspect_host_is_named_when_placement_is_known():
    verdict = classify(
        events(timeout(0, 100, 100, 99), dump_from_peer(1, 99, 99)),
        IncidentContext(rank_hosts={0: "gpu-a", 1: "gpu-b"}),
    )
    assert ("host", "gpu-b") in [(s.kind, s.id) for s in verdict.suspects]


def test_a_rank_whose_own_log_has_no_timeout_is_the_suspect():
    verdict = classify(
        events(timeout(1, 19, 19, 18), timeout(2, 19, 19, 18), timeout(3, 19, 19, 18)),
        IncidentContext(ranks_uploaded=frozenset({0, 1, 2, 3})),
    )
    assert suspect_ranks(verdict) == ["0"]
    assert "not waiting in the collective" in verdict.suspects[0].why


def test_ranks_that_all_agree_give_no_suspect_and_an_honest_unknown():
    verdict = classify(events(timeout(0, 7, 7, 6), timeout(1, 7, 7, 6)))
    assert suspect_ranks(verdict) == []
    assert verdict.culprit == "unknown"
    assert verdict.confidence == 0.0
    assert "ALLREDUCE SeqNum 7 timed out after 600 s on rank 0, 1" in verdict.summary


def test_no_timeout_means_no_failure():
    verdict = classify(events("step 1 loss 2.0\n"))
    assert not verdict.failed


def test_every_verdict_carries_the_ruleset_version():
    from analysis.classify import RULESET_VERSION

    assert classify([]).ruleset_version == RULESET_VERSION
