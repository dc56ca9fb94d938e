"""One bet is one trace: from the browser gateway through the table and the wallet to the ledger's journal.

The four services and the gateway run as separate processes with ``NIUNIU_OTLP_ENDPOINT`` pointing at a
tiny OTLP/HTTP receiver in this test, which keeps every span it is sent. A bet placed through the
gateway must come back as spans of one trace id from all four of gateway, table, wallet and ledger.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import aiohttp
import pytest
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from play import connect
from players import register
from stack import Stack, free_port, running_stack, start_gateway, stop

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TABLE = "/niuniu.table.v1.Table/"
FAST = ev.TableLimits(
    min_bet_minor=100, max_bet_minor=5_000, chips_minor=[100], betting_seconds=2, reveal_interval_ms=10,
    pause_between_rounds_ms=200,
)  # fmt: skip
Span = tuple[str, str, str]  # (trace id, service.name, span name)


class Collector(ThreadingHTTPServer):
    spans: list[Span]


class Receiver(BaseHTTPRequestHandler):
    """POST /v1/traces (OTLP/HTTP, protobuf): the spans kept, 200 answered."""

    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            names = [a.value.string_value for a in resource.resource.attributes if a.key == "service.name"]
            for scope in resource.scope_spans:
                self.server.spans.extend((s.trace_id.hex(), names[0] if names else "", s.name) for s in scope.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    server = Collector(("127.0.0.1", free_port()), Receiver)
    server.spans = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def stack(infra: dict[str, str], collector: Collector) -> Iterator[Stack]:
    """The four services, exporting their spans to ``collector`` every 200 ms."""
    settings = {
        "NIUNIU_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_address[1]}",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        with running_stack(infra, uuid.uuid4().hex[:8]) as system:
            yield system
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        yield s


async def call(session: aiohttp.ClientSession, gateway: str, method: str, body: dict[str, Any], token: str) -> Any:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    async with session.post(gateway + TABLE + method, data=json.dumps(body), headers=headers) as answer:
        return await answer.json(content_type=None)


async def test_one_bet_is_one_trace_from_the_gateway_to_the_ledger(
    stack: Stack, collector: Collector, session: aiohttp.ClientSession
) -> None:
    table_id = f"traced-{stack.run_id}"
    async with connect(stack) as c:
        player = await register(c, f"tr{stack.run_id}", 100_000)
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="golden_bull", limits=FAST), metadata=c.admin
        )
    proc, gateway = start_gateway(stack, "gateway-traced")
    try:
        round_id = ""
        for _ in range(600):
            info = await call(session, gateway, "GetTable", {"tableId": table_id}, player.token)
            if info.get("phase") == "betting" and int(info.get("bettingClosesAtUnixMs", "0")) > 0:
                round_id = info["currentRoundId"]
                break
            await asyncio.sleep(0.1)
        bet = {"commandId": f"bet-{stack.run_id}", "tableId": table_id, "area": "area_1", "amountMinor": "100"}
        receipt = await call(session, gateway, "PlaceBet", {**bet, "roundId": round_id}, player.token)
        assert receipt.get("status") == "placed", receipt
        wanted = {"niuniu-gateway", "niuniu-table", "niuniu-wallet", "niuniu-ledger"}
        for _ in range(300):
            roots = {t for t, service, name in collector.spans if service == "niuniu-gateway" and "PlaceBet" in name}
            services = {service for t, service, _ in collector.spans if t in roots}
            if len(roots) == 1 and wanted <= services:
                break
            await asyncio.sleep(0.1)
    finally:
        stop(proc)
    assert len(roots) == 1, roots
    trace_id = next(iter(roots))
    spans = [(service, name) for t, service, name in collector.spans if t == trace_id]
    assert {service for service, _ in spans} >= wanted, spans
    assert ("niuniu-wallet", "niuniu.wallet.v1.Wallet/PlaceHolds") in spans or any(
        s == "niuniu-wallet" and "PlaceHold" in n for s, n in spans
    ), spans
    assert any(s == "niuniu-ledger" and "niuniu.wallet.events" in n for s, n in spans), spans
