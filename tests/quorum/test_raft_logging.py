"""The adapter rewrites pysyncobj's misleading "may have diverged" line (the journal keeps
committed entries, see test_journal.py), and leaves every other pysyncobj line alone."""
from __future__ import annotations

import logging

import pysyncobj.syncobj as syncobj

import quorum.raft  # noqa: F401 - installs the filter


def test_truncation_warning_is_rewritten_to_what_really_happens(caplog):
    with caplog.at_level(logging.INFO, logger=syncobj.logger.name):
        syncobj.logger.critical("truncating already-applied log entries from index %d (last applied: %d) - "
                                "state machine may have diverged from other cluster members", 5, 7)
        syncobj.logger.critical("some other critical line %d", 1)
    (rewritten, other) = caplog.records
    assert rewritten.levelno == logging.INFO
    assert rewritten.getMessage() == ("an AppendEntries asked to cut applied entries from index 5 (last applied 7); "
                                      "the journal keeps committed entries")
    assert other.levelno == logging.CRITICAL and other.getMessage() == "some other critical line 1"
