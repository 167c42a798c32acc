"""librdkafka's own test suite (tests/test-runner of a librdkafka source tree built by hand, v2.0.2) against a
pidquorum broker: a fresh three-node quorum and one broker process in a temporary directory, the runner's
test.conf pointing at it, one runner invocation per test, one line per test.

    python -m benchmarks.librdkafka_suite --librdkafka /tmp/librdkafka-2.0.2 [--tests 0001,0034,...]
                                          [--json out.json] [--jobs 1] [--timeout 300] [--quick] [--local]
                                          [--list] [--keep]

How to build librdkafka for it, the out-of-scope list and the last results: docs/librdkafka-suite.md.
The test list comes from the runner's own table (tests/test.c); this module holds what is out of scope and
why (``OUT_OF_SCOPE``), decided per test from its source, not from whether it passes.  Nothing here is
imported by the test suite's fixtures; tests/benchmarks/test_librdkafka_suite.py checks the pure parts
(table parsing, selection, the runner's output, the line format) without librdkafka.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter

# The broker version the runner is told (TEST_KAFKA_VERSION): the broker serves Metadata v12, Fetch v12,
# Produce v10 (Kafka 3.x), and 3.1.0 is the newest version this librdkafka's tests/Makefile names.
KAFKA_VERSION = "3.1.0"
# The broker flags the tests need, per librdkafka test scenario (tests/scenarios/*.json: num_partitions 4,
# auto_create_topics true / false), and Kafka's default initial rebalance delay, as trivup's brokers have
# it: tests such as 0113's l_unsubscribe expect two consumers subscribing together to land in one
# rebalance (one assign call each), which a delay of 0 splits in two.
BROKER_FLAGS = {
    "default": ["--partitions", "4", "--auto-create-topics", "--group-initial-rebalance-delay-ms", "3000"],
    "noautocreate": ["--partitions", "4", "--no-auto-create-topics", "--group-initial-rebalance-delay-ms", "3000"],
}
# Seconds one runner invocation may take before the harness kills it (the runner has its own per-test timeouts).
DEFAULT_TIMEOUT_S = 600.0
# Test timeouts are multiplied by this (test.conf's test.timeout.multiplier): a Python broker is slower than
# a JVM one on the first requests of a topic.
TIMEOUT_MULTIPLIER = 2

KAFKA_CLI = "runs Kafka's own tools (kafka-topics.sh / kafka-acls.sh / a Java client from KAFKA_PATH), not a broker API"
RF3 = ("creates its topic with replication factor 3 (trivup's three brokers): one broker answers "
       "INVALID_REPLICATION_FACTOR, as Kafka; scenario noautocreate")
OUT_OF_SCOPE: dict[str, str] = {
    # librdkafka's mock cluster (no broker involved)
    "0009_mock_cluster": "librdkafka's mock cluster (rd_kafka_mock)",
    "0034_offset_reset_mock": "librdkafka's mock cluster (rd_kafka_mock)",
    "0045_subscribe_update_mock": "librdkafka's mock cluster (rd_kafka_mock)",
    "0104_fetch_from_follower_mock": "librdkafka's mock cluster (rd_kafka_mock)",
    "0105_transactions_mock": "librdkafka's mock cluster (rd_kafka_mock)",
    "0106_cgrp_sess_timeout": "librdkafka's mock cluster (rd_kafka_mock)",
    "0113_cooperative_rebalance_local": "librdkafka's mock cluster (rd_kafka_mock)",
    "0116_kafkaconsumer_close": "librdkafka's mock cluster (rd_kafka_mock)",
    "0117_mock_errors": "librdkafka's mock cluster (rd_kafka_mock)",
    "0120_asymmetric_subscription": "librdkafka's mock cluster (rd_kafka_mock)",
    "0121_clusterid": "librdkafka's mock cluster (rd_kafka_mock)",
    "0138_admin_mock": "librdkafka's mock cluster (rd_kafka_mock)",
    # several brokers / replicas
    "0101_fetch_from_follower": "fetch from a follower replica (KIP-392): a topic with replication factor 3 "
                                "over three racks, client.rack, DescribeConfigs of broker.rack",
    "0107_topic_recreate": RF3,
    "0111_delay_create_topics": RF3,
    # features the broker does not serve and the issue does not name
    "0077_compaction": "log compaction (cleanup.policy=compact, segment.ms via CreateTopics configs)",
    "0052_msg_timestamps": "creates its topics with kafka-topics.sh --config message.timestamp.type=LogAppendTime "
                           "(KAFKA_PATH); the broker has no per-topic timestamp type",
    "0092_mixed_msgver": "AlterConfigs (message.format.version=0.10.0.0 on a topic) and MsgVersion 1 batches",
    "0045_subscribe_update_topic_remove": KAFKA_CLI + " (kafka-topics.sh --delete), scenario noautocreate",
    "0045_subscribe_update_non_exist_and_partchange": KAFKA_CLI + " (kafka-topics.sh --alter --partitions)",
    "0098_consumer_txn": KAFKA_CLI + " (TransactionProducerCli via KAFKA_PATH) and RapidJSON (not built)",
    "0109_auto_create_topics": KAFKA_CLI + " (kafka-acls.sh, for any broker version >= 2.1 on plaintext)",
    "0115_producer_auth": KAFKA_CLI + " (kafka-acls.sh); topic ACLs",
    "0119_consumer_auth": KAFKA_CLI + " (kafka-acls.sh); topic ACLs",
    "0016_client_swname": "reads the client software name from the broker's JMX metrics (KAFKA_PATH, "
                          "BROKER_JMX_PORT_2): a Kafka JVM's, not a protocol answer",
    "0097_ssl_verify": "SSL listener",
    "0126_oauthbearer_oidc": "SASL/OAUTHBEARER with an OIDC token endpoint",
    "0135_sasl_credentials": "SASL (sasl.username/password on a SASL listener)",
}
# Tests whose in-scope part is run as slices (SUBTESTS=<substring> each, one line each): the rest of the
# test calls APIs out of scope and would stop it at the first of them.
SLICE_REASONS = {
    "0081_admin": "its other sub-tests call CreateAcls/DescribeAcls/DeleteAcls, AlterConfigs, DeleteRecords and "
                  "DeleteConsumerGroupOffsets (OffsetDelete); AlterConsumerGroupOffsets and ListConsumerGroupOffsets "
                  "are OffsetCommit and OffsetFetch",
    "0113_cooperative_rebalance": "o_java_interop runs Kafka's IncrementalRebalanceCli (Java, KAFKA_PATH)",
    "0103_transactions": "its other sub-tests create their topics with replication factor 3 (trivup's three "
                         "brokers; one broker answers INVALID_REPLICATION_FACTOR, as Kafka), and "
                         "do_test_fatal_idempo_error_without_kip360 calls DeleteRecords",
}
SUBTEST_SLICES: dict[str, tuple[str, ...]] = {
    "0081_admin": ("unclean_destroy", "do_test_CreateTopics", "do_test_DeleteTopics", "do_test_CreatePartitions",
                   "do_test_DescribeConfigs", "do_test_ListConsumerGroups", "do_test_DescribeConsumerGroups",
                   "do_test_DeleteGroups", "do_test_AlterConsumerGroupOffsets",
                   "do_test_ListConsumerGroupOffsets"),
    "0103_transactions": ("do_test_misuse_txn", "do_test_fenced_txn"),
    "0113_cooperative_rebalance": (
        "a_assign_tests", "b_subscribe_with_cb_test", "c_subscribe_no_cb_test", "d_change_subscription_add_topic",
        "e_change_subscription_remove_topic", "f_assign_call_cooperative", "g_incremental_assign_call_eager",
        "h_delete_topic", "i_delete_topic_2", "j_delete_topic_no_rb_callback", "k_add_partition", "l_unsubscribe",
        "m_unsubscribe_2", "n_wildcard", "s_subscribe_when_rebalancing", "t_max_poll_interval_exceeded",
        "u_multiple_subscription_changes", "v_commit_during_rebalance", "x_incremental_rebalances"),
}
# What an in-scope test exercises besides produce/fetch/metadata: groups the report by broker feature.
NOTES: dict[str, str] = {
    "0028_long_topicnames": "TEST_F_KNOWN_ISSUE in librdkafka (#529): a 255-byte topic name, above Kafka's limit "
                            "of 249",
    "0047_partial_buf_tmout": "TEST_F_KNOWN_ISSUE in librdkafka: produces until a 300 ms message timeout hits",
}

STATES = ("PASSED", "FAILED", "SKIPPED", "OUT-OF-SCOPE")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|\x1b\(B")
_SUMMARY_ROW = re.compile(r"^\|\s*(\S+)\s*\|\s*(PASSED|FAILED|SKIPPED|RUNNING|DNS)\s*\|\s*([\d.]+)s\s*\|\s?(.*)$")
_FAILED_AT = re.compile(r'^### Test "([^"]*)" failed at (\S+) at .*: ###$')


@dataclasses.dataclass(frozen=True)
class TestEntry:
    """One entry of the runner's table (tests/test.c ``tests[]``)."""
    name: str
    flags: str = "0"
    scenario: str = "default"

    @property
    def number(self) -> str:
        return self.name.split("_", 1)[0]

    @property
    def local(self) -> bool:
        return "TEST_F_LOCAL" in self.flags

    @property
    def known_issue(self) -> bool:
        """Marked TEST_F_KNOWN_ISSUE (on every platform): the runner skips it unless given -k."""
        return "TEST_F_KNOWN_ISSUE" in re.split(r"[\s|]+", self.flags)

    @property
    def manual(self) -> bool:
        return "TEST_F_MANUAL" in self.flags


def parse_test_table(test_c: str) -> list[TestEntry]:
    """The tests of the runner's ``struct test tests[]`` in test.c's source, in order (flags and scenario)."""
    start = test_c.index("struct test tests[] = {")
    table = test_c[start:test_c.index("{NULL}", start)]
    table = re.sub(r"/\*.*?\*/", "", table, flags=re.S)
    out = []
    for m in re.finditer(r"_TEST\((\d{4}_\w+),(.*?)\)\s*,\s*(?=_TEST\(|#|$)", table, re.S):
        rest = m.group(2)
        scen = re.search(r'\.scenario\s*=\s*"([^"]+)"', rest)
        out.append(TestEntry(m.group(1), rest.split(",")[0].strip() or "0", scen.group(1) if scen else "default"))
    return out


def category(t: TestEntry) -> tuple[str, str]:
    """(``in-scope`` | ``local`` | ``out-of-scope`` | ``manual``, reason)."""
    if t.name in OUT_OF_SCOPE:
        return "out-of-scope", OUT_OF_SCOPE[t.name]
    if t.manual:
        return "manual", "TEST_F_MANUAL (run by hand only)"
    if t.local:
        return "local", "TEST_F_LOCAL: no broker (the runner's -l set)"
    return "in-scope", NOTES.get(t.name, "")


def select(entries: list[TestEntry], wanted: list[str] | None = None, local: bool = False) -> list[TestEntry]:
    """The tests to run: those matching ``wanted`` (numbers or names, e.g. ``0001`` or ``0034_offset_reset``)
    whatever their category (the caller reports the out-of-scope ones as such), else every in-scope test
    (plus the local ones with ``local``)."""
    if wanted:
        chosen = [t for t in entries if any(t.name == w or t.number == w for w in wanted)]
        unknown = [w for w in wanted if not any(t.name == w or t.number == w for t in entries)]
        if unknown:
            raise ValueError(f"unknown tests: {', '.join(unknown)}")
        return chosen
    keep = {"in-scope", "local"} if local else {"in-scope"}
    return [t for t in entries if category(t)[0] in keep]


@dataclasses.dataclass
class Result:
    """One line of the report."""
    name: str
    state: str  # one of STATES
    seconds: float = 0.0
    reason: str = ""
    broker_log: list[str] = dataclasses.field(default_factory=list)  # the broker's error lines meanwhile

    @property
    def number(self) -> str:
        return self.name.split("_", 1)[0]

    def line(self) -> str:
        """``NNNN name STATE  12.3s  reason``: one line, the reason's first line only."""
        name = self.name.split("_", 1)[1] if "_" in self.name else self.name
        text = f"{self.number} {name:<44} {self.state:<12} {self.seconds:7.1f}s"
        reason = self.reason.strip().splitlines()[0] if self.reason.strip() else ""
        return f"{text}  {reason}".rstrip() if reason else text


def parse_runner_output(text: str) -> dict[str, tuple[str, float, str]]:
    """The runner's summary table (and its first failure lines): test name -> (state, seconds, reason).

    A row's reason is the test's ``failstr`` (its first failure or skip reason); a test that failed with
    no reason in the table takes the message under its first ``### Test "..." failed at ...`` header."""
    text = _ANSI.sub("", text)
    rows: dict[str, tuple[str, float, str]] = {}
    first_failure: dict[str, str] = {}
    lines = text.splitlines()
    for i, raw in enumerate(lines):
        line = raw.strip()
        m = _FAILED_AT.match(line)
        if m:
            test = m.group(1).split(" (", 1)[0]
            msg = lines[i + 1].strip() if i + 1 < len(lines) else ""
            first_failure.setdefault(test, short_reason(f"{m.group(2)}: {msg}".strip()))
            continue
        m = _SUMMARY_ROW.match(line)
        if m and m.group(1) not in ("<MAIN>",) and re.match(r"\d{4}_", m.group(1)):
            reason = short_reason(m.group(4).rstrip("| ").strip())
            rows[m.group(1)] = (m.group(2), float(m.group(3)), reason)
    for name, (state, secs, reason) in list(rows.items()):
        if state == "FAILED" and not reason and name in first_failure:
            rows[name] = (state, secs, first_failure[name])
    for name, reason in first_failure.items():  # aborted before its summary (<MAIN> is not a test)
        if re.match(r"\d{4}_", name):
            rows.setdefault(name, ("FAILED", 0.0, reason))
    return rows


def subtest_started(text: str, subtest: str) -> bool:
    """Whether the runner started a sub-test whose name holds ``subtest`` (its ``[ name:line ... ]`` line): a
    SUBTESTS filter that matches nothing leaves its test PASSED with nothing run."""
    return re.search(r"\] \[ [^\]]*" + re.escape(subtest), _ANSI.sub("", text)) is not None


def short_reason(reason: str) -> str:
    """A runner failure reason without the asserted C expression (its message says what went wrong)."""
    return re.sub(r'Test assertion failed: ".*?": ', "assertion failed: ", reason, count=1)


def merge_slices(name: str, parts: list[Result]) -> Result:
    """One line for a test run as slices: FAILED if a slice failed (naming it), PASSED if one passed and none
    failed, else SKIPPED."""
    failed = [p for p in parts if p.state == "FAILED"]
    state = "FAILED" if failed else "PASSED" if any(p.state == "PASSED" for p in parts) else "SKIPPED"
    reason = "; ".join(f"[{p.name.split('/', 1)[1]}] {p.reason.strip().splitlines()[0] if p.reason.strip() else ''}"
                       for p in failed)
    return Result(name, state, sum(p.seconds for p in parts), reason,
                  [x for p in parts for x in p.broker_log][:20])


def summary(results: list[Result]) -> str:
    counts = Counter(r.state for r in results)
    return "summary: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in STATES) + f" ({len(results)} tests)"


def scope_table() -> str:
    """The out-of-scope tests and the sliced ones as a Markdown table (docs/librdkafka-suite.md holds it)."""
    rows = ["| test | scope | reason |", "|---|---|---|"]
    rows += [f"| {name} | out of scope | {reason} |" for name, reason in sorted(OUT_OF_SCOPE.items())]
    rows += [f"| {name} | only the sub-tests {', '.join(slices)} | {SLICE_REASONS[name]} |"
             for name, slices in sorted(SUBTEST_SLICES.items())]
    return "\n".join(rows) + "\n"


def write_test_conf(path: str, bootstrap: str) -> None:
    """The runner's test.conf (RDKAFKA_TEST_CONF): the broker, the timeout multiplier."""
    with open(path, "w") as f:
        f.write(f"bootstrap.servers={bootstrap}\n"
                f"test.timeout.multiplier={TIMEOUT_MULTIPLIER}\n")


# ------------------------------------------------------------------ running (needs librdkafka and processes)
def broker_error_lines(text: str, limit: int = 12) -> list[str]:
    """The broker log lines that show a request it refused or could not serve (distinct, in order)."""
    seen, out = set(), []
    for line in text.splitlines():
        if not re.search(r" -> [A-Z_]+:|answered [A-Z_]+|Traceback|ERROR|unsupported|not supported|unknown api",
                         line, re.I):
            continue
        key = re.sub(r"client \S+|\d+\.\d+\.\d+\.\d+:\d+|^\S+ \S+", "", line)
        if key not in seen:
            seen.add(key)
            out.append(line.strip())
        if len(out) >= limit:
            break
    return out


class Runner:
    """Runs one test (or slice) with the runner against a broker, its output kept in ``logs``."""

    def __init__(self, librdkafka: str, logs: str, quick: bool, timeout: float, debug: str | None = None):
        self.tests_dir = os.path.join(librdkafka, "tests")
        self.binary = os.path.join(self.tests_dir, "test-runner")
        self.logs, self.quick, self.timeout, self.debug = logs, quick, timeout, debug

    def run(self, t: TestEntry, conf: str, broker_log: str, subtests: str | None = None) -> Result:
        label = t.name + (f"/{subtests}" if subtests else "")
        env = {**os.environ, "TESTS": t.number, "RDKAFKA_TEST_CONF": conf, "TEST_KAFKA_VERSION": KAFKA_VERSION}
        libs = [os.path.join(self.tests_dir, "..", d) for d in ("src", "src-cpp")]  # as run-test.sh: this build's
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, *filter(None, [os.environ.get("LD_LIBRARY_PATH")])])
        env.pop("TESTS_SKIP", None)
        env.pop("SUBTESTS", None)
        if subtests:
            env["SUBTESTS"] = subtests
        if self.debug:
            env["TEST_DEBUG"] = self.debug
        args = [self.binary, "-p1", "-l" if t.local else "-L"]
        if self.quick:
            args.append("-Q")
        if t.known_issue:
            args.append("-k")
        if t.scenario != "default":
            args += ["-s", t.scenario.split(",")[0]]
        out_path = os.path.join(self.logs, label.replace("/", "__") + ".log")
        start_size = os.path.getsize(broker_log) if os.path.exists(broker_log) else 0
        t0 = time.monotonic()
        with open(out_path, "w") as out:
            proc = subprocess.Popen(args, cwd=self.tests_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                rc = proc.wait(self.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)  # the runner's own process group (start_new_session): ours
                proc.wait(10)
                rc = None
        secs = time.monotonic() - t0
        with open(out_path, errors="replace") as f:
            text = f.read()
        with open(broker_log, errors="replace") as f:
            f.seek(start_size)
            # the broker names each request's client id (the test's name, as the runner sets client.id):
            # lines of tests running alongside are left out
            blog = broker_error_lines("\n".join(x for x in f.read().splitlines() if t.name in x))
        rows = parse_runner_output(text)
        if t.name in rows:
            state, runner_secs, reason = rows[t.name]
            state = {"RUNNING": "FAILED", "DNS": "SKIPPED"}.get(state, state)
            if state == "FAILED" and not reason:
                reason = "failed (no reason printed; see " + out_path + ")"
            if rc is None:
                state, reason = "FAILED", f"killed by the harness after {self.timeout:.0f}s; {reason}"
            elif subtests and state == "PASSED" and not subtest_started(text, subtests):
                state, reason = "SKIPPED", f"no sub-test matched {subtests!r} (nothing ran)"
            return Result(label, state, runner_secs or secs, reason, blog)
        tail = [x for x in _ANSI.sub("", text).splitlines() if x.strip()][-1:] or ["(no output)"]
        why = (f"killed by the harness after {self.timeout:.0f}s" if rc is None
               else f"runner exited with {rc} before its summary")
        return Result(label, "FAILED", secs, f"{why}: {tail[0].strip()}", blog)


def run_selection(args, chosen: list[TestEntry], emit) -> list[Result]:
    """Start the quorum, then per scenario a broker, and run the chosen tests against it; ``emit`` gets each
    Result as it is known.  Everything started here is stopped here, by PID."""
    from .common import temp_cluster
    from .processes import BrokerProcess

    runner = Runner(args.librdkafka, args.logs, args.quick, args.timeout, args.debug)
    results: list[Result] = []
    todo = []
    for t in chosen:
        cat, reason = category(t)
        if cat in ("out-of-scope", "manual"):
            r = Result(t.name, "OUT-OF-SCOPE", 0.0, reason)
            results.append(r)
            emit(r)
        else:
            todo.append(t)
    if not todo:
        return results
    scenarios = sorted({("default" if t.local else t.scenario.split(",")[0]) for t in todo},
                       key=lambda s: s != "default")
    with temp_cluster("librdkafka-suite-", args.keep, "librdkafka-suite", subdir="cluster") as (lc, directory):
        for n, scen in enumerate(scenarios, start=1):
            flags = BROKER_FLAGS[scen]
            broker = BrokerProcess(directory, n, lc.client_addresses(), *flags).start()
            print(f"# broker {n} ({scen}): {broker.bootstrap} {' '.join(flags)}; log {broker.log_path}",
                  file=sys.stderr, flush=True)
            conf = os.path.join(args.logs, f"test-{scen}.conf")
            write_test_conf(conf, broker.bootstrap)
            try:
                batch = [t for t in todo if ("default" if t.local else t.scenario.split(",")[0]) == scen]
                results += _run_batch(runner, batch, conf, broker.log_path, args.jobs, emit, args.subtests)
            finally:
                broker.stop()
                shutil.copy(broker.log_path, os.path.join(args.logs, f"broker-{scen}.log"))
    return results


def _run_batch(runner: Runner, batch: list[TestEntry], conf: str, broker_log: str, jobs: int, emit,
               subtests: str | None = None) -> list[Result]:
    """Every invocation (a test, or one slice of it) goes to the pool on its own; the lines come out in the
    table's order, a sliced test's merged line after its slices."""
    work = [(t, tuple(subtests.split(",")) if subtests else SUBTEST_SLICES.get(t.name)) for t in batch]
    out: list[Result] = []
    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        futures = [(t, [pool.submit(runner.run, t, conf, broker_log, s) for s in slices] if slices
                    else [pool.submit(runner.run, t, conf, broker_log)], bool(slices)) for t, slices in work]
        for t, fs, sliced in futures:
            rs = [f.result() for f in fs]
            if sliced:
                rs.append(merge_slices(t.name, rs))
            for r in rs:
                emit(r)
            out += rs
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.librdkafka_suite", description=__doc__.split("\n\n")[0])
    ap.add_argument("--librdkafka", help="librdkafka source tree with tests/test-runner built")
    ap.add_argument("--tests", help="comma-separated numbers or names (default: every in-scope test)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--jobs", type=int, default=1, help="runner invocations at once (default 1)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per runner invocation")
    ap.add_argument("--quick", action="store_true",
                    help="the runner's quick mode (-Q): fewer messages, and every sub-test not marked quick is "
                         "skipped while its test still reports PASSED")
    ap.add_argument("--local", action="store_true", help="also the broker-less tests (-l set)")
    ap.add_argument("--subtests", help="comma-separated sub-test substrings to run (SUBTESTS), in place of the "
                                       "table's slices (to look into one failure)")
    ap.add_argument("--debug", help="librdkafka debug contexts for every client (TEST_DEBUG), e.g. cgrp,protocol")
    ap.add_argument("--list", action="store_true", help="print the tests with their category, run nothing")
    ap.add_argument("--logs", help="directory for the runner's and the broker's logs (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the quorum's and broker's directory")
    ap.add_argument("--scope-table", action="store_true", help="print the out-of-scope table (Markdown), run nothing")
    args = ap.parse_args(argv)
    if args.scope_table:
        print(scope_table(), end="")
        return 0
    if not args.librdkafka:
        ap.error("--librdkafka is required")
    test_c = os.path.join(args.librdkafka, "tests", "test.c")
    if not os.path.exists(test_c):
        ap.error(f"{test_c} not found: --librdkafka is a librdkafka source tree")
    entries = parse_test_table(open(test_c).read())
    if args.list:
        for t in entries:
            cat, reason = category(t)
            print(f"{t.name:<52} {cat:<13} {reason}")
        return 0
    if not os.access(os.path.join(args.librdkafka, "tests", "test-runner"), os.X_OK):
        ap.error("tests/test-runner not built (make -C tests build)")
    try:
        chosen = select(entries, [w.strip() for w in args.tests.split(",") if w.strip()] if args.tests else None,
                        args.local)
    except ValueError as e:
        ap.error(str(e))
    args.logs = args.logs or tempfile.mkdtemp(prefix="librdkafka-suite-logs-")
    os.makedirs(args.logs, exist_ok=True)
    print(f"# librdkafka {args.librdkafka}, {len(chosen)} tests, logs in {args.logs}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    results = run_selection(args, chosen, lambda r: print(r.line(), flush=True))
    # a test run as slices: its merged line counts, its slices are details
    counted = [r for r in results if "/" not in r.name]
    print(summary(counted) + f" in {time.monotonic() - t0:.0f}s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"librdkafka": args.librdkafka, "kafka_version": KAFKA_VERSION, "quick": args.quick,
                       "logs": args.logs, "summary": dict(Counter(r.state for r in counted)),
                       "results": [dataclasses.asdict(r) for r in results]}, f, indent=1)
    return 1 if any(r.state == "FAILED" for r in counted) else 0


if __name__ == "__main__":
    sys.exit(main())
