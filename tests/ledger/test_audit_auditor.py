"""The auditor's path end to end: ``niuniu-audit replay`` with auditor credentials only.

The four services run as processes, each on its own database and role (as in
production), under the topic prefix ``audited-<id>.`` that the local broker lets the
auditor's principal read. An auditor account is created with the wallet's admin tool;
the audit then runs with nothing but the auditor's credentials: the read-only
PostgreSQL role ``niuniu_auditor``, which may connect to the ledger's database only (its
one extra right, CREATEDB, for the scratch database it creates and drops), the Kafka
principal ``niuniu_auditor`` (read-only ACLs) and a token from the wallet's Login. A
Golden Bull table keeps playing during the audit; the report must still be OK (the wallet
is compared at a consistent cut). A journal row altered afterwards is found.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import random
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import psycopg
import pytest
from kafka import KafkaProducer
from kafka.errors import KafkaError
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from niuniu.wallet.v1 import wallet_pb2
from psycopg import sql

from services.ledger import audit, audit_login

E2E = Path(__file__).resolve().parents[1] / "e2e"
if str(E2E) not in sys.path:
    sys.path.insert(0, str(E2E))  # the end-to-end stack and its clients, imported by their bare names

from play import Watcher, connect, kind, settle_everything, update_is  # noqa: E402  (tests/e2e on the path)
from players import Clients, Player, register  # noqa: E402
from stack import BIN, ROOT, SERVICES, Stack  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

AUDITED_PREFIX = "audited-"  # deploy/local/kafka/provision.py: the auditor may read these test topics
AUDITS_TO_SEE_PLAY_GO_ON = 10

FAST = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=5_000,
    chips_minor=[100],
    betting_seconds=1,
    reveal_interval_ms=10,
    pause_between_rounds_ms=50,
)
DEPOSIT_MINOR = 1_000_000


class AuditedStack(Stack):
    """The e2e stack with each service on its own database (``NIUNIU_<SERVICE>_DSN``, its own role)."""

    @property
    def prefix(self) -> str:
        return f"{AUDITED_PREFIX}{self.run_id}."

    def env(self, service: str) -> dict[str, str]:
        env = super().env(service)
        env[f"NIUNIU_{service.upper()}_DSN"] = own_dsn(service)
        return env


def own_dsn(service: str) -> str:
    dsn = os.environ.get(f"NIUNIU_{service.upper()}_DSN", "")
    if not dsn:
        pytest.skip(f"NIUNIU_{service.upper()}_DSN not set (scripts/infra up writes it to .run/env)")
    return dsn


def auditor_dsn(database: str = "niuniu_ledger") -> str:
    dsn = os.environ.get("NIUNIU_AUDITOR_DSN", "")
    if not dsn:
        pytest.skip("NIUNIU_AUDITOR_DSN not set (scripts/infra up writes it to .run/env)")
    return psycopg.conninfo.make_conninfo(dsn, dbname=database)


@pytest.fixture(scope="module")
def stack(infra: dict[str, str]) -> Iterator[AuditedStack]:
    for service in SERVICES:
        own_dsn(service)
    run_id = uuid.uuid4().hex[:8]
    system = AuditedStack(run_id, infra, ROOT / ".run" / "e2e" / run_id)
    try:
        system.start_all()
        yield system
    finally:
        system.stop_all()
        for service in SERVICES:
            schema = sql.Identifier(system.schema_of(service))
            with psycopg.connect(own_dsn(service), autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(schema))


@pytest.fixture(scope="module")
def auditor_login(stack: AuditedStack, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """An auditor account made with the wallet's admin tool: (username, password file)."""
    username = f"aud{stack.run_id}"
    password_file = tmp_path_factory.mktemp("auditor") / "password"
    password_file.write_text(f"{uuid.uuid4().hex}-audit\n")
    password_file.chmod(0o600)
    made = subprocess.run(
        [sys.executable, "-m", "services.wallet.admin", "create", "--role", "auditor", "--username", username,
         "--email", f"{username}@example.org", "--password-file", str(password_file)],
        env=stack.env("wallet"), cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return username, password_file


def auditor_env(kafka_principals: dict[str, tuple[str, str]]) -> dict[str, str]:
    """Only what an outside auditor holds: no service DSN, no test principal, no signing key, no development mode."""
    user, password = kafka_principals.get("auditor", ("", ""))
    if not user:
        pytest.skip("no auditor Kafka principal (NIUNIU_AUDITOR_KAFKA_USER in .run/env)")
    # PYTHONPATH: the checkout under test runs, not the one installed.
    keep = (
        "PATH",
        "HOME",
        "LANG",
        "PYTHONPATH",
        "KAFKA_BOOTSTRAP_SERVERS",
        "KAFKA_SECURITY_PROTOCOL",
        "KAFKA_SASL_MECHANISM",
    )
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["NIUNIU_AUDITOR_DSN"] = auditor_dsn()
    env["NIUNIU_AUDITOR_KAFKA_USER"], env["NIUNIU_AUDITOR_KAFKA_PASSWORD"] = user, password
    return env


async def run_audit(
    stack: AuditedStack, login: tuple[str, Path], kafka_principals: dict[str, tuple[str, str]]
) -> tuple[int, str]:
    argv = ["replay", "--schema", stack.schema_of("ledger"), "--topic-prefix", stack.prefix, "--no-progress"]
    return await audit_as_auditor(stack, login, kafka_principals, argv)


async def audit_as_auditor(
    stack: AuditedStack, login: tuple[str, Path], kafka_principals: dict[str, tuple[str, str]], argv: list[str]
) -> tuple[int, str]:
    """``niuniu-audit ARGV`` logging in as the auditor, with nothing but the auditor's credentials."""
    username, password_file = login
    argv = [*argv, "--wallet", stack.addr("wallet"), "--username", username, "--password-file", str(password_file)]
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "niuniu-audit"), *argv, env=auditor_env(kafka_principals), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


class Play:
    """Players betting on every round of one Golden Bull table, in the background."""

    def __init__(self, c: Clients, players: list[Player], table_id: str) -> None:
        self.c, self.players, self.table_id = c, players, table_id
        self.watcher = Watcher(c, players[0], table_id)
        self.settled: list[str] = []
        self._stop = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        rng = random.Random(1919)
        seen: set[str] = set()
        while not self._stop.is_set():
            opened = await self.watcher.wait_for(lambda u: kind(u) == "round_opened" and u.round_id not in seen)
            seen.add(opened.round_id)
            for p in self.players:
                request = table_pb2.PlaceBetRequest(
                    command_id=f"{opened.round_id}.{p.name}",
                    table_id=self.table_id,
                    area=rng.choice(["area_1", "area_2", "area_3"]),
                    amount_minor=100 * rng.randint(1, 10),
                    round_id=opened.round_id,
                )
                with contextlib.suppress(grpc.aio.AioRpcError):  # a window closing under the bet
                    await self.c.table.PlaceBet(request, metadata=p.auth)
            await self.watcher.wait_for(update_is("result", opened.round_id))
            self.settled.append(opened.round_id)

    async def until_settled(self, rounds: int) -> None:
        while len(self.settled) < rounds:
            assert not self.task.done(), self.task.exception()
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.task), 30)
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.watcher.stop()


@contextlib.asynccontextmanager
async def playing(stack: AuditedStack) -> AsyncIterator[tuple[Clients, Play]]:
    async with connect(stack) as c:
        players = [await register(c, f"a{i}x{stack.run_id}", DEPOSIT_MINOR) for i in range(3)]
        table_id = f"audited-{stack.run_id}"
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="golden_bull", limits=FAST), metadata=c.admin
        )
        play = Play(c, players, table_id)
        try:
            yield c, play
        finally:
            await play.stop()
            await settle_everything(c, players)


async def wallet_position(c: Clients) -> int:
    page = await c.wallet.ListBalances(wallet_pb2.ListBalancesRequest(page_size=1), metadata=c.auditor)
    return int(page.store_position)


def no_write_grant_anywhere(schema: str) -> None:
    """The auditor's role: no superuser, no write role, no INSERT/UPDATE/DELETE/TRUNCATE, no CREATE."""
    with psycopg.connect(auditor_dsn()) as conn:
        row = conn.execute(
            "SELECT rolsuper, rolcreaterole, rolbypassrls,"
            " pg_has_role(current_user, 'pg_write_all_data', 'MEMBER'),"
            " has_database_privilege(current_database(), 'CREATE')"
            " FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert row == (False, False, False, False, False), row
        writable = conn.execute(
            "SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S')"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
            " AND (has_table_privilege(c.oid, 'INSERT') OR has_table_privilege(c.oid, 'UPDATE')"
            "   OR has_table_privilege(c.oid, 'DELETE') OR has_table_privilege(c.oid, 'TRUNCATE'))"
        ).fetchall()
        assert writable == [], writable[:5]
        creatable = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE has_schema_privilege(oid, 'CREATE')"
            " AND nspname NOT LIKE 'pg_temp%' AND nspname NOT LIKE 'pg_toast_temp%'"
        ).fetchall()
        assert creatable == [], creatable
    with psycopg.connect(auditor_dsn()) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(sql.SQL("DELETE FROM {}.journal_lines").format(sql.Identifier(schema)))


def no_secret_within_reach(stack: AuditedStack) -> None:
    """The auditor's role reads neither the server seed of a round the table has open (``rng_rounds``,
    the rng's database) nor the wallet's password hashes (``wallet_users``): it may not connect to the
    rng's, the table's or the wallet's database at all, whatever round is open when it asks."""
    with psycopg.connect(own_dsn("rng")) as conn:
        rng_rounds = sql.SQL("{}.rng_rounds").format(sql.Identifier(stack.schema_of("rng")))
        seeds = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(rng_rounds))
        assert seeds.fetchone() != (0,), "no server seed at the rng to hide"
    for database in ("niuniu_rng", "niuniu_table", "niuniu_wallet"):
        with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
            psycopg.connect(auditor_dsn(database), connect_timeout=5).close()


def kafka_write_refused(topic: str, kafka_principals: dict[str, tuple[str, str]]) -> None:
    user, password = kafka_principals["auditor"]
    producer = KafkaProducer(
        bootstrap_servers=os.environ["KAFKA_BOOTSTRAP_SERVERS"],
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=os.environ.get("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
        sasl_plain_username=user,
        sasl_plain_password=password,
        enable_idempotence=False,
        acks=1,
        max_block_ms=10_000,
        retries=0,
    )
    try:
        with pytest.raises(KafkaError) as refused:
            producer.send(topic, b"forged").get(timeout=15)
        assert "Authorization" in type(refused.value).__name__, refused.value
    finally:
        producer.close(timeout=5)


async def test_an_auditor_with_no_write_grant_reconciles_a_table_in_play(
    stack: AuditedStack, auditor_login: tuple[str, Path], kafka_principals: dict[str, tuple[str, str]]
) -> None:
    no_write_grant_anywhere(stack.schema_of("ledger"))
    kafka_write_refused(f"{stack.prefix}niuniu.wallet.events", kafka_principals)

    # An audit can end before the table's next movement (a round is about 1.5 s here): audited again,
    # each audit clean, until one ran while a round settled and the wallet moved past its cut.
    spans: list[tuple[tuple[int, int], int, tuple[int, int]]] = []
    async with playing(stack) as (c, play):
        await play.until_settled(2)
        no_secret_within_reach(stack)
        for _ in range(AUDITS_TO_SEE_PLAY_GO_ON):
            before = (len(play.settled), await wallet_position(c))
            code, report = await run_audit(stack, auditor_login, kafka_principals)
            after = (len(play.settled), await wallet_position(c))
            assert play.task.done() is False, "the table stopped playing during the audit"

            print(report)  # the reconciliation report, for the record (pytest -s)
            assert code == audit.EXIT_OK, report
            assert "differences: 0" in report and "RESULT: OK" in report, report
            assert "may be timing" not in report, report
            reconciled = re.search(r"rounds +table vs wallet: (\d+) applied, 0 refused", report)
            assert reconciled and int(reconciled.group(1)) >= 2, report  # at least the two rounds played first
            cut = re.search(r"cut +the wallet's balances at wallet position (\d+)", report)
            scratch = re.search(r"scratch +database (niuniu_audit_\w+) \(created for this audit", report)
            assert cut and scratch, report
            assert before[1] <= int(cut.group(1)) <= after[1], (before, cut.group(1), after)
            with psycopg.connect(auditor_dsn()) as conn:
                left = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (scratch.group(1),)).fetchall()
            assert left == [], f"scratch database {scratch.group(1)} was not dropped"
            spans.append((before, int(cut.group(1)), after))
            if int(cut.group(1)) < after[1] and after[0] > before[0]:
                break
    # Play went on during an audit: a round settled and the wallet moved past the cut it compared at.
    assert any(cut < after[1] and after[0] > before[0] for before, cut, after in spans), spans

    # The auditor's token reads, and writes nothing.
    username, password_file = auditor_login
    token = await audit_login.login(stack.addr("wallet"), username, password_file.read_text().splitlines()[0])
    async with connect(stack) as c:
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await c.wallet.Deposit(
                wallet_pb2.DepositRequest(request_id=f"aud-{stack.run_id}", account="player:x", amount_minor=1),
                metadata=(("authorization", f"Bearer {token}"),),
            )
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED, denied.value


async def test_the_auditor_finds_an_altered_journal_row(
    stack: AuditedStack, auditor_login: tuple[str, Path], kafka_principals: dict[str, tuple[str, str]]
) -> None:
    async with playing(stack) as (_, play):
        await play.until_settled(1)
    schema = stack.schema_of("ledger")
    # The ledger's own role (the tables' owner) alters one line behind the append-only triggers.
    with psycopg.connect(own_dsn("ledger"), autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        row = conn.execute(
            "SELECT entry_id, line_no FROM journal_lines WHERE credit_minor > 0 AND account LIKE 'player:%'"
            " ORDER BY entry_id LIMIT 1"
        ).fetchone()
        assert row is not None
        entry_id = str(row[0])
        with conn.transaction():
            conn.execute("ALTER TABLE journal_lines DISABLE TRIGGER USER")
            conn.execute(
                "UPDATE journal_lines SET credit_minor = credit_minor + 7 WHERE entry_id = %s AND line_no = %s", row
            )
            conn.execute("ALTER TABLE journal_lines ENABLE TRIGGER USER")

    code, report = await run_audit(stack, auditor_login, kafka_principals)
    assert code == audit.EXIT_DIFFERENCES, report
    assert "RESULT: FAILED" in report, report
    assert re.search(rf"\[journal\] entry {re.escape(entry_id)}: line \d+: ", report), report
    assert "[trial_balance] live journal" in report, report


async def test_an_auditor_verifies_a_round_from_its_seed_with_its_login_alone(
    stack: AuditedStack, auditor_login: tuple[str, Path], kafka_principals: dict[str, tuple[str, str]]
) -> None:
    """verify-round's recompute reads the round from the table with the token of the auditor's Login
    (before, it could only mint one from the issuer key, which an outside auditor does not hold)."""
    async with playing(stack) as (_, play):
        await play.until_settled(1)
    argv = ["verify-round", play.settled[0], "--schema", stack.schema_of("ledger"), "--table", stack.addr("table")]
    code, report = await audit_as_auditor(stack, auditor_login, kafka_principals, argv)
    assert code == audit.EXIT_OK, report
    assert "recompute: done" in report and "RESULT: OK" in report, report
    assert "minted" not in report, report


async def test_a_bet_whose_hold_the_wallet_shrank_is_a_difference(
    stack: AuditedStack, auditor_login: tuple[str, Path], kafka_principals: dict[str, tuple[str, str]]
) -> None:
    """The table's record and the wallet's split apart (the bet's hold made smaller through the wallet's
    own API, as a ChangeBet that lost a race left it): the replay names the bet, and the round when the
    wallet refused its settlement, as differences; before, it printed RESULT: OK."""
    async with connect(stack) as c:
        player = await register(c, f"split{stack.run_id}", DEPOSIT_MINOR)
        table_id = f"split-{stack.run_id}"
        limits = ev.TableLimits()
        limits.CopyFrom(FAST)
        limits.betting_seconds = 3  # room for the resize inside the window
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="golden_bull", limits=limits), metadata=c.admin
        )
        watcher = Watcher(c, player, table_id)
        try:
            opened = await watcher.wait_for(lambda u: kind(u) == "round_opened")
            receipt = await c.table.PlaceBet(
                table_pb2.PlaceBetRequest(
                    command_id=f"split.{stack.run_id}", table_id=table_id, area="area_1", amount_minor=5_000,
                    round_id=opened.round_id,
                ),
                metadata=player.auth,
            )  # fmt: skip
            await c.wallet.ResizeHold(
                wallet_pb2.ResizeHoldRequest(resize_id=f"shrink.{stack.run_id}", hold_id=receipt.hold_id,
                                             amount_minor=1),
                metadata=c.admin,
            )  # fmt: skip
            await watcher.wait_for(update_is("result", opened.round_id))
            settlement = await wallet_answer(c, opened.round_id)
        finally:
            await watcher.stop()

    code, report = await run_audit(stack, auditor_login, kafka_principals)
    print(report)  # the reconciliation report, for the record (pytest -s)
    assert code == audit.EXIT_DIFFERENCES, report
    assert "RESULT: FAILED" in report, report
    needs = f"the table's record needs a hold of {receipt.hold_minor}, the wallet holds 1"
    assert f"[holds] bet {receipt.bet_id} (round {opened.round_id}): {needs}" in report, report
    refused = f"[settlement] round {opened.round_id}: settled by the table, refused by the wallet"
    if settlement.status == "rejected":  # the player lost more than the 1 held
        assert f"{refused} ({settlement.reason})" in report, report
    else:
        assert refused not in report, report


async def wallet_answer(c: Clients, round_id: str) -> wallet_pb2.RoundSettlement:
    """The wallet's answer to the round's settlement, once it has one."""
    request = wallet_pb2.GetRoundSettlementRequest(round_id=round_id)
    for _ in range(300):
        with contextlib.suppress(grpc.aio.AioRpcError):  # NOT_FOUND: not consumed yet
            answer = await c.wallet.GetRoundSettlement(request, metadata=c.admin)
            if answer.status:
                return answer
        await asyncio.sleep(0.1)
    raise AssertionError(f"the wallet never answered round {round_id}")


def test_outside_development_the_audit_takes_no_token_it_was_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """No login, no NIUNIU_AUDITOR_TOKEN and not development mode: exit 2, nothing minted, nothing read."""
    monkeypatch.delenv("NIUNIU_ENV", raising=False)
    monkeypatch.delenv("NIUNIU_AUDITOR_TOKEN", raising=False)
    monkeypatch.delenv("NIUNIU_AUDITOR_USERNAME", raising=False)
    err = io.StringIO()
    argv = ["replay", "--wallet", "127.0.0.1:9", "--dsn", "postgresql://nobody@127.0.0.1:9/none", "--no-progress"]
    assert audit.main(argv, out=io.StringIO(), err=err) == audit.EXIT_ERROR
    assert "no auditor credentials" in err.getvalue(), err.getvalue()
