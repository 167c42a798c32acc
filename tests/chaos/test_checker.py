"""chaos.checker on hand-made histories: clean runs pass, each kind of anomaly is reported precisely."""
from __future__ import annotations

import json
import time

import pytest

from chaos.checker import ANOMALIES, check, longest_outage, percentile
from chaos.history import HistoryError, HistoryWriter, Op, pair_ops, read_history
from tests.chaos import MS, Hist, audit_block, clean_run, final_state


def only(verdict, kind):
    """The verdict is INVALID with exactly one anomaly, of ``kind``; return it."""
    assert not verdict.valid
    assert verdict.anomaly_counts == {kind: 1}, verdict.anomaly_counts
    return verdict.anomalies[kind][0]


# --------------------------------------------------------------------------- valid runs

def test_clean_history_is_valid():
    h, final = clean_run()
    v = check(h.ops, final)
    assert v.valid, v.anomalies
    assert v.anomaly_counts == {} and v.anomalies == {}
    assert v.stats["ok_blocks"] == 3 and v.stats["ok_pids"] == 9
    assert v.stats["committed_blocks"] == 3 and v.stats["committed_unacknowledged_blocks"] == 0
    assert v.faults["by_kind"] == {"kill-leader": {"count": 1, "failed": 0, "total_ms": 7.0}}
    json.dumps(v.to_dict())  # JSON-able as it is


def test_audit_blocks_from_several_nodes_are_deduplicated():
    h, final = clean_run()
    final["audit_blocks"] = final["audit_blocks"] * 3  # the same entries from three nodes' trails
    v = check(h.ops, final)
    assert v.valid and v.stats["committed_blocks"] == 3


def test_info_allocate_whose_block_was_committed_is_valid():
    h, final = clean_run()
    h.invoke("pidmgr-2", "allocate", {"broker_id": 2, "broker_epoch": 1})
    h.op("pidmgr-2", "info", "allocate", error="REQUEST_TIMED_OUT")
    final = final_state(40, final["audit_blocks"] + [audit_block(9, 2, 30, 10)])
    v = check(h.ops, final)
    assert v.valid, v.anomalies
    assert v.stats["committed_unacknowledged_blocks"] == 1
    assert v.availability["allocate"]["info"] == 1


def test_unfinished_allocate_whose_block_was_committed_is_valid():
    h, final = clean_run()
    h.invoke("pidmgr-2", "allocate", {"broker_id": 2, "broker_epoch": 1})  # the run ended first
    v = check(h.ops, final_state(40, final["audit_blocks"] + [audit_block(9, 2, 30, 10)]))
    assert v.valid and v.availability["allocate"]["unfinished"] == 1


def test_info_allocate_is_never_a_success_its_block_may_not_be_used():
    h, final = clean_run()
    h.invoke("pidmgr-2", "allocate", {"broker_id": 2, "broker_epoch": 1})
    h.op("pidmgr-2", "info", "allocate", error="REQUEST_TIMED_OUT")
    g = h.generate("pidmgr-2", 30)
    v = check(h.ops, final_state(40, final["audit_blocks"] + [audit_block(9, 2, 30, 10)]))
    a = only(v, "pid-outside-own-blocks")
    assert a["ops"] == [g.index] and a["pid"] == 30
    assert "committed at raft index 9 for broker 2 but acknowledged to no one" in a["message"]


def test_info_and_failed_generates_are_not_counted_as_issued():
    h, final = clean_run()
    h.invoke("pidmgr-1", "generate")
    h.op("pidmgr-1", "info", "generate", 2, error="REQUEST_TIMED_OUT")  # a value on info is not a PID issued
    h.invoke("pidmgr-1", "generate")
    h.op("pidmgr-1", "fail", "generate", 3, error="COORDINATOR_LOAD_IN_PROGRESS")
    v = check(h.ops, final)
    assert v.valid, v.anomalies
    assert v.stats["ok_pids"] == 9


# --------------------------------------------------------------------------- anomalies

def test_duplicate_pid_is_reported_with_both_ops():
    h, final = clean_run()
    first = next(o for o in h.ops if o.type == "ok" and o.f == "generate" and o.value == 2)
    dup = h.generate("pidmgr-1", 2)
    a = only(check(h.ops, final), "duplicate-pid")
    assert a["ops"] == [first.index, dup.index] and a["pid"] == 2
    assert a["message"] == f"PID 2 issued twice: op #{first.index} (pidmgr-1) and op #{dup.index} (pidmgr-1)"


def test_overlapping_blocks_are_reported_as_a_pair():
    h, final = clean_run()
    bad = h.allocate("pidmgr-2", 2, 25, 10)  # overlaps pidmgr-1's [20, 30)
    prev = next(o for o in h.ops if o.type == "ok" and o.f == "allocate" and o.value["start"] == 20)
    v = check(h.ops, final_state(35, final["audit_blocks"] + [audit_block(8, 2, 25, 10)]))
    assert v.anomaly_counts == {"overlapping-blocks": 1, "overlapping-committed-blocks": 1}
    a = v.anomalies["overlapping-blocks"][0]
    assert a["ops"] == [prev.index, bad.index] and a["processes"] == ["pidmgr-1", "pidmgr-2"]
    assert "[25, 30) issued twice" in a["message"]
    assert v.anomalies["overlapping-committed-blocks"][0]["raft_indexes"] == [7, 8]


def test_the_same_block_acknowledged_twice_is_an_overlap():
    h = Hist()
    a1 = h.allocate("pidmgr-1", 1, 0, 10)
    a2 = h.allocate("pidmgr-2", 2, 0, 10)
    v = check(h.ops, final_state(10, [audit_block(1, 1, 0, 10), audit_block(2, 2, 0, 10)]))
    assert v.anomalies["overlapping-blocks"][0]["ops"] == [a1.index, a2.index]
    assert v.anomaly_counts["overlapping-blocks"] == 1


def test_overlapping_committed_blocks_nobody_was_told_about_are_reported():
    h, final = clean_run()
    v = check(h.ops, final_state(30, final["audit_blocks"] + [audit_block(8, 3, 5, 10)]))
    assert v.anomaly_counts == {"overlapping-committed-blocks": 2}  # with [0, 10) and [10, 20)
    assert sorted(a["raft_indexes"] for a in v.anomalies["overlapping-committed-blocks"]) == [[3, 8], [4, 8]]


def test_block_above_a_nodes_final_next_id_is_lost():
    h, final = clean_run()
    last = [o for o in h.ops if o.type == "ok" and o.f == "allocate"][-1]
    v = check(h.ops, final_state({1: 30, 2: 30, 3: 25}, final["audit_blocks"]))
    assert v.anomaly_counts == {"block-above-next-id": 1, "committed-above-next-id": 1, "nodes-disagree": 1}
    a = v.anomalies["block-above-next-id"][0]
    assert a["ops"] == [last.index] and a["nodes"] == ["3"]
    assert a["message"] == f"op #{last.index}: pidmgr-1 got [20, 30), but next_producer_id is 25 on node 3"
    assert v.anomalies["committed-above-next-id"][0]["raft_index"] == 7


def test_block_missing_from_the_committed_log_is_lost():
    h, final = clean_run()
    last = [o for o in h.ops if o.type == "ok" and o.f == "allocate"][-1]
    a = only(check(h.ops, final_state(30, final["audit_blocks"][:2])), "block-not-committed")
    assert a["ops"] == [last.index] and a["block"]["start"] == 20
    assert "which no committed block holds" in a["message"]


def test_block_committed_for_another_broker_is_lost():
    h, final = clean_run()
    audit = final["audit_blocks"][:2] + [audit_block(7, 9, 20, 10)]
    a = only(check(h.ops, final_state(30, audit)), "block-not-committed")
    assert "that range was committed for broker 9" in a["message"]


def test_block_committed_with_another_epoch_is_reported():
    h, final = clean_run()
    audit = final["audit_blocks"][:2] + [audit_block(7, 1, 20, 10, epoch=5)]
    a = only(check(h.ops, final_state(30, audit)), "block-epoch-mismatch")
    assert a["committed_epoch"] == 5


def test_nodes_disagreeing_on_the_final_next_id():
    h, final = clean_run()
    a = only(check(h.ops, final_state({1: 30, 2: 40, 3: 30}, final["audit_blocks"])), "nodes-disagree")
    assert a["next_producer_id"] == {"1": 30, "2": 40, "3": 30}


def test_non_increasing_blocks_of_one_process():
    h = Hist()
    first = h.allocate("pidmgr-1", 1, 20, 10)
    second = h.allocate("pidmgr-1", 1, 0, 10)  # disjoint, but behind the first
    h.generate("pidmgr-1", 20)
    h.generate("pidmgr-1", 0)
    v = check(h.ops, final_state(30, [audit_block(2, 1, 20, 10), audit_block(1, 1, 0, 10)]))
    a = only(v, "non-increasing-blocks")
    assert a["ops"] == [first.index, second.index] and a["starts"] == [20, 0]


def test_increasing_blocks_are_per_process():
    h = Hist()
    h.allocate("pidmgr-1", 1, 20, 10)
    h.allocate("pidmgr-2", 2, 0, 10)  # lower than pidmgr-1's, but another process: fine
    assert check(h.ops, final_state(30, [audit_block(2, 1, 20, 10), audit_block(1, 2, 0, 10)])).valid


@pytest.mark.parametrize("pid, where", [
    (7, "which lies in [0, 10) acknowledged to pidmgr-1 at op #1"),
    (1000, "which lies in no known block"),
])
def test_pid_outside_its_own_processs_blocks(pid, where):
    h, final = clean_run()
    g = h.generate("pidmgr-2", pid)
    a = only(check(h.ops, final), "pid-outside-own-blocks")
    assert a["ops"] == [g.index] and a["process"] == "pidmgr-2"
    assert a["message"] == f"op #{g.index}: pidmgr-2 issued PID {pid}, {where}"


def test_pids_may_come_from_blocks_of_the_same_owner():
    # The workload's naming: a manager's refill task allocates, its clients generate.
    h = Hist()
    h.allocate("pidmgr-1/alloc", 1, 0, 10)
    h.allocate("pidmgr-2/alloc", 2, 10, 10)
    h.generate("pidmgr-1/client-0", 0)
    h.generate("pidmgr-1/client-1", 1)
    h.generate("pidmgr-2/client-0", 10)
    final = final_state(20, [audit_block(1, 1, 0, 10), audit_block(2, 2, 10, 10)])
    assert check(h.ops, final).valid
    g = h.generate("pidmgr-2/client-1", 2)  # pidmgr-1's ID
    a = only(check(h.ops, final), "pid-outside-own-blocks")
    assert a["ops"] == [g.index]
    assert a["message"].endswith("which lies in [0, 10) acknowledged to pidmgr-1/alloc at op #1")


def test_pid_from_a_process_with_no_blocks():
    h, final = clean_run()
    h.generate("broker-9", 3000)
    assert only(check(h.ops, final), "pid-outside-own-blocks")["process"] == "broker-9"


def test_every_anomaly_is_counted_but_only_the_first_examples_kept():
    h, final = clean_run()
    for _ in range(25):
        h.generate("pidmgr-1", 0)
    v = check(h.ops, final, max_examples=10)
    assert v.anomaly_counts == {"duplicate-pid": 25}
    assert len(v.anomalies["duplicate-pid"]) == 10
    assert set(ANOMALIES) >= set(v.anomaly_counts)


def test_check_refuses_a_broken_history_or_final_state():
    h, final = clean_run()
    with pytest.raises(HistoryError, match="no matching invoke"):
        check(h.ops + [Op("pidmgr-9", "ok", "generate", 1, 10 ** 9, index=len(h.ops))], final)
    with pytest.raises(HistoryError, match="final state: missing 'audit_blocks'"):
        check(h.ops, {"nodes": final["nodes"]})


def test_unanswered_or_unconverged_nodes_are_warnings():
    h, final = clean_run()
    del final["nodes"]["3"]
    final["missing_nodes"] = [3]
    final["converged"] = False
    v = check(h.ops, final)
    assert v.valid
    assert v.warnings == ["nodes 3 did not answer after the run: their final state was not checked",
                          "the nodes had not converged when the final state was taken"]


def test_reader_and_final_state_warnings_reach_the_verdict(tmp_path):
    h, final = clean_run()
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path) as w:
        for op in h.ops:
            w.append(op)
    with open(path, "ab") as f:
        f.write(b'{"index": 99, "ti')  # torn
    ops = read_history(path, allow_torn_tail=True)
    final["nodes"]["2"]["last_applied"] = 9
    v = check(ops, final)
    assert v.valid
    assert len(v.warnings) == 2
    assert "dropped a torn last line" in v.warnings[0]
    assert "node 2: 9" in v.warnings[1]


# --------------------------------------------------------------------------- availability

def availability_history() -> Hist:
    """The crafted history whose availability figures are worked out by hand below."""
    h = Hist()
    h.invoke("broker-1", "allocate", t_ms=0)
    h.invoke("broker-2", "allocate", t_ms=0.5)
    h.op("broker-1", "ok", "allocate", {"broker_id": 1, "broker_epoch": 1, "start": 0, "length": 10}, t_ms=1)
    h.op("broker-2", "fail", "allocate", error="NOT_CONTROLLER", t_ms=1.5)
    h.invoke("broker-2", "allocate", t_ms=1.6)
    h.op("broker-2", "ok", "allocate", {"broker_id": 2, "broker_epoch": 1, "start": 10, "length": 10}, t_ms=2.6)
    h.invoke("broker-1", "generate", t_ms=3)
    h.op("broker-1", "ok", "generate", 0, t_ms=5)
    h.invoke("broker-2", "generate", t_ms=6)
    h.invoke("nemesis", "kill-leader", {"node": 1}, t_ms=6.5)
    h.op("broker-2", "fail", "generate", error="COORDINATOR_LOAD_IN_PROGRESS", t_ms=7)
    h.invoke("broker-2", "generate", t_ms=8)
    h.op("broker-2", "fail", "generate", error="COORDINATOR_LOAD_IN_PROGRESS", t_ms=9)
    h.invoke("broker-1", "generate", t_ms=10)
    h.invoke("broker-2", "generate", t_ms=11)
    h.op("nemesis", "ok", "kill-leader", {"node": 1}, t_ms=12)
    h.op("broker-2", "ok", "generate", 10, t_ms=15)
    h.op("broker-1", "info", "generate", error="REQUEST_TIMED_OUT", t_ms=20)
    h.invoke("broker-2", "generate", t_ms=21)  # never completes
    h.invoke("nemesis", "pause-leader", {"node": 2}, t_ms=22)  # never healed before the end
    h.invoke("broker-3", "register", t_ms=25)  # the last event: the history ends at 25 ms
    return h


def test_availability_figures_match_a_hand_computation():
    h = availability_history()
    v = check(h.ops, final_state(20, [audit_block(1, 1, 0, 10), audit_block(2, 2, 10, 10)]))
    assert v.valid, v.anomalies
    g = v.availability["generate"]
    assert (g["invoked"], g["ok"], g["fail"], g["info"], g["unfinished"]) == (6, 2, 2, 1, 1)
    # ok latencies 2, 4 ms; all completed: 1, 1, 2, 4, 10 ms (nearest rank)
    assert g["latency"]["ok"] == {"count": 2, "p50_ms": 2.0, "p99_ms": 4.0, "max_ms": 4.0}
    assert g["latency"]["all"] == {"count": 5, "p50_ms": 2.0, "p99_ms": 10.0, "max_ms": 10.0}
    # Successes at 5 and 15 ms; after 15 ms an op is outstanding (timed out at 20), another from 21 to the end.
    assert g["longest_outage_ms"] == pytest.approx(10.0)
    assert g["longest_outage"] == pytest.approx({"start_ms": 15.0, "end_ms": 25.0})
    assert g["errors"] == {"COORDINATOR_LOAD_IN_PROGRESS": 2, "REQUEST_TIMED_OUT": 1}
    assert g["load_in_progress"] == 2 and g["load_in_progress_share"] == pytest.approx(2 / 6)
    assert g["client_visible_waits"] == 3

    a = v.availability["allocate"]
    assert (a["invoked"], a["ok"], a["fail"], a["info"], a["unfinished"]) == (3, 2, 1, 0, 0)
    assert a["latency"]["ok"] == pytest.approx({"count": 2, "p50_ms": 1.0, "p99_ms": 1.0, "max_ms": 1.0})
    # ok at 1 ms with broker-2's first attempt still out (failed at 1.5), retried, ok at 2.6 ms.
    assert a["longest_outage_ms"] == pytest.approx(1.6)
    assert a["longest_outage"] == pytest.approx({"start_ms": 1.0, "end_ms": 2.6})
    assert a["errors"] == {"NOT_CONTROLLER": 1} and a["load_in_progress"] == 0 and a["client_visible_waits"] == 1

    assert v.faults["by_kind"] == {"kill-leader": {"count": 1, "failed": 0, "total_ms": pytest.approx(5.5)},
                                   "pause-leader": {"count": 1, "failed": 0, "total_ms": pytest.approx(3.0)}}
    kill, pause = v.faults["intervals"]
    assert (kill["f"], kill["value"], kill["outcome"]) == ("kill-leader", {"node": 1}, "ok")
    assert (kill["start_ms"], kill["end_ms"]) == pytest.approx((6.5, 12.0))
    assert (pause["outcome"], pause["end_ms"], pause["completion_index"]) == ("unfinished", 25.0, None)


def test_outage_idle_time_between_sequential_successes_is_not_an_outage():
    h = Hist()
    h.invoke("c", "generate", t_ms=0)
    h.op("c", "ok", "generate", 1, t_ms=1)
    h.invoke("c", "generate", t_ms=100)  # 99 ms of nobody asking
    h.op("c", "ok", "generate", 2, t_ms=103)
    assert longest_outage(pair_ops(h.ops), 103 * MS) == (100 * MS, 103 * MS)


def test_outage_with_no_success_runs_to_the_last_event():
    h = Hist()
    h.invoke("c", "generate", t_ms=2)
    h.op("c", "fail", "generate", error="COORDINATOR_LOAD_IN_PROGRESS", t_ms=3)
    h.invoke("c", "generate", t_ms=9)
    h.op("c", "fail", "generate", error="COORDINATOR_LOAD_IN_PROGRESS", t_ms=10)
    assert longest_outage(pair_ops(h.ops), 50 * MS) == (2 * MS, 10 * MS)
    assert longest_outage([], 0) is None


def test_percentile_is_nearest_rank():
    xs = list(range(1, 101))
    assert [percentile(xs, q) for q in (1, 50, 99, 100)] == [1, 50, 99, 100]
    assert percentile([7], 99) == 7 and percentile([], 50) is None


# --------------------------------------------------------------------------- scale

def synthetic_run(n_pids: int, managers: int = 8, block: int = 1000):
    """``managers`` ProducerIdManagers taking turns, each generate 10 us, each allocate 2 ms."""
    ops: list[Op] = []
    audit = []
    t = 0
    nxt = 0
    per = n_pids // managers
    cur = [0] * managers
    left = [0] * managers
    append = ops.append
    for k in range(per):
        for m in range(managers):
            name = f"pidmgr-{m}"
            if left[m] == 0:
                append(Op(name, "invoke", "allocate", None, t, None, len(ops)))
                t += 2_000_000
                append(Op(name, "ok", "allocate", {"broker_id": m, "broker_epoch": 1, "start": nxt, "length": block},
                          t, None, len(ops)))
                audit.append(audit_block(len(audit) + 1, m, nxt, block))
                cur[m], left[m] = nxt, block
                nxt += block
            append(Op(name, "invoke", "generate", None, t, None, len(ops)))
            t += 10_000
            append(Op(name, "ok", "generate", cur[m], t, None, len(ops)))
            cur[m] += 1
            left[m] -= 1
    return ops, final_state(nxt, audit)


def test_a_million_pids_are_checked_in_seconds_and_a_late_duplicate_is_found():
    ops, final = synthetic_run(1_000_000)
    # One duplicate, at the very end, of the very first PID: found only if every PID is looked at.
    first = ops[3]
    ops.append(Op("pidmgr-0", "invoke", "generate", None, ops[-1].time_ns + 1, None, len(ops)))
    ops.append(Op("pidmgr-0", "ok", "generate", first.value, ops[-1].time_ns + 1, None, len(ops)))
    t0 = time.perf_counter()
    v = check(ops, final)
    elapsed = time.perf_counter() - t0
    print(f"\ncheck(): {len(ops):,} ops ({v.stats['ok_pids']:,} PIDs, {v.stats['ok_blocks']:,} blocks) "
          f"in {elapsed:.2f} s")
    assert v.anomaly_counts == {"duplicate-pid": 1}
    assert v.anomalies["duplicate-pid"][0]["ops"] == [first.index, len(ops) - 1]
    assert v.stats["ok_pids"] == 1_000_001 and v.stats["ok_blocks"] == 1000
    assert v.availability["generate"]["ok"] == 1_000_001
    assert v.availability["generate"]["latency"]["ok"]["p99_ms"] == pytest.approx(0.01)


def test_a_broken_allocator_handing_out_one_block_many_times_is_counted_quickly():
    # 3,000 processes all acknowledged [0, 1000): 4,498,500 overlapping pairs, counted, not listed.
    h = Hist()
    for p in range(3000):
        h.allocate(f"broker-{p}", p, 0, 1000)
    for p in range(3000):
        h.generate(f"broker-{p}", 5)
    v = check(h.ops, final_state(1000, [audit_block(1, 0, 0, 1000)]), max_examples=5)
    assert v.anomaly_counts["overlapping-blocks"] == 3000 * 2999 // 2
    assert v.anomaly_counts["duplicate-pid"] == 2999
    assert v.anomaly_counts["block-not-committed"] == 2999
    assert all(len(x) == 5 for x in v.anomalies.values())
