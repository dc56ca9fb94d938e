"""The real system for the frontend tests: the four services, the browser gateway in front,
tables made fast for watching, and funded players who log in with a password.

Shared by tests/clients (the TypeScript SDK) and tests/browser (the web table in Chromium).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

E2E = Path(__file__).resolve().parents[1] / "e2e"
if str(E2E) not in sys.path:
    sys.path.insert(0, str(E2E))  # the end-to-end stack and its clients, imported by their bare names

import grpc  # noqa: E402
from niuniu.table.v1 import events_pb2 as ev  # noqa: E402
from niuniu.table.v1 import table_pb2  # noqa: E402
from players import Clients, Player, register  # noqa: E402
from stack import BIN, ROOT, Stack, free_port, running_stack, start_gateway, stop  # noqa: E402

SDK = ROOT / "clients" / "typescript"
WEB = ROOT / "clients" / "web"
FUNDING_MINOR = 1_000_000
__all__ = [
    "BIN",
    "FUNDING_MINOR",
    "GOLDEN_LIMITS",
    "ROOT",
    "SDK",
    "WEB",
    "Credentials",
    "Stack",
    "connect",
    "create_table",
    "free_port",
    "funded_players",
    "node_env",
    "npm_build",
    "running_stack",
    "start_gateway",
    "stop",
]

GOLDEN_LIMITS = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=20_000,
    chips_minor=[100, 500, 1_000],
    betting_seconds=4,
    reveal_interval_ms=300,
    pause_between_rounds_ms=800,
)


@dataclass
class Credentials:
    username: str
    password: str
    player: Player


@contextlib.asynccontextmanager
async def connect(stack: Stack) -> AsyncIterator[Clients]:
    from players import clients

    async with (
        grpc.aio.insecure_channel(stack.addr("wallet")) as w,
        grpc.aio.insecure_channel(stack.addr("table")) as t,
        grpc.aio.insecure_channel(stack.addr("ledger")) as lg,
    ):
        yield clients(w, t, lg)


async def create_table(
    c: Clients, table_id: str, variant: str, limits: ev.TableLimits, config: dict[str, str] | None = None
) -> None:
    await c.table.CreateTable(
        table_pb2.CreateTableRequest(table_id=table_id, variant=variant, limits=limits, config=config or {}),
        metadata=c.admin,
    )


async def funded_players(c: Clients, names: list[str]) -> list[Credentials]:
    """Players registered through the wallet (password ``<name>-secret-pw``), funded by the admin."""
    return [Credentials(name, f"{name}-secret-pw", await register(c, name, FUNDING_MINOR)) for name in names]


def npm_build(package: Path, *inputs: Path) -> None:
    """Build an npm package of clients/ if its sources (or ``inputs``) are newer than its output (offline)."""
    if not (package / "node_modules").is_dir():
        raise RuntimeError(f"{package} has no node_modules: run scripts/bootstrap first")
    out = package / "dist"
    newest_source = max(
        (
            p.stat().st_mtime
            for root in (package, *inputs)
            for p in root.rglob("*")
            if p.is_file() and not _generated(root, p)
        ),
        default=0.0,
    )
    newest_proto = max((p.stat().st_mtime for p in (ROOT / "protos").rglob("*.proto")), default=0.0)
    built = min((p.stat().st_mtime for p in out.rglob("*.js")), default=0.0) if out.is_dir() else 0.0
    if built >= max(newest_source, newest_proto):
        return
    subprocess.run(["npm", "run", "build"], cwd=package, check=True, capture_output=True, timeout=300)


def _generated(package: Path, path: Path) -> bool:
    parts = path.relative_to(package).parts
    return parts[0] in {"node_modules", "dist"} or parts[:2] == ("src", "gen")


def node_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIUNIU_SDK_")}
    env.update(extra)
    return env
