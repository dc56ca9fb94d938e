"""Kafka, PostgreSQL and Redis take no one without credentials, and each principal only its share.

Against the infrastructure of ``scripts/infra up`` (``source .run/env``): the services' and the
auditor's own principals come from there (``kafka_principals``, ``NIUNIU_<SERVICE>_DSN``,
``NIUNIU_AUDITOR_DSN``). Nothing here writes to the system's topics or databases: the writes
tried are refused ones, the rng's right to write the audit topic is the broker's own answer
(the topic's authorized operations), and reads are of what is there.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import redis
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError, TopicAuthorizationFailedError

from backbone.kafka import KafkaCredentials
from backbone.topics import Topics

pytestmark = pytest.mark.integration

SYSTEM = Topics()
SERVICES = ("rng", "table", "wallet", "ledger")
TIMEOUT_MS = 8_000
# A refused client never bootstraps; kafka-python gives up after this (its default: 30 s).
REFUSED_BOOTSTRAP_MS = 5_000


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: this infrastructure has no credentials; run scripts/infra up", pytrace=False)
    return value


@pytest.fixture(scope="module")
def servers() -> str:
    return _env("KAFKA_BOOTSTRAP_SERVERS")


def _sasl(principals: dict[str, tuple[str, str]], identity: str) -> dict[str, str]:
    if identity == "test":
        user, password = _env("KAFKA_SASL_USERNAME"), _env("KAFKA_SASL_PASSWORD")
    elif identity in principals:
        user, password = principals[identity]
    else:
        pytest.fail(f"NIUNIU_{identity.upper()}_KAFKA_USER is not in .run/env: no credentials", pytrace=False)
    return KafkaCredentials(user, password).client_config()


@pytest.fixture(scope="module")
def admin_of(servers: str, kafka_principals: dict[str, tuple[str, str]]) -> Iterator[dict[str, KafkaAdminClient]]:
    clients: dict[str, KafkaAdminClient] = {}
    for identity in (*SERVICES, "auditor", "test"):
        clients[identity] = KafkaAdminClient(
            bootstrap_servers=servers,
            client_id=f"security-{identity}",
            request_timeout_ms=TIMEOUT_MS,
            **_sasl(kafka_principals, identity),
        )
    yield clients
    for client in clients.values():
        client.close()


def _operations(admin: KafkaAdminClient, topic: str) -> set[str] | None:
    """What the broker's authorizer lets this principal do on ``topic``; None: not even see it."""
    (meta,) = admin.describe_topics([topic])
    if meta["error_code"] == TopicAuthorizationFailedError.errno:
        return None
    assert meta["error_code"] == 0, meta
    return set(meta.get("authorized_operations") or ())


def _consumer(servers: str, sasl: dict[str, str]) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap_servers=servers,
        group_id=None,
        client_id="security-reader",
        enable_auto_commit=False,
        request_timeout_ms=TIMEOUT_MS,
        **sasl,
    )


# --- Kafka ------------------------------------------------------------------------------------------------


def test_kafka_refuses_a_client_without_credentials(servers: str) -> None:
    with pytest.raises(KafkaError):
        admin = KafkaAdminClient(
            bootstrap_servers=servers,
            client_id="anonymous",
            request_timeout_ms=TIMEOUT_MS,
            bootstrap_timeout_ms=REFUSED_BOOTSTRAP_MS,
        )
        try:
            admin.list_topics()
        finally:
            admin.close()


def test_kafka_refuses_a_wrong_password(servers: str, kafka_principals: dict[str, tuple[str, str]]) -> None:
    user, _ = kafka_principals.get("ledger") or pytest.fail("no ledger principal in .run/env", pytrace=False)
    with pytest.raises(KafkaError):
        admin = KafkaAdminClient(
            bootstrap_servers=servers,
            client_id="impostor",
            request_timeout_ms=TIMEOUT_MS,
            bootstrap_timeout_ms=REFUSED_BOOTSTRAP_MS,
            **KafkaCredentials(user, uuid.uuid4().hex).client_config(),
        )
        try:
            admin.list_topics()
        finally:
            admin.close()


@pytest.mark.parametrize("identity", ["table", "wallet", "ledger", "test"])
def test_no_service_principal_reads_the_audit_topic(
    identity: str, servers: str, admin_of: dict[str, KafkaAdminClient], kafka_principals: dict[str, tuple[str, str]]
) -> None:
    assert _operations(admin_of[identity], SYSTEM.rng_audit) is None  # may not even learn its partitions
    consumer = _consumer(servers, _sasl(kafka_principals, identity))
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            consumer.end_offsets([TopicPartition(SYSTEM.rng_audit, 0)])
    finally:
        consumer.close()


def test_the_rng_writes_the_audit_topic_and_cannot_read_it(admin_of: dict[str, KafkaAdminClient]) -> None:
    operations = _operations(admin_of["rng"], SYSTEM.rng_audit)
    assert operations is not None and "WRITE" in operations, operations
    assert "READ" not in operations, operations


def test_the_auditor_reads_the_audit_topic_and_writes_nothing(
    servers: str, admin_of: dict[str, KafkaAdminClient], kafka_principals: dict[str, tuple[str, str]]
) -> None:
    for topic in (SYSTEM.rng_audit, SYSTEM.rng_events, SYSTEM.table_events, SYSTEM.wallet_events):
        operations = _operations(admin_of["auditor"], topic)
        assert operations is not None and "READ" in operations, (topic, operations)
        assert not operations & {"WRITE", "CREATE", "DELETE", "ALTER"}, (topic, operations)
    consumer = _consumer(servers, _sasl(kafka_principals, "auditor"))
    try:
        partitions = [
            TopicPartition(SYSTEM.rng_audit, p) for p in sorted(consumer.partitions_for_topic(SYSTEM.rng_audit) or ())
        ]
        assert partitions, "the auditor sees the audit topic's partitions"
        ends = consumer.end_offsets(partitions)
        starts = consumer.beginning_offsets(partitions)
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        want = sum(ends[tp] - starts[tp] for tp in partitions)
        got = 0
        for _ in range(50):  # bounded: every record there is readable within a few polls
            if got >= want:
                break
            got += sum(len(records) for records in consumer.poll(timeout_ms=500).values())
        assert got == want, f"the auditor read {got} of the audit topic's {want} records"
    finally:
        consumer.close()


@pytest.mark.parametrize(
    ("identity", "topic"),
    [("ledger", SYSTEM.rng_audit), ("table", SYSTEM.wallet_events), ("wallet", SYSTEM.table_events)],
)
def test_a_service_cannot_write_another_services_topic(
    identity: str,
    topic: str,
    servers: str,
    admin_of: dict[str, KafkaAdminClient],
    kafka_principals: dict[str, tuple[str, str]],
) -> None:
    operations = _operations(admin_of[identity], topic) or set()
    assert "WRITE" not in operations, (identity, topic, operations)
    producer = KafkaProducer(
        bootstrap_servers=servers,
        client_id=f"security-{identity}",
        max_block_ms=TIMEOUT_MS,
        **_sasl(kafka_principals, identity),
    )
    try:
        with pytest.raises(KafkaError):
            producer.send(topic, b"forged").get(timeout=TIMEOUT_MS / 1000)
    finally:
        producer.close(timeout=5)


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_writes_its_own_topics(service: str, admin_of: dict[str, KafkaAdminClient]) -> None:
    own = [s.name for s in SYSTEM.specs() if s.name.startswith(f"niuniu.{service}.")]
    assert own
    for topic in own:
        operations = _operations(admin_of[service], topic)
        assert operations is not None and "WRITE" in operations, (service, topic, operations)
    # ... and reads back its events topic: the restore check at start (backbone/restorecheck.py).
    operations = _operations(admin_of[service], f"niuniu.{service}.events")
    assert operations is not None and "READ" in operations, (service, operations)


def test_the_test_principal_cannot_touch_the_systems_topics(admin_of: dict[str, KafkaAdminClient]) -> None:
    for spec in SYSTEM.specs():
        assert _operations(admin_of["test"], spec.name) is None, spec.name


# --- PostgreSQL -------------------------------------------------------------------------------------------


def _without_password(dsn: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{parts.username}@{parts.hostname}:{parts.port}"))


def _with_database(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


def _with_password(dsn: str, password: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{password}@{parts.hostname}:{parts.port}"))


@pytest.mark.parametrize("service", SERVICES)
def test_postgres_refuses_a_connection_without_or_with_a_wrong_password(service: str) -> None:
    dsn = _env(f"NIUNIU_{service.upper()}_DSN")
    assert urlsplit(dsn).password, "the service's DSN carries its password"
    for attempt in (_without_password(dsn), _with_password(dsn, uuid.uuid4().hex)):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(attempt, connect_timeout=5).close()
    # the password-less superuser of the clusters made before credentials is gone
    legacy = urlunsplit(urlsplit(dsn)._replace(netloc=f"niuniu@{urlsplit(dsn).hostname}:{urlsplit(dsn).port}"))
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(legacy, connect_timeout=5).close()


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_role_owns_its_database_and_reaches_no_other(service: str) -> None:
    dsn = _env(f"NIUNIU_{service.upper()}_DSN")
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT r.rolsuper, r.rolcreaterole, r.rolcreatedb, pg_get_userbyid(d.datdba) = current_user"
            " FROM pg_roles r, pg_database d WHERE r.rolname = current_user AND d.datname = current_database()"
        ).fetchone()
    assert row == (False, False, False, True), row
    for other in SERVICES:
        if other == service:
            continue
        with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
            psycopg.connect(_with_database(dsn, f"niuniu_{other}"), connect_timeout=5).close()
    with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
        psycopg.connect(_with_database(dsn, "niuniu_test"), connect_timeout=5).close()


def test_the_auditor_reads_the_ledgers_database_and_changes_nothing() -> None:
    dsn = _with_database(_env("NIUNIU_AUDITOR_DSN"), "niuniu_ledger")
    with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()]
        for table in tables:  # every table the ledger made is readable
            conn.execute(f'SELECT count(*) FROM public."{table}"').fetchone()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE public.auditor_was_here (x int)")
        if tables:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f'DELETE FROM public."{tables[0]}"')
        # Nothing secret in what it reads: no seed, no password (hash) column anywhere it may select
        # (key_hash: a record key's partition hash; migration_hash: yoyo's digest of a migration's name).
        secret = conn.execute(
            "SELECT n.nspname || '.' || c.relname || '.' || a.attname FROM pg_attribute a"
            " JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE a.attnum > 0 AND NOT a.attisdropped AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
            " AND a.attname ~ '(seed|password|hash)' AND a.attname NOT IN ('key_hash', 'migration_hash')"
            " AND has_column_privilege(c.oid, a.attnum, 'SELECT')"
        ).fetchall()
    assert secret == [], secret


@pytest.mark.parametrize("service", ("rng", "table", "wallet"))
def test_the_auditor_cannot_reach_another_services_database(service: str) -> None:
    """Not the rng's (an open round's server seed), the table's, nor the wallet's (password hashes): the
    audit reads what it needs of them through their gRPC APIs (tests/ledger/test_audit_auditor.py)."""
    dsn = _with_database(_env("NIUNIU_AUDITOR_DSN"), f"niuniu_{service}")
    with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
        psycopg.connect(dsn, connect_timeout=5).close()
    with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
        psycopg.connect(_with_database(dsn, "niuniu_test"), connect_timeout=5).close()


# --- Redis ------------------------------------------------------------------------------------------------


def test_redis_refuses_an_unauthenticated_client_and_a_wrong_password() -> None:
    url = urlsplit(_env("REDIS_URL"))
    assert url.password, "REDIS_URL carries the password"
    anonymous = redis.Redis(host=url.hostname or "127.0.0.1", port=url.port or 6379, socket_timeout=5)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.get("niuniu:lease:anything")
    anonymous.close()
    wrong = redis.Redis(
        host=url.hostname or "127.0.0.1", port=url.port or 6379, username=url.username, password=uuid.uuid4().hex
    )
    with pytest.raises(redis.exceptions.AuthenticationError):
        wrong.ping()
    wrong.close()


def test_the_redis_user_of_the_services_has_no_admin_commands() -> None:
    client = redis.Redis.from_url(_env("REDIS_URL"), socket_timeout=5)
    try:
        assert client.ping()
        for command in (("CONFIG", "GET", "requirepass"), ("FLUSHALL",), ("ACL", "LIST"), ("KEYS", "*")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)
    finally:
        client.close()
