"""quorum.telemetry.logs: JSON and human lines with identity, term and request correlation ids."""
from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest

from quorum.telemetry import logs


@pytest.fixture
def capture():
    """Route the root logger through logs.setup_logging into a buffer; undo everything afterwards."""
    root = logging.getLogger()
    level = root.level
    buf = io.StringIO()

    def setup(fmt: str):
        logs.setup_logging("DEBUG", fmt, buf)
        return buf
    yield setup
    for h in list(root.handlers):
        if getattr(h, "_pidquorum", False):
            root.removeHandler(h)
    root.setLevel(level)
    logs._identity.clear()
    logs._sources.clear()


def test_json_lines_carry_identity_term_and_the_request_of_each_task(capture):
    buf = capture("json")
    term = [4]
    logs.set_identity(node_id=2)
    logs.set_context_source("term", lambda: term[0])
    log = logging.getLogger("pidquorum.test")

    async def handle(client_id, corr):
        logs.request_context(client_id, corr)
        await asyncio.sleep(0)  # interleave the two requests
        log.info("handling %s", corr)

    async def main():
        await asyncio.gather(handle("pidctl", 7), handle("broker-1", 8))
        log.warning("between requests")

    asyncio.run(main())
    term[0] = 5
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    lines = [x for x in lines if x["logger"] == "pidquorum.test"]  # not asyncio's DEBUG line
    assert len(lines) == 4
    for line in lines:
        assert {"ts", "level", "logger", "msg", "node_id", "term"} <= set(line)
        assert line["ts"].endswith("Z") and line["node_id"] == 2 and line["logger"] == "pidquorum.test"
    by_msg = {x["msg"]: x for x in lines}
    assert by_msg["handling 7"]["correlation_id"] == 7 and by_msg["handling 7"]["client_id"] == "pidctl"
    assert by_msg["handling 8"]["correlation_id"] == 8 and by_msg["handling 8"]["client_id"] == "broker-1"
    assert "correlation_id" not in by_msg["between requests"]  # the tasks' contexts did not leak
    assert by_msg["between requests"]["level"] == "WARNING" and by_msg["between requests"]["term"] == 4
    assert by_msg["failed"]["term"] == 5 and "ValueError: boom" in by_msg["failed"]["exc"]


def test_a_failing_context_source_never_breaks_a_line(capture):
    buf = capture("json")
    logs.set_context_source("term", lambda: 1 / 0)
    logs.set_context_source("broker_epoch", lambda: None)
    logging.getLogger("x").info("still logged")
    line = json.loads(buf.getvalue())
    assert line["msg"] == "still logged" and "term" not in line and "broker_epoch" not in line


def test_human_lines_name_node_term_and_request(capture):
    buf = capture("human")
    logs.set_identity(broker_id=3)
    logs.set_context_source("broker_epoch", lambda: 12)
    token = logs.request_context("rdkafka", 41)
    logging.getLogger("broker.frontend").info("answered %s", "NONE")
    logs.end_request_context(token)
    logging.getLogger("broker.frontend").info("idle")
    first, second = buf.getvalue().splitlines()
    assert first.endswith(" INFO broker.frontend [broker=3 epoch=12 req=rdkafka#41]: answered NONE")
    assert second.endswith(" INFO broker.frontend [broker=3 epoch=12]: idle")


def test_setup_again_replaces_only_its_own_handler(capture):
    capture("human")
    buf = capture("json")
    mine = [h for h in logging.getLogger().handlers if getattr(h, "_pidquorum", False)]
    assert len(mine) == 1
    logging.getLogger("y").error("one line")
    assert json.loads(buf.getvalue())["msg"] == "one line"
    with pytest.raises(ValueError, match="log format"):
        logs.setup_logging("INFO", "xml")
