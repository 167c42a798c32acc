"""``BrokerRpc``: how ``broker.api_table`` and the handler modules that declare their own APIs (``topics``,
``groups``) describe one Kafka API of the broker."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from records.wire import kafka
from records.wire.errors import Errors

from ..config import BrokerConfig
from .context import BrokerContext


@dataclass(frozen=True)
class BrokerRpc:
    """One API of the broker, declared once: its versions, its handler (a function of ``broker.handlers``
    taking the server and the request, which returns the response body), its error answer (shaped like the
    request) and the ACL it needs ((resource type, name, operation) of the request, or None; or an
    operation on each of its topics)."""
    name: str
    versions: tuple[int, int]
    handle: Callable[[BrokerContext, kafka.Request], Any]
    error: Callable[[BrokerConfig, int, Errors, Any], Any]
    acl: Callable[[Any], tuple[str, str, str] | None] = lambda body: None
    # The operation each topic named in the request needs.  The answer is per partition, so the handler
    # checks it per topic (BrokerContext._topic_allowed) and answers a refused one TOPIC_AUTHORIZATION_FAILED.
    topic_acl: str | None = None
