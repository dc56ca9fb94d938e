"""Shared fixtures: the real Kafka, PostgreSQL and Redis.

Connection settings come from the environment (``source .run/env`` after
``scripts/infra up``, which the test command does). When they are unset and a
Docker engine is reachable, testcontainers starts the three instead; on the
project's machines there is no engine, so the infra script is the path taken.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from backbone.auth import DEVELOPMENT, ENV_MODE, KEY_ENV_VARS
from backbone.kafka import make_admin
from tests.harness import SUITE_SCHEMAS, drop_schemas

ROOT = Path(__file__).resolve().parent.parent
# The harness runs services on the development keys (backbone/auth.py), never on key files.
for _key in KEY_ENV_VARS:
    os.environ.pop(_key, None)
os.environ[ENV_MODE] = DEVELOPMENT


def _load_run_env() -> None:
    env_file = Path(os.environ.get("NIUNIU_RUN_DIR") or ROOT / ".run") / "env"
    if not env_file.exists():
        return
    for line in env_file.read_text().splitlines():
        line = line.strip()
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export ") :].partition("=")
            os.environ.setdefault(key, value.strip("'\""))


KAFKA_IDENTITIES = ("rng", "table", "wallet", "ledger", "auditor")


def _test_principal_everywhere() -> dict[str, tuple[str, str]]:
    """Every Kafka client of the suite, the services' included, uses the default (test) principal.

    Tests run whole systems under topic prefixes (``t<id>.``, ``e2e<id>.``) that the services'
    own ACLs (on ``niuniu.<service>.*``) do not cover; the test principal may use any topic but
    the system's own. Returns the real principals it replaced, for the security tests.
    """
    _load_run_env()
    user, password = os.environ.get("KAFKA_SASL_USERNAME", ""), os.environ.get("KAFKA_SASL_PASSWORD", "")
    replaced: dict[str, tuple[str, str]] = {}
    for identity in KAFKA_IDENTITIES:
        user_key, password_key = f"NIUNIU_{identity.upper()}_KAFKA_USER", f"NIUNIU_{identity.upper()}_KAFKA_PASSWORD"
        if os.environ.get(user_key):
            replaced[identity] = (os.environ[user_key], os.environ.get(password_key, ""))
        if user:
            os.environ[user_key], os.environ[password_key] = user, password
        else:
            os.environ.pop(user_key, None)
            os.environ.pop(password_key, None)
    return replaced


KAFKA_PRINCIPALS = _test_principal_everywhere()


@pytest.fixture(scope="session")
def kafka_principals() -> dict[str, tuple[str, str]]:
    """(user, password) of each service's and the auditor's own Kafka principal, from ``.run/env``."""
    return dict(KAFKA_PRINCIPALS)


def _docker_reachable() -> bool:
    try:
        import docker

        docker.from_env().ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def infra() -> Iterator[dict[str, str]]:
    _load_run_env()
    keys = ("KAFKA_BOOTSTRAP_SERVERS", "DATABASE_URL", "REDIS_URL")
    if all(os.environ.get(k) for k in keys):
        yield {k: os.environ[k] for k in keys}
        return
    if not _docker_reachable():
        pytest.fail(
            "no infrastructure: run `scripts/infra up` (or set KAFKA_BOOTSTRAP_SERVERS, DATABASE_URL, REDIS_URL)",
            pytrace=False,
        )
    from testcontainers.kafka import KafkaContainer
    from testcontainers.postgres import PostgresContainer
    from testcontainers.redis import RedisContainer

    with KafkaContainer().with_kraft() as kafka, PostgresContainer("postgres:15") as pg, RedisContainer() as redis:
        values = {
            "KAFKA_BOOTSTRAP_SERVERS": kafka.get_bootstrap_server(),
            "DATABASE_URL": pg.get_connection_url(driver=None),
            "REDIS_URL": f"redis://{redis.get_container_host_ip()}:{redis.get_exposed_port(6379)}/0",
        }
        os.environ.update(values)
        yield values


_SESSIONS_LOCK = "/tmp/niuniu-pytest-sessions.lock"


@pytest.fixture(scope="session", autouse=True)
def _drop_the_session_leftovers() -> Iterator[None]:
    """Delete the Kafka topics this test session created, and the suite's schemas, once it is over.

    Every test and end-to-end stack writes to topics of its own prefix, so a suite run
    leaves ~350 topics (~1 400 partitions) behind; on a broker that lives across runs
    they pile up until its heap runs out. The system's own (unprefixed ``niuniu.``)
    topics and Kafka's internal ones are never touched.

    Each end-to-end stack makes four schemas (``e2e_<run>_<service>``) and leaves them to the
    end: a failed test's rows are there to read while the suite runs. Once the last session is
    out, no stack is running, so every schema of the suite's shapes (``SUITE_SCHEMAS``) is a
    leftover, those of killed sessions included: a development database had gathered 131.
    """
    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    before = _topics(servers) if servers else None
    # Sessions running side by side (several checkouts on one broker) hold this lock
    # shared; only the last one out, holding it alone, deletes what appeared meanwhile,
    # so no session loses topics under a running test.
    lock = open(_SESSIONS_LOCK, "a+")  # noqa: SIM115 - held for the whole session
    fcntl.flock(lock, fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        lock.close()
    if not alone:
        return
    if os.environ.get("DATABASE_URL"):
        with contextlib.suppress(Exception):  # a best effort, as below
            drop_schemas(os.environ["DATABASE_URL"], SUITE_SCHEMAS)
    if servers is None or before is None:
        return
    created = [t for t in (_topics(servers) or set()) - before if not t.startswith(("niuniu.", "__"))]
    with contextlib.suppress(Exception):  # a best effort: the next session's start does not depend on it
        admin = make_admin(servers, "niuniu-tests-cleanup")
        try:
            for i in range(0, len(created), 100):
                admin.delete_topics(created[i : i + 100], timeout_ms=30_000)
        finally:
            admin.close()


def _topics(servers: str) -> set[str] | None:
    try:
        admin = make_admin(servers, "niuniu-tests-cleanup")
    except Exception:
        return None
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


@pytest.fixture(scope="session")
def dsn(infra: dict[str, str]) -> str:
    return infra["DATABASE_URL"]


@pytest.fixture(scope="session")
def kafka_servers(infra: dict[str, str]) -> str:
    return infra["KAFKA_BOOTSTRAP_SERVERS"]


@pytest.fixture(scope="session")
def redis_url(infra: dict[str, str]) -> str:
    return infra["REDIS_URL"]


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topics, schemas, groups and keys of one test."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
async def schema(dsn: str, unique: str) -> AsyncIterator[str]:
    """A fresh PostgreSQL schema, dropped after the test."""
    name = f"t_{unique}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    yield name
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
