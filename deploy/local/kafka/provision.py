"""Kafka users, ACLs and the system's topics of the local broker; run by ``scripts/infra up``.

Reads one JSON object on stdin (never argv: passwords stay out of ``ps``)::

    {"bootstrap": "127.0.0.1:9092", "admin": ["niuniu_admin", "..."],
     "users": {"niuniu_rng": "...", ...}}

and converges the broker on it: every user gets its SCRAM-SHA-512 credential (upserted with
the stored password), the ACLs of ``desired_acls`` are created, ACLs of those users that are
not in it are deleted, and the system's topics (``backbone.topics``) exist. Idempotent.

Who may do what (principal ``User:<name>``; a request no ACL allows is refused):

- ``niuniu_<svc>`` (rng, table, wallet, ledger): WRITE, CREATE, DESCRIBE on ``niuniu.<svc>.*``
  (its own topics); READ on ``niuniu.<svc>.events`` (the restore check at start reads back what
  it wrote, backbone/restorecheck.py); READ, DESCRIBE on the topics it consumes; READ on groups
  ``<svc>-*``.
- ``niuniu_auditor``: READ, DESCRIBE on ``niuniu.*`` (every system topic, the audit topic
  too); READ on groups ``audit*``; on this local broker also READ, DESCRIBE on ``audited-*``
  (the test systems its read-only path is tested on, tests/ledger/test_audit_auditor.py).
- ``niuniu_test``: everything on any topic, group and transactional id, except DENY on the
  topics ``niuniu.*`` and on the services' groups.
- ``niuniu_admin``: super user (``super.users``): the broker itself and this script.

So only the rng writes ``niuniu.rng.audit`` and only the auditor reads it. Tests run their
own systems under a topic prefix (``t<id>.``, ``e2e<id>.``) whose names cannot match a
prefixed ACL on ``niuniu.<svc>.``; they use ``niuniu_test``, which can do anything outside
the system's own topics and groups and nothing inside them.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass

from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from backbone.kafka import TopicSpec
from backbone.topics import Topics

SYSTEM = Topics()
SYSTEM_PREFIX = "niuniu."
AUDITOR = "niuniu_auditor"
AUDITED_TEST_PREFIX = "audited-"
TEST = "niuniu_test"
# What each service consumes (its ConsumerSpecs). kafka-python's consumer skips a topic it may
# not describe without an error: a new consumer needs its line here (the full-stack run of
# scripts/up shows it: its events would never be applied).
CONSUMES = {
    "rng": [SYSTEM.table_events],
    "table": [],
    "wallet": [SYSTEM.table_events],
    "ledger": [SYSTEM.wallet_events, SYSTEM.table_events],
}

LITERAL = ACLResourcePatternType.LITERAL
PREFIXED = ACLResourcePatternType.PREFIXED
ALLOW = ACLPermissionType.ALLOW
DENY = ACLPermissionType.DENY


@dataclass(frozen=True)
class Grant:
    principal: str
    resource: ResourceType
    name: str
    pattern: ACLResourcePatternType
    operation: ACLOperation
    permission: ACLPermissionType = ALLOW

    def acl(self) -> ACL:
        return ACL(
            f"User:{self.principal}",
            "*",
            self.operation,
            self.permission,
            ResourcePattern(self.resource, self.name, self.pattern),
        )


def service_user(service: str) -> str:
    return f"niuniu_{service}"


def desired_acls() -> list[Grant]:
    grants: list[Grant] = []
    topic, group = ResourceType.TOPIC, ResourceType.GROUP
    for service, consumed in CONSUMES.items():
        user = service_user(service)
        own = f"{SYSTEM_PREFIX}{service}."
        for op in (ACLOperation.WRITE, ACLOperation.CREATE, ACLOperation.DESCRIBE):
            grants.append(Grant(user, topic, own, PREFIXED, op))
        grants.append(Grant(user, topic, f"{own}events", LITERAL, ACLOperation.READ))
        for name in consumed:
            for op in (ACLOperation.READ, ACLOperation.DESCRIBE):
                grants.append(Grant(user, topic, name, LITERAL, op))
        if consumed:
            grants.append(Grant(user, group, f"{service}-", PREFIXED, ACLOperation.READ))
    for op in (ACLOperation.READ, ACLOperation.DESCRIBE):
        grants.append(Grant(AUDITOR, topic, SYSTEM_PREFIX, PREFIXED, op))
    grants.append(Grant(AUDITOR, group, "audit", PREFIXED, ACLOperation.READ))
    # Local broker only: a test system under the prefix ``audited-<id>.`` (run as niuniu_test)
    # is readable by the auditor, so its read-only path is tested without the system's topics.
    for op in (ACLOperation.READ, ACLOperation.DESCRIBE):
        grants.append(Grant(AUDITOR, topic, AUDITED_TEST_PREFIX, PREFIXED, op))
    for resource in (topic, group, ResourceType.TRANSACTIONAL_ID):
        grants.append(Grant(TEST, resource, "*", LITERAL, ACLOperation.ALL))
    grants.append(Grant(TEST, topic, SYSTEM_PREFIX, PREFIXED, ACLOperation.ALL, DENY))
    for service in CONSUMES:
        grants.append(Grant(TEST, group, f"{service}-", PREFIXED, ACLOperation.ALL, DENY))
    return grants


def _key(acl: ACL) -> tuple[object, ...]:
    p = acl.resource_pattern
    return (
        acl.principal,
        acl.host,
        acl.operation,
        acl.permission_type,
        p.resource_type,
        p.resource_name,
        p.pattern_type,
    )


def converge_acls(admin: KafkaAdminClient, managed_users: set[str]) -> tuple[int, int]:
    """Create the missing ACLs, delete stale ones of our users; returns (created, deleted)."""
    want = {_key(g.acl()): g.acl() for g in desired_acls()}
    any_pattern = ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY)
    have, error = admin.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY, any_pattern))
    if error.errno != 0:
        raise RuntimeError(f"describe ACLs: {error}")
    ours = {_key(a): a for a in have if a.principal.removeprefix("User:") in managed_users}
    missing = [acl for key, acl in want.items() if key not in ours]
    stale = [acl for key, acl in ours.items() if key not in want]
    if missing:
        result = admin.create_acls(missing)
        if result["failed"]:
            raise RuntimeError(f"create ACLs failed: {result['failed']}")
    if stale:
        filters = [ACLFilter(a.principal, a.host, a.operation, a.permission_type, a.resource_pattern) for a in stale]
        for _filter, _matched, err in admin.delete_acls(filters):
            if err.errno != 0:
                raise RuntimeError(f"delete ACL {_filter}: {err}")
    return len(missing), len(stale)


def converge_users(admin: KafkaAdminClient, users: dict[str, str]) -> None:
    upserts = [UserScramCredentialUpsertion(u, ScramMechanism.SCRAM_SHA_512, p) for u, p in sorted(users.items())]
    failed = {u: e for u, e in admin.alter_user_scram_credentials(upserts).items() if e}
    if failed:
        raise RuntimeError(f"SCRAM credentials not stored: {failed}")


def ensure_system_topics(admin: KafkaAdminClient) -> list[str]:
    specs: list[TopicSpec] = SYSTEM.specs()
    existing = set(admin.list_topics())
    request = {
        s.name: {"num_partitions": s.partitions, "replication_factor": 1, "configs": s.config}
        for s in specs
        if s.name not in existing
    }
    if request:
        admin.create_topics(request, timeout_ms=30_000, wait_for_metadata=True)
    return sorted(request)


def main() -> int:
    spec = json.load(sys.stdin)
    admin_user, admin_password = spec["admin"]
    users: dict[str, str] = spec["users"]
    admin = KafkaAdminClient(
        bootstrap_servers=spec["bootstrap"],
        client_id="niuniu-infra-provision",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username=admin_user,
        sasl_plain_password=admin_password,
        request_timeout_ms=30_000,
    )
    t0 = time.monotonic()
    try:
        converge_users(admin, users)
        created, deleted = converge_acls(admin, set(users))
        topics = ensure_system_topics(admin)
    finally:
        admin.close()
    print(
        f"{len(users)} SCRAM users, ACLs: {created} created, {deleted} removed;"
        f" topics created: {', '.join(topics) or 'none'} ({time.monotonic() - t0:.1f}s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
