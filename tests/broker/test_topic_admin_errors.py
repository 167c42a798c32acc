"""The error answers of topic administration's APIs (``broker.handlers.topics.RPCS``), for every version served:
with the request's body (one entry per topic or resource, carrying the code) and without one (a body that
could not be read), each encodable, so a refused request is always answered."""
from __future__ import annotations

import datetime
import uuid

import pytest

from broker.api_table import NAMES, SUPPORTED
from broker.config import BrokerConfig
from broker.handlers import topics
from records.wire import kafka
from records.wire.errors import Errors
from tests.support.kafka_requests import entity

CFG = BrokerConfig(broker_id=1, quorum=["127.0.0.1:1"])
T = datetime.timedelta(seconds=1)


def sample(api_key: int, v: int):
    """A request of ``api_key`` at ``v`` naming two topics or resources."""
    if api_key == topics.CREATE_TOPICS:
        ts = tuple(entity(api_key, v, "CreatableTopic", name=n, num_partitions=1, replication_factor=1,
                          assignments=(), configs=()) for n in ("a", "b"))
        return kafka.request_entity(api_key, v, topics=ts, timeout=T, validate_only=False)
    if api_key == topics.DELETE_TOPICS:
        if v >= topics.FIRST_DELETE_BY_ID:
            return kafka.request_entity(api_key, v, timeout=T, topics=(
                entity(api_key, v, "DeleteTopicState", name="a", topic_id=None),
                entity(api_key, v, "DeleteTopicState", name=None, topic_id=uuid.uuid4())))
        return kafka.request_entity(api_key, v, timeout=T, topic_names=("a", "b"))
    if api_key == topics.CREATE_PARTITIONS:
        return kafka.request_entity(api_key, v, timeout=T, validate_only=False, topics=tuple(
            entity(api_key, v, "CreatePartitionsTopic", name=n, count=2, assignments=None) for n in ("a", "b")))
    if api_key == topics.DESCRIBE_CONFIGS:
        return kafka.request_entity(api_key, v, include_synonyms=False, resources=tuple(
            entity(api_key, v, "DescribeConfigsResource", resource_type=t, resource_name=n, configuration_keys=None)
            for t, n in ((2, "a"), (4, "1"))), **({"include_documentation": False} if v >= 3 else {}))
    return kafka.request_entity(api_key, v, validate_only=False, resources=tuple(
        entity(api_key, v, "AlterConfigsResource", resource_type=2, resource_name=n, configs=()) for n in "ab"))


@pytest.mark.parametrize("api_key", sorted(topics.RPCS))
def test_error_answers_of_every_version_encode(api_key):
    lo, hi = topics.RPCS[api_key].versions
    assert SUPPORTED[api_key] == (lo, hi) and NAMES[api_key] == topics.RPCS[api_key].name
    table = kafka.ApiTable(SUPPORTED, NAMES, None)
    for v in range(lo, hi + 1):
        for body in (None, sample(api_key, v)):
            answer = topics.RPCS[api_key].error(CFG, v, Errors.INVALID_REQUEST, body)
            assert table.encode(api_key, v, 7, answer)
            rows = next(getattr(answer, f) for f in ("topics", "responses", "results") if hasattr(answer, f))
            assert len(rows) == (0 if body is None else 2)
            assert {int(r.error_code) for r in rows} <= {int(Errors.INVALID_REQUEST)}
