"""What the components underneath take here, measured with their own tools in a benchmark's run.

A benchmark's figure means little alone on a shared machine: it is printed next to what the
component underneath does in the same minutes, measured by that component's own tool, so the
client library's cost is not counted as the component's limit (a loop of one-row INSERTs from
one Python process measured about half of what pgbench commits here).

- PostgreSQL: ``pgbench`` (Debian's, from PostgreSQL's client package), one-row INSERT commits
  on 16 connections (``NIUNIU_PGBENCH``, else ``pgbench`` on the PATH);
- Kafka: its own ``ProducerPerformance`` and ``ConsumerPerformance`` (``org.apache.kafka.tools``,
  from the broker's jars: ``NIUNIU_KAFKA_LIBS``, run by ``NIUNIU_JAVA``, else ``java``),
  authenticating as the process's Kafka principal.

``scripts/infra up`` writes the three variables into ``.run/env``. A tool that is missing or
fails gives a ``Limit`` without a rate and the reason, never an exception: the benchmark's own
figures are still printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from kafka.errors import KafkaError
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from backbone.kafka import credentials_from_env, make_admin

PGBENCH_CLIENTS = 16
PGBENCH_SECONDS = 3
# A tool that has not finished this long after its own deadline is stopped.
TOOL_GRACE_S = 60.0
_KAFKA_TOOLS = "org.apache.kafka.tools"


@dataclass(frozen=True, slots=True)
class Limit:
    """A component's rate measured by its own tool (``per_s``; NaN when it could not be), and how."""

    per_s: float
    how: str

    @property
    def measured(self) -> bool:
        return not math.isnan(self.per_s)

    def ratio(self, rate: float) -> str:
        """``rate`` as a percentage of this limit (``n/a`` when there is none)."""
        return f"{100 * rate / self.per_s:.1f} %" if self.measured and self.per_s > 0 else "n/a"

    def __str__(self) -> str:
        return f"{self.per_s:.0f}/s ({self.how})" if self.measured else f"not measured ({self.how})"


def _unmeasured(why: str) -> Limit:
    return Limit(math.nan, why)


async def _run_tool(argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> tuple[int, str]:
    """Run ``argv`` with ``env`` added to this process's; (exit status, stdout and stderr); bounded."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **env},
        )
    except OSError as error:  # not there, not executable
        return -1, f"{argv[0]}: {error.strerror or error}"
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        return -1, f"still running after {timeout_s:.0f} s"
    return process.returncode or 0, output.decode(errors="replace")


def _last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"


# --- PostgreSQL ---------------------------------------------------------------------------------------

_PGBENCH_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)


def pgbench_binary() -> str | None:
    return os.environ.get("NIUNIU_PGBENCH") or shutil.which("pgbench")


def parse_pgbench(output: str) -> float | None:
    """Transactions per second from pgbench's report (without the connections' set-up)."""
    found = _PGBENCH_TPS.search(output)
    return float(found.group(1)) if found else None


async def pgbench_commits(dsn: str, *, clients: int = PGBENCH_CLIENTS, seconds: int = PGBENCH_SECONDS) -> Limit:
    """One-row INSERT commits per second, ``clients`` pgbench connections for ``seconds``."""
    how = f"pgbench, one-row INSERT commits, {clients} connections"
    binary = pgbench_binary()
    if binary is None:
        return _unmeasured("pgbench not found: set NIUNIU_PGBENCH (source .run/env)")
    table = f"probe_{uuid.uuid4().hex[:8]}"
    params = conninfo_to_dict(dsn)
    password = params.pop("password", None)
    env = {"PGPASSWORD": str(password)} if password is not None else {}  # not on the command line
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE TABLE {} (id BIGINT, at TIMESTAMPTZ)").format(sql.Identifier(table)))
    try:
        with tempfile.TemporaryDirectory(prefix="niuniu-pgbench-") as scratch:
            script = Path(scratch) / "insert.sql"
            script.write_text(f"INSERT INTO {table} VALUES (:client_id, now());\n")
            argv = [binary, "-n", "-c", str(clients), "-j", str(min(clients, os.cpu_count() or 1))]
            argv += ["-T", str(seconds), "-f", str(script), make_conninfo("", **params)]
            status, output = await _run_tool(argv, env, seconds + TOOL_GRACE_S)
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
    rate = parse_pgbench(output) if status == 0 else None
    return Limit(rate, how) if rate is not None else _unmeasured(f"pgbench failed: {_last_line(output)}")


# --- Kafka ----------------------------------------------------------------------------------------------


def _java_command() -> tuple[list[str], str] | tuple[None, str]:
    """The JVM command line that runs a class of Kafka's tools, or None and why not."""
    libs = os.environ.get("NIUNIU_KAFKA_LIBS", "")
    if not libs or not Path(libs).is_dir():
        return None, "Kafka's jars not found: set NIUNIU_KAFKA_LIBS (source .run/env)"
    java = os.environ.get("NIUNIU_JAVA") or shutil.which("java")
    if not java:
        return None, "java not found: set NIUNIU_JAVA"
    # The tools as scripts/infra runs them: a small heap, quiet logging.
    return [java, "-Xmx256m", "-XX:+UseSerialGC", "-Dlog4j2.level=ERROR", "-cp", f"{libs}/*"], ""


def _jaas_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


@contextlib.contextmanager
def _client_properties(bootstrap_servers: str) -> Iterator[Path]:
    """A client configuration file (0600, removed after) with the process's Kafka principal."""
    lines = [f"bootstrap.servers={bootstrap_servers}"]
    credentials = credentials_from_env()
    if credentials is not None:
        lines += [
            f"security.protocol={credentials.security_protocol}",
            f"sasl.mechanism={credentials.mechanism}",
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required"
            f' username="{_jaas_quote(credentials.username)}" password="{_jaas_quote(credentials.password)}";',
        ]
    with tempfile.TemporaryDirectory(prefix="niuniu-kafka-tool-") as scratch:
        path = Path(scratch) / "client.properties"
        path.touch(mode=0o600)
        path.write_text("\n".join(lines) + "\n")
        yield path


_PRODUCED = re.compile(r"^(\d+) records sent, ([0-9.]+) records/sec", re.MULTILINE)


def parse_producer_performance(output: str) -> float | None:
    """Records/s from ProducerPerformance's final line."""
    rates = [float(found.group(2)) for found in _PRODUCED.finditer(output)]
    return rates[-1] if rates else None


def parse_consumer_performance(output: str) -> tuple[int, float] | None:
    """(records, records/s while fetching, without the group's join) from ConsumerPerformance's report."""
    lines = [line.strip() for line in output.splitlines()]
    for at, line in enumerate(lines):
        if line.startswith("start.time") and at + 1 < len(lines):
            header = [h.strip() for h in line.split(",")]
            values = [v.strip() for v in lines[at + 1].split(",")]
            if len(values) != len(header):
                return None
            row = dict(zip(header, values, strict=True))
            try:
                return int(row["data.consumed.in.nMsg"]), float(row["fetch.nMsg.sec"])
            except (KeyError, ValueError):
                return None
    return None


async def kafka_producer_rate(bootstrap_servers: str, topic: str, *, records: int, record_size: int) -> Limit:
    """Records/s Kafka's own producer sends to ``topic`` (``acks=all``, as the relay's producer)."""
    how = f"Kafka's ProducerPerformance, {records} records of {record_size} bytes, acks=all"
    java, why = _java_command()
    if java is None:
        return _unmeasured(why)
    with _client_properties(bootstrap_servers) as config:
        argv = [*java, f"{_KAFKA_TOOLS}.ProducerPerformance", "--topic", topic, "--num-records", str(records)]
        argv += ["--record-size", str(record_size), "--throughput", "-1", "--producer.config", str(config)]
        argv += ["--producer-props", "acks=all"]
        status, output = await _run_tool(argv, {}, TOOL_GRACE_S)
    rate = parse_producer_performance(output) if status == 0 else None
    return Limit(rate, how) if rate is not None else _unmeasured(f"ProducerPerformance failed: {_last_line(output)}")


async def kafka_consumer_rate(bootstrap_servers: str, topics: Mapping[str, int]) -> Limit:
    """Records/s Kafka's own consumer reads: each of ``topics`` (name: its record count) from the start."""
    how = f"Kafka's ConsumerPerformance, {sum(topics.values())} records from the topics' start"
    java, why = _java_command()
    if java is None:
        return _unmeasured(why)
    read, seconds = 0, 0.0
    group = f"niuniu-perf-{uuid.uuid4().hex[:8]}"
    try:
        with _client_properties(bootstrap_servers) as config:
            for topic, records in topics.items():
                if records <= 0:
                    continue
                argv = [*java, f"{_KAFKA_TOOLS}.ConsumerPerformance", "--bootstrap-server", bootstrap_servers]
                argv += ["--topic", topic, "--messages", str(records), "--consumer.config", str(config)]
                argv += ["--group", group, "--timeout", "30000"]
                status, output = await _run_tool(argv, {}, TOOL_GRACE_S)
                parsed = parse_consumer_performance(output) if status == 0 else None
                if parsed is None or parsed[1] <= 0:
                    return _unmeasured(f"ConsumerPerformance failed: {_last_line(output)}")
                read += parsed[0]
                seconds += parsed[0] / parsed[1]
    finally:
        await asyncio.to_thread(_forget_group, bootstrap_servers, group)
    return Limit(read / seconds, how) if seconds > 0 else _unmeasured("no records to read")


def _forget_group(bootstrap_servers: str, group: str) -> None:
    """Delete the tool's consumer group (its committed offsets), if it made one; a failure to is left alone
    (a group never joined answers an error: nothing to delete)."""
    with contextlib.suppress(KafkaError):
        admin = make_admin(bootstrap_servers, "niuniu-limits")
        try:
            admin.delete_groups([group])
        finally:
            admin.close()
