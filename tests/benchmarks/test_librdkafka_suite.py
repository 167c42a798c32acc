"""``benchmarks.librdkafka_suite``'s pure parts, without librdkafka (CI has none): the runner's test table
read from test.c's source, which tests are in scope, the runner's output (saved samples of librdkafka
v2.0.2's test-runner), and the one-line format."""
from __future__ import annotations

import os
import re

import pytest

from benchmarks import librdkafka_suite as suite

# An excerpt of librdkafka v2.0.2's tests/test.c table (entries spanning lines, comments, #if, .scenario).
TEST_C = r"""
struct test tests[] = {
    /* Special MAIN test to hold over-all timings, etc. */
    {.name = "<MAIN>", .flags = TEST_F_LOCAL},
    _TEST(0000_unittests,
          TEST_F_LOCAL,
          /* The msgq insert order tests are heavy on
           * user CPU (memory scan), RSS, and
           * system CPU (lots of allocations -> madvise(2)). */
          _THRES(.ucpu = 100.0, .scpu = 20.0, .rss = 900.0)),
    _TEST(0001_multiobj, 0),
    _TEST(0009_mock_cluster,
          TEST_F_LOCAL,
          /* Mock cluster requires MsgVersion 2 */
          TEST_BRKVER(0, 11, 0, 0)),
    _TEST(0028_long_topicnames,
          TEST_F_KNOWN_ISSUE,
          TEST_BRKVER(0, 9, 0, 0),
          .extra = "https://github.com/edenhill/librdkafka/issues/529"),
    _TEST(0034_offset_reset, 0),
    _TEST(0034_offset_reset_mock, TEST_F_LOCAL),
    _TEST(0055_producer_latency, TEST_F_KNOWN_ISSUE_WIN32),
#if WITH_SOCKEM
    _TEST(0049_consume_conn_close, TEST_F_SOCKEM, TEST_BRKVER(0, 9, 0, 0)),
#endif
    _TEST(0081_admin, 0, TEST_BRKVER(0, 10, 2, 0)),
    _TEST(0103_transactions,
          0,
          TEST_BRKVER(0, 11, 0, 0),
          .scenario = "default,ak23"),
    _TEST(0107_topic_recreate,
          0,
          TEST_BRKVER_TOPIC_ADMINAPI,
          .scenario = "noautocreate"),

    /* Manual tests */
    _TEST(8000_idle, TEST_F_MANUAL),

    {NULL}};
"""

# The end of a passing run (colours as the runner prints them).
PASSED_OUT = (
    "\x1b[0m\x1b[36m[0005_order                  /  0.008s] \x1b[32m================= Test 0005_order PASSED "
    "=================\x1b[0m\n"
    "============== ALL TESTS PASSED ==============\n"
    "\x1b[0mTEST 20261129095753 (bare, scenario default) SUMMARY\n"
    "#==================================================================#\n"
    "|\x1b[32m <MAIN>                                   |     PASSED |   0.200s \x1b[0m|\n"
    "|\x1b[32m 0005_order                               |     PASSED |   2.508s \x1b[0m|\n"
    "#==================================================================#\n")

# A failure the runner aborts on (its <MAIN> then finds threads left and asserts): no summary table.
ABORTED_OUT = (
    "[0011_produce_batch          /  0.026s] CreateTopics: duration 0.554ms\n"
    "[0011_produce_batch          /  0.026s] TEST FAILURE\n"
    "\x1b[31m### Test \"0011_produce_batch\" failed at test.c:4667:test_admin_create_topic() at Sun Nov 29 "
    "09:57:53 2026: ###\n"
    "Test assertion failed: \"!rd_kafka_event_error(rkev)\": CreateTopics failed: Topic Admin API (KIP-4) not "
    "supported by broker, requires broker version >= 0.10.2.0\n"
    "[<MAIN>                      /  1.200s] TEST FAILURE\n"
    "### Test \"<MAIN>\" failed at test.c:1596:test_wait_exit() at Sun Nov 29 09:57:54 2026: ###\n"
    "3 thread(s) still active in librdkafka\n"
    "test-runner: test.c:6716: test_fail0: Assertion `0' failed.\n")

# A failure with the summary table (the reason is the test's failstr), and a skip.
TABLE_OUT = (
    "### Test \"0030_offset_commit (do_commit)\" failed at 0030-offset_commit.c:120:do_commit() at x: ###\n"
    "Commit failed: Broker: Not coordinator\n"
    "|\x1b[31m 0030_offset_commit                       |     FAILED |  12.040s \x1b[0m|\x1b[31m "
    "do_commit: 0030-offset_commit.c:120: Commit failed: Broker: Not coordinator\x1b[0m\n"
    "|\x1b[36m 0034_offset_reset_mock                   |    SKIPPED |   0.000s \x1b[0m|\x1b[36m "
    "Filtered due to negative test flags\x1b[0m\n")


def test_the_table_is_read_with_flags_and_scenarios():
    entries = suite.parse_test_table(TEST_C)
    assert [t.name for t in entries] == [
        "0000_unittests", "0001_multiobj", "0009_mock_cluster", "0028_long_topicnames", "0034_offset_reset",
        "0034_offset_reset_mock", "0055_producer_latency", "0049_consume_conn_close", "0081_admin", "0103_transactions", "0107_topic_recreate", "8000_idle"]
    by = {t.name: t for t in entries}
    assert by["0000_unittests"].local and not by["0001_multiobj"].local
    assert by["0049_consume_conn_close"].flags == "TEST_F_SOCKEM"
    assert by["0103_transactions"].scenario == "default,ak23" and by["0107_topic_recreate"].scenario == "noautocreate"
    assert by["8000_idle"].manual and by["0034_offset_reset"].number == "0034"
    # the runner skips TEST_F_KNOWN_ISSUE tests unless given -k; *_WIN32 is another platform's
    assert by["0028_long_topicnames"].known_issue and not by["0055_producer_latency"].known_issue


def test_categories_and_the_default_selection():
    entries = suite.parse_test_table(TEST_C)
    cats = {t.name: suite.category(t)[0] for t in entries}
    assert cats == {"0000_unittests": "local", "0001_multiobj": "in-scope", "0009_mock_cluster": "out-of-scope",
                    "0028_long_topicnames": "in-scope", "0055_producer_latency": "in-scope",
                    "0034_offset_reset": "in-scope", "0034_offset_reset_mock": "out-of-scope",
                    "0049_consume_conn_close": "in-scope", "0081_admin": "in-scope",
                    "0103_transactions": "in-scope", "0107_topic_recreate": "out-of-scope", "8000_idle": "manual"}
    assert "mock cluster" in suite.category(entries[2])[1]
    assert [t.name for t in suite.select(entries)] == [
        "0001_multiobj", "0028_long_topicnames", "0034_offset_reset", "0055_producer_latency", "0049_consume_conn_close", "0081_admin", "0103_transactions"]
    assert "0000_unittests" in [t.name for t in suite.select(entries, local=True)]
    # by number (every test of it, out-of-scope ones too: they are reported as such) or by name
    assert [t.name for t in suite.select(entries, ["0034"])] == ["0034_offset_reset", "0034_offset_reset_mock"]
    assert [t.name for t in suite.select(entries, ["0034_offset_reset", "0001"])] == [
        "0001_multiobj", "0034_offset_reset"]
    with pytest.raises(ValueError, match="0999"):
        suite.select(entries, ["0999"])


def test_every_out_of_scope_entry_and_slice_has_a_reason():
    assert all(reason.strip() for reason in suite.OUT_OF_SCOPE.values())
    assert not set(suite.SUBTEST_SLICES) & set(suite.OUT_OF_SCOPE)
    assert all(slices for slices in suite.SUBTEST_SLICES.values())


def test_a_summary_table_gives_state_seconds_and_reason():
    rows = suite.parse_runner_output(PASSED_OUT)
    assert rows == {"0005_order": ("PASSED", 2.508, "")}
    rows = suite.parse_runner_output(TABLE_OUT)
    assert rows["0030_offset_commit"] == ("FAILED", 12.04,
                                          "do_commit: 0030-offset_commit.c:120: Commit failed: Broker: Not coordinator")
    assert rows["0034_offset_reset_mock"] == ("SKIPPED", 0.0, "Filtered due to negative test flags")


def test_an_aborted_run_takes_the_first_failure_message():
    rows = suite.parse_runner_output(ABORTED_OUT)
    assert list(rows) == ["0011_produce_batch"]  # not <MAIN>
    state, secs, reason = rows["0011_produce_batch"]
    # the asserted C expression is left out, its message kept
    assert state == "FAILED" and reason == (
        "test.c:4667:test_admin_create_topic(): assertion failed: CreateTopics failed: Topic Admin API (KIP-4) not "
        "supported by broker, requires broker version >= 0.10.2.0")


def test_one_line_per_test_and_the_summary():
    r = suite.Result("0011_produce_batch", "FAILED", 1.23, "first line of the reason\nsecond line")
    line = r.line()
    assert "\n" not in line
    assert line.startswith("0011 produce_batch ") and " FAILED " in line and " 1.2s " in line
    assert line.endswith("first line of the reason")
    assert re.fullmatch(r"0001 multiobj +PASSED +0\.5s", suite.Result("0001_multiobj", "PASSED", 0.5).line())
    results = [r, suite.Result("0001_multiobj", "PASSED"), suite.Result("0009_mock_cluster", "OUT-OF-SCOPE")]
    assert suite.summary(results) == "summary: 1 PASSED, 1 FAILED, 0 SKIPPED, 1 OUT-OF-SCOPE (3 tests)"


def test_a_slice_that_matched_no_sub_test_is_told_apart():
    out = ("\x1b[36m[0081_admin                  /  0.010s] [ do_test_unclean_destroy:1912: Test unclean destroy "
           "using tempq ]\n")
    assert suite.subtest_started(out, "unclean_destroy")
    assert not suite.subtest_started(out, "do_test_CreateTopics")
    assert not suite.subtest_started(PASSED_OUT, "do_test_CreateTopics")


def test_slices_merge_into_one_line_naming_the_failed_slice():
    parts = [suite.Result("0081_admin/do_test_CreateTopics", "PASSED", 2.0),
             suite.Result("0081_admin/do_test_DeleteGroups", "FAILED", 3.0, "DeleteGroups failed: NOT_COORDINATOR\nx"),
             suite.Result("0081_admin/do_test_DescribeConfigs", "SKIPPED", 0.0, "")]
    merged = suite.merge_slices("0081_admin", parts)
    assert merged.state == "FAILED" and merged.seconds == 5.0
    assert merged.reason == "[do_test_DeleteGroups] DeleteGroups failed: NOT_COORDINATOR"
    assert suite.merge_slices("x", parts[:1] + parts[2:]).state == "PASSED"
    assert suite.merge_slices("x", parts[2:]).state == "SKIPPED"


def test_broker_error_lines_are_distinct_and_bounded():
    log = "\n".join([
        "2026-11-29 09:57:53,001 INFO broker: client 127.0.0.1:5001: JoinGroup v7 -> NOT_COORDINATOR: moved",
        "2026-11-29 09:57:53,002 INFO broker: client 127.0.0.1:5002: JoinGroup v7 -> NOT_COORDINATOR: moved",
        "2026-11-29 09:57:53,003 INFO broker: produced 5 batches",
        "2026-11-29 09:57:53,004 ERROR broker: client 127.0.0.1:5003: OffsetFetch v7 failed"])
    lines = suite.broker_error_lines(log)
    assert len(lines) == 2 and "JoinGroup v7 -> NOT_COORDINATOR" in lines[0] and "OffsetFetch" in lines[1]
    assert len(suite.broker_error_lines(log, limit=1)) == 1


def test_the_test_conf_names_the_broker(tmp_path):
    path = tmp_path / "test.conf"
    suite.write_test_conf(str(path), "127.0.0.1:9")
    assert path.read_text().splitlines()[0] == "bootstrap.servers=127.0.0.1:9"


def test_the_docs_table_is_the_scripts():
    doc = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "librdkafka-suite.md")
    with open(doc) as f:
        assert suite.scope_table() in f.read(), "docs/librdkafka-suite.md: paste `--scope-table`'s output"
