"""ACL entries and the authorizer (Kafka's StandardAuthorizer rules, for the resources pidquorum has).

An entry: principal ("User:alice", or "User:*" for everyone), resource type
(``Cluster`` -- named ``kafka-cluster`` --, ``TransactionalId`` or ``Topic``),
resource name and pattern type (LITERAL, where the name "*" matches every name,
or PREFIXED), operation, permission (ALLOW / DENY) and host ("*" or one IP).

``authorize`` follows Kafka: a super user may do anything; otherwise a
matching DENY wins over any ALLOW; ALL matches every operation; an ALLOW of
READ/WRITE/DELETE/ALTER implies DESCRIBE, of ALTER_CONFIGS DESCRIBE_CONFIGS; with no matching ALLOW the answer is
no (``allow.everyone.if.no.acl.found=false``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

CLUSTER, TRANSACTIONAL_ID, TOPIC, GROUP = "Cluster", "TransactionalId", "Topic", "Group"
RESOURCE_TYPES = (CLUSTER, TRANSACTIONAL_ID, TOPIC, GROUP)
CLUSTER_NAME = "kafka-cluster"
LITERAL, PREFIXED = "LITERAL", "PREFIXED"
PATTERN_TYPES = (LITERAL, PREFIXED)
WILDCARD = "*"
ALL, CLUSTER_ACTION, IDEMPOTENT_WRITE, READ, WRITE, DESCRIBE, ALTER = (
    "ALL", "CLUSTER_ACTION", "IDEMPOTENT_WRITE", "READ", "WRITE", "DESCRIBE", "ALTER")
CREATE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS = "CREATE", "DELETE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"
OPERATIONS = (ALL, CLUSTER_ACTION, IDEMPOTENT_WRITE, READ, WRITE, DESCRIBE, ALTER, CREATE, DELETE, DESCRIBE_CONFIGS,
              ALTER_CONFIGS)
# Which operations each resource type has (Kafka's ResourceType -> AclOperation table, as far as used here).
# Topics: Produce needs WRITE, DescribeProducers DESCRIBE (as in Kafka); Fetch needs authentication only.
# Topic administration (broker/handlers/topics.py): CREATE (cluster or topic), DELETE, ALTER, DESCRIBE_CONFIGS.
OPERATIONS_OF = {CLUSTER: {ALL, CLUSTER_ACTION, IDEMPOTENT_WRITE, DESCRIBE, ALTER, CREATE, DESCRIBE_CONFIGS,
                           ALTER_CONFIGS},
                 TRANSACTIONAL_ID: {ALL, WRITE, DESCRIBE},
                 TOPIC: {ALL, READ, WRITE, DESCRIBE, ALTER, CREATE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS},
                 # Consumer groups (broker/handlers/groups.py), as Kafka: READ to join, commit and fetch
                 # offsets (and for AddOffsetsToTxn / TxnOffsetCommit), DESCRIBE to describe and list,
                 # DELETE for DeleteGroups.
                 GROUP: {ALL, READ, DESCRIBE, DELETE}}
IMPLIES_DESCRIBE = {READ, WRITE, ALTER, DELETE}
IMPLIES_DESCRIBE_CONFIGS = {ALTER_CONFIGS}  # as Kafka: ALTER_CONFIGS implies DESCRIBE_CONFIGS
ALLOW, DENY = "ALLOW", "DENY"
PERMISSIONS = (ALLOW, DENY)
ANONYMOUS = "User:ANONYMOUS"


class AclError(ValueError):
    """An ACL entry that cannot be stored (bad principal, resource, operation ...)."""


@dataclass(frozen=True, order=True)
class Acl:
    principal: str
    resource_type: str
    resource_name: str
    pattern_type: str
    operation: str
    permission: str
    host: str = WILDCARD

    def validate(self) -> "Acl":
        kind, sep, name = self.principal.partition(":")
        if kind != "User" or not sep or not name:
            raise AclError(f"principal {self.principal!r} must be User:<name> (or User:* for everyone)")
        if self.resource_type not in RESOURCE_TYPES:
            raise AclError(f"resource type {self.resource_type!r} is not one of {', '.join(RESOURCE_TYPES)}")
        if self.pattern_type not in PATTERN_TYPES:
            raise AclError(f"pattern type {self.pattern_type!r} is not one of {', '.join(PATTERN_TYPES)}")
        if not self.resource_name:
            raise AclError("the resource name must not be empty")
        if self.resource_type == CLUSTER and (self.resource_name != CLUSTER_NAME or self.pattern_type != LITERAL):
            raise AclError(f"the cluster resource is the literal name {CLUSTER_NAME!r}")
        if self.pattern_type == PREFIXED and self.resource_name == WILDCARD:
            raise AclError("a PREFIXED pattern cannot be '*' (use LITERAL '*' for every name)")
        if self.operation not in OPERATIONS_OF[self.resource_type]:
            raise AclError(f"operation {self.operation!r} does not apply to {self.resource_type} "
                           f"(one of {', '.join(sorted(OPERATIONS_OF[self.resource_type]))})")
        if self.permission not in PERMISSIONS:
            raise AclError(f"permission {self.permission!r} is not ALLOW or DENY")
        if not self.host or any(c.isspace() for c in self.host):
            raise AclError(f"host {self.host!r} must be '*' or an address")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_obj(cls, obj: Any) -> "Acl":
        """From a dict or any object (a record) with the same field names."""
        get = obj.get if isinstance(obj, dict) else lambda k: getattr(obj, k)
        return cls(*(str(get(k)) for k in ("principal", "resource_type", "resource_name", "pattern_type",
                                          "operation", "permission", "host")))

    def matches_resource(self, resource_type: str, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == LITERAL:
            return self.resource_name == WILDCARD or self.resource_name == name
        return name.startswith(self.resource_name)

    def matches_principal(self, principal: str) -> bool:
        return self.principal == principal or self.principal == "User:*"

    def matches_host(self, host: str | None) -> bool:
        return self.host == WILDCARD or (host is not None and self.host == host)


def _grants(acl_op: str, op: str) -> bool:
    return acl_op == ALL or acl_op == op or (op == DESCRIBE and acl_op in IMPLIES_DESCRIBE) or \
        (op == DESCRIBE_CONFIGS and acl_op in IMPLIES_DESCRIBE_CONFIGS)


def authorize(acls: Iterable[Acl], principal: str, resource_type: str, name: str, operation: str,
              super_users: Iterable[str] = (), host: str | None = None) -> bool:
    if principal in set(super_users):
        return True
    allowed = False
    for acl in acls:
        if not (acl.matches_principal(principal) and acl.matches_resource(resource_type, name)
                and acl.matches_host(host)):
            continue
        if acl.permission == DENY:
            if acl.operation in (ALL, operation):
                return False  # deny wins
        elif _grants(acl.operation, operation):
            allowed = True
    return allowed


class AclIndex:
    """Entries grouped by principal, built once per change: a check reads only the entries of the
    principal and of ``User:*``, not every entry (``authorize`` on a list is linear in all of them)."""

    def __init__(self, acls: Iterable[Acl] = ()):
        self.by_principal: dict[str, list[Acl]] = {}
        for acl in acls:
            self.by_principal.setdefault(acl.principal, []).append(acl)
        self.size = sum(len(v) for v in self.by_principal.values())

    def authorize(self, principal: str, resource_type: str, name: str, operation: str,
                  super_users: Iterable[str] = (), host: str | None = None) -> bool:
        if principal in super_users:
            return True
        own = self.by_principal.get(principal, ())
        everyone = self.by_principal.get("User:*", ()) if principal != "User:*" else ()
        return authorize((*own, *everyone), principal, resource_type, name, operation, (), host)


def principal_of(user: str) -> str:
    return f"User:{user}"


def peer_host(peer: Any) -> str | None:
    """The IP of an asyncio peername (host, port[, ...]), for host matching."""
    if isinstance(peer, (tuple, list)) and peer:
        return str(peer[0])
    return None


__all__ = ["Acl", "AclError", "AclIndex", "authorize", "principal_of", "peer_host"]
