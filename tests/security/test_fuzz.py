"""Hostile input, generated: every RPC of every service, every role, random and boundary messages.

The request messages are built from the protobuf descriptors (so a field added to a
contract is fuzzed without touching this file): each field gets random and boundary
values of its type — empty, huge (1 MiB), unicode digits ('²', '①', '١٢٣'), control
characters, ids with a trailing newline or NUL, negative and huge integers (2^62,
2^63-1), unknown enum values, nested messages, repeated and map fields — mixed with the
ids of a real world (players, tables, rounds, bets, holds), so generated requests get
past the first check and reach the deeper ones. Each is sent as one of the roles
(anonymous, a forged token, two players, admin, auditor, the services) to the real
four-process system.

For every call: the status is never INTERNAL or UNKNOWN, a refusal carries a reason
(``niuniu-reason``) and a bounded message that echoes at most a short piece of any
value it was sent, and a refused call changes no balance (every balance is read
through the wallet before and after it).

``NIUNIU_FUZZ_EXAMPLES`` (default 40) is the number of generated cases per RPC; the
counts per RPC and status are printed at the end of the run.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from niuniu.ledger.v1 import ledger_pb2
from niuniu.rng.v1 import rng_pb2
from niuniu.table.v1 import events_pb2 as table_events
from niuniu.table.v1 import table_pb2
from niuniu.wallet.v1 import wallet_pb2
from players import TOKENS, Player, all_balances, clients, register
from stack import Stack

from backbone.auth import Role, Tokens, bearer
from backbone.errors import MAX_MESSAGE_CHARS, REASON_METADATA_KEY
from backbone.grpcserver import MAX_RECEIVE_MESSAGE_BYTES

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLES = int(os.environ.get("NIUNIU_FUZZ_EXAMPLES", "40"))
MAX_ECHO = 100
"""No refusal may contain this many consecutive characters of a value it was sent."""
UNARY_TIMEOUT_S = 30.0
STREAM_WINDOW_S = 0.4
NEVER = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
DOOR = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
SERVICES = {
    "wallet": wallet_pb2.DESCRIPTOR.services_by_name["Wallet"],
    "table": table_pb2.DESCRIPTOR.services_by_name["Table"],
    "ledger": ledger_pb2.DESCRIPTOR.services_by_name["Ledger"],
    "rng": rng_pb2.DESCRIPTOR.services_by_name["Rng"],
}
RPCS = [(name, method.name) for name, service in SERVICES.items() for method in service.methods]
ROLES = (
    "anonymous",
    "garbage",
    "forged_admin",
    "alice",
    "bob",
    "admin",
    "auditor",
    "service_table",
    "service_ledger",
    "service_rng",
)
SYSTEM = ("house", "commission_revenue", "rebate_expense", "jackpot_pool", "fees", "external:cashier")
MIB = "x" * (1 << 20)
BETTING_SECONDS = 600  # no round the fuzz bets on settles while it runs: balances move only by its own calls

# ------------------------------------------------------------------------------ the world


@dataclass
class World:
    """The real system with two players, a table of each variant, a bet and a hold: the values a
    request needs to get past its first check (per field name), and who may call what."""

    stack: Stack
    loop: asyncio.AbstractEventLoop
    channels: dict[str, grpc.aio.Channel]
    metadata: dict[str, tuple[tuple[str, str], ...]]
    pools: dict[str, list[str]]
    balances: dict[str, tuple[int, int]] = field(default_factory=dict)
    authorized: dict[str, list[str]] = field(default_factory=dict)
    """Per RPC, the roles an empty request is not refused for (UNAUTHENTICATED, PERMISSION_DENIED):
    most cases are sent as one of them, so they get past the door and reach the checks behind it."""
    fresh: int = 0

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def good_strings(self, name: str) -> list[str]:
        return self.pools.get(name) or self.pools["*"]


def _mint() -> dict[str, tuple[tuple[str, str], ...]]:
    """Staff and service credentials as the e2e helpers mint them (players come from Login)."""
    forger = Tokens.ephemeral()  # keys of its own: nothing of the deployment's
    return {
        "anonymous": (),
        "garbage": (("authorization", "Bearer not.a.token"),),
        "forged_admin": bearer(forger.issue(str(uuid.uuid4()), Role.ADMIN)),
        "admin": bearer(TOKENS.issue(str(uuid.uuid4()), Role.ADMIN)),
        "auditor": bearer(TOKENS.issue(str(uuid.uuid4()), Role.AUDITOR)),
        "service_table": bearer(TOKENS.service_token("table")),
        "service_ledger": bearer(TOKENS.service_token("ledger")),
        "service_rng": bearer(TOKENS.service_token("rng")),
    }


async def _build(stack: Stack, loop: asyncio.AbstractEventLoop) -> World:
    channels = {name: grpc.aio.insecure_channel(stack.addr(name)) for name in SERVICES}
    c = clients(channels["wallet"], channels["table"], channels["ledger"])
    metadata = _mint()
    alice: Player = await register(c, f"alice{stack.run_id}", 5_000_000)
    bob: Player = await register(c, f"bob{stack.run_id}", 5_000_000)
    metadata["alice"], metadata["bob"] = alice.auth, bob.auth
    admin = metadata["admin"]
    limits = table_events.TableLimits(
        min_bet_minor=100, max_bet_minor=100_000, chips_minor=[100], betting_seconds=BETTING_SECONDS
    )
    tables, variants, areas, keys, values = [], [], [], [], []
    for variant in ("golden_bull", "bai_buu", "baibian_bull", "red_envelope_bull"):
        table_id = f"fz-{variant.replace('_', '-')}-{stack.run_id}"
        info = await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant=variant, limits=limits), metadata=admin
        )
        tables.append(table_id)
        variants.append(variant)
        areas += list(info.areas)
        keys += list(info.config)
        values += list(info.config.values())
    golden = tables[0]
    deadline = time.monotonic() + 60
    while True:
        info = await c.table.GetTable(table_pb2.GetTableRequest(table_id=golden), metadata=admin)
        if info.phase == "betting":
            break
        assert time.monotonic() < deadline, "the golden bull table never opened a round"
        await asyncio.sleep(0.2)
    bet = await c.table.PlaceBet(
        table_pb2.PlaceBetRequest(
            command_id="fz-bet-1", table_id=golden, area=info.areas[0], amount_minor=100, round_id=info.current_round_id
        ),
        metadata=alice.auth,
    )
    hold = await c.wallet.PlaceHold(
        wallet_pb2.PlaceHoldRequest(hold_id="fz-hold-1", account=bob.account, amount_minor=1_000, reason="fuzz"),
        metadata=metadata["service_table"],
    )
    rounds = [info.current_round_id, f"{golden}-r1"]
    accounts = [alice.account, bob.account, *SYSTEM]
    account_ids = [a.removeprefix("player:") for a in (alice.account, bob.account)]
    pools = {
        "account": accounts,
        "payee": accounts,
        "player": accounts,
        "account_id": account_ids,
        "table_id": tables,
        "round_id": rounds,
        "bet_id": [bet.bet_id],
        "hold_id": [hold.hold.hold_id, "FRESH"],
        "command_id": ["FRESH", "fz-bet-1"],
        "request_id": ["FRESH", "dep-1"],
        "resize_id": ["FRESH"],
        "area": areas,
        "variant": variants,
        "username": ["FRESH", f"alice{stack.run_id}"],
        "email": ["fz@example.org"],
        "password": ["correct-horse-battery", f"alice{stack.run_id}-secret-pw"],
        "page_token": [""],
        "reason": ["fuzz"],
        "purpose": ["deck", "envelope"],
        "client_seed": ["abc"],
        "client_seeds": ["abc"],
        "cards": ["AS", "TD", "KH"],
        "key": keys,
        "value": values,
    }
    pools["*"] = sorted({v for values_ in pools.values() for v in values_ if v not in ("", "FRESH")})
    world = World(stack, loop, channels, metadata, pools)
    for service, rpc in RPCS:
        method = SERVICES[service].methods_by_name[rpc]
        empty = message_factory.GetMessageClass(method.input_type)()
        outcomes = {role: await call(world, service, method, empty, role) for role in ROLES}
        passed = [role for role, o in outcomes.items() if o.code not in DOOR]
        world.authorized[f"{service}.{rpc}"] = passed or list(ROLES)
    world.balances = await all_balances(c)
    return world


@pytest.fixture(scope="module")
def world(stack: Stack) -> Iterator[World]:
    loop = asyncio.new_event_loop()
    built = loop.run_until_complete(_build(stack, loop))
    try:
        yield built
    finally:
        for channel in built.channels.values():
            loop.run_until_complete(channel.close())
        loop.close()


# ------------------------------------------------------------------------------ values from descriptors

INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
HOSTILE_STRINGS = [
    "",
    " ",
    "\n",
    "\x00",
    "²",
    "①",
    "١٢٣",
    "-1",
    "9" * 19,
    "9" * 40,
    "%s%n",
    "' OR '1'='1",
    "\u202egnp.exe",
    "😀" * 5,
    "a" * 129,
    "c" * 10_000,
    MIB,
]
MUTATIONS = [
    lambda v: v + "\n",
    lambda v: v + "\x00",
    lambda v: " " + v,
    lambda v: v.upper(),
    lambda v: v + "²",
    lambda v: (v or "a") * 200,
]
SANE_INTS = {
    "amount_minor": [100, 1_000],
    "page_size": [10],
    "limit": [5],
    "days": [1],
    "deck_size": [52],
    "shares": [5],
    "total_minor": [1_000],
    "min_minor": [1],
    "min_bet_minor": [100],
    "max_bet_minor": [100_000],
    "chips_minor": [100],
    "betting_seconds": [BETTING_SECONDS],
}


def hostile_ints(kind: int) -> list[int]:
    low, high = INT_RANGES[kind]
    now = int(time.time() * 1000)
    values = [0, -1, 1, 10**15 + 1, 2**31 - 1, -(2**31), 2**62, -(2**62), 2**63 - 1, -(2**63), 2**64 - 1]
    values += [now - 3_600_000, now + 8 * 86_400_000, 253_402_300_800_000]
    return [v for v in values if low <= v <= high]


def good(world: World, f: FieldDescriptor) -> st.SearchStrategy[Any]:
    """A value of ``f`` that passes its own check (as far as a name tells)."""
    if f.type == FieldDescriptor.TYPE_STRING:
        return st.sampled_from(world.good_strings(f.name)).map(lambda v: fresh(world) if v == "FRESH" else v)
    if f.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=16)
    if f.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if f.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.sampled_from([0.0, 1.0])
    if f.type == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([n for n in enum_numbers(f) if n] or [0])
    if f.name.endswith("unix_ms"):
        return st.just(int(time.time() * 1000) + 3_600_000)
    return st.sampled_from(SANE_INTS.get(f.name, [0, 1, 100]))


def hostile(world: World, f: FieldDescriptor) -> st.SearchStrategy[Any]:
    """A boundary or hostile value of ``f``'s type."""
    if f.type == FieldDescriptor.TYPE_STRING:
        mutated = st.builds(
            lambda v, how: how(v), st.sampled_from(world.good_strings(f.name)), st.sampled_from(MUTATIONS)
        )
        return st.one_of(st.sampled_from(HOSTILE_STRINGS), mutated, st.text(max_size=30))
    if f.type == FieldDescriptor.TYPE_BYTES:
        return st.sampled_from([b"", b"\x00" * 100_000, b"\xff" * 64])
    if f.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if f.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.sampled_from([float("nan"), float("inf"), -0.0, 1e308])
    if f.type == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([-1, 99, 2**31 - 1, -(2**31)])
    low, high = INT_RANGES[f.type]
    return st.one_of(st.sampled_from(hostile_ints(f.type)), st.integers(low, high))


def fresh(world: World) -> str:
    world.fresh += 1
    return f"fz{world.stack.run_id}n{world.fresh}"


def leaves(d: descriptor.Descriptor, depth: int = 0) -> list[tuple[FieldDescriptor, ...]]:
    """The paths to every scalar field of ``d`` (through nested, repeated and map fields, 3 deep)."""
    paths: list[tuple[FieldDescriptor, ...]] = []
    for f in d.fields:
        if f.message_type is None:
            paths.append((f,))
        elif depth < 3:
            paths += [(f, *rest) for rest in leaves(f.message_type, depth + 1)]
    return paths


def enum_numbers(f: FieldDescriptor) -> list[int]:
    """The numbers of ``f``'s enum."""
    assert f.enum_type is not None
    return [v.number for v in f.enum_type.values]


def is_map(f: FieldDescriptor) -> bool:
    return f.message_type is not None and f.message_type.GetOptions().map_entry


def valid_values(world: World, d: descriptor.Descriptor, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Every field of ``d`` set to a good value (a repeated or map field: one element), some left out."""
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for f in d.fields:
        if f.message_type is None:
            item: st.SearchStrategy[Any] = good(world, f)
        elif depth < 3:
            item = valid_values(world, f.message_type, depth + 1)
        else:
            continue
        fields[f.name] = st.lists(item, min_size=1, max_size=2) if f.is_repeated else item
    return st.fixed_dictionaries(fields)


def with_hostile(values: dict[str, Any], path: tuple[FieldDescriptor, ...], bad: Any) -> dict[str, Any]:
    """``values`` with the leaf at ``path`` replaced by ``bad`` (the first element of a repeated field)."""
    head, rest = path[0], path[1:]
    out = dict(values)
    if not rest:
        out[head.name] = [bad] if head.is_repeated else bad
        return out
    inner: Any = out.get(head.name) or ([{}] if head.is_repeated else {})
    if head.is_repeated:
        out[head.name] = [with_hostile(inner[0], rest, bad), *inner[1:]]
    else:
        out[head.name] = with_hostile(inner, rest, bad)
    return out


def random_values(world: World, d: descriptor.Descriptor, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Any field present or not, each good or hostile: lists of 0..4 or 101..120 elements."""
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for f in d.fields:
        if f.message_type is None:
            item: st.SearchStrategy[Any] = st.one_of(good(world, f), hostile(world, f))
            if f.is_repeated and f.type == FieldDescriptor.TYPE_STRING:
                item = st.one_of(good(world, f), st.sampled_from([v for v in HOSTILE_STRINGS if len(v) < 300]))
        elif depth < 3:
            item = random_values(world, f.message_type, depth + 1)
        else:
            continue
        if f.is_repeated:
            optional[f.name] = st.one_of(st.lists(item, max_size=4), st.lists(item, min_size=101, max_size=120))
        else:
            optional[f.name] = item
    return st.fixed_dictionaries({}, optional=optional)


def request_values(world: World, d: descriptor.Descriptor) -> st.SearchStrategy[dict[str, Any]]:
    """Three in four: a good request with one field made hostile; else a random request."""
    paths = leaves(d)
    if not paths:
        return st.just({})
    one_bad = st.tuples(valid_values(world, d), st.sampled_from(paths)).flatmap(
        lambda vp: hostile(world, vp[1][-1]).map(lambda bad: with_hostile(vp[0], vp[1], bad))
    )
    return st.one_of(one_bad, one_bad, one_bad, random_values(world, d))


CREATING = ("Place", "Create", "Register", "Deposit", "Withdraw", "Commit", "SetTest", "Apply")


def base_values(world: World, d: descriptor.Descriptor, depth: int = 0, *, creating: bool = False) -> dict[str, Any]:
    """Every field of ``d`` at its first good value: the request a boundary sweep changes one field of.

    ``creating``: an RPC that makes something (PlaceHold, Register...) gets a fresh id where one may be."""
    values: dict[str, Any] = {}
    for f in d.fields:
        if f.message_type is None:
            if f.type == FieldDescriptor.TYPE_STRING:
                pool = world.good_strings(f.name)
                first = "FRESH" if creating and "FRESH" in pool else pool[0]
                item: Any = fresh(world) if first == "FRESH" else first
            elif f.type == FieldDescriptor.TYPE_ENUM:
                item = next((n for n in enum_numbers(f) if n), 0)
            elif f.type == FieldDescriptor.TYPE_BOOL:
                item = False
            elif f.type == FieldDescriptor.TYPE_BYTES:
                item = b""
            elif f.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
                item = 0.0
            elif f.name.endswith("unix_ms"):
                item = int(time.time() * 1000) + 3_600_000
            else:
                item = SANE_INTS.get(f.name, [1])[0]
        elif depth < 3:
            item = base_values(world, f.message_type, depth + 1, creating=creating)
        else:
            continue
        values[f.name] = [item] if f.is_repeated else item
    return values


def sweep_values(world: World, f: FieldDescriptor) -> list[Any]:
    """The boundary values a sweep sets ``f`` to, one request each."""
    if f.type == FieldDescriptor.TYPE_STRING:
        good_one = world.good_strings(f.name)[0]
        good_one = "fz" if good_one == "FRESH" else good_one
        return [*HOSTILE_STRINGS, good_one + "\n", good_one + "\x00", good_one * 200]
    if f.type == FieldDescriptor.TYPE_ENUM:
        return [-1, 99]
    if f.type in (FieldDescriptor.TYPE_BOOL, FieldDescriptor.TYPE_BYTES):
        return []
    if f.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return [float("nan"), float("inf")]
    return hostile_ints(f.type)


def fill(msg: Message, values: dict[str, Any]) -> Message:
    for name, v in values.items():
        f: Any = msg.DESCRIPTOR.fields_by_name[name]  # the stubs' and upb's descriptor types differ
        target = getattr(msg, name)
        if is_map(f):
            key_f = f.message_type.fields_by_name["key"]
            value_f = f.message_type.fields_by_name["value"]
            for entry in v:
                key = entry.get("key", "" if key_f.type == FieldDescriptor.TYPE_STRING else 0)
                if value_f.message_type is not None:
                    fill(target[key], entry.get("value", {}))
                else:
                    target[key] = entry.get("value", value_f.default_value)
        elif f.is_repeated:
            for item in v:
                if f.message_type is not None:
                    fill(target.add(), item)
                else:
                    target.append(item)
        elif f.message_type is not None:
            fill(target, v)
            target.SetInParent()
        else:
            setattr(msg, name, v)
    return msg


def long_values(msg: Message) -> Iterator[str]:
    """Every string of ``msg`` (nested, repeated and map ones too) longer than MAX_ECHO characters."""
    for f, v in msg.ListFields():
        items = v.items() if hasattr(v, "items") else (v if f.is_repeated else [v])
        for item in items:
            parts = item if isinstance(item, tuple) else (item,)
            for part in parts:
                if isinstance(part, Message):
                    yield from long_values(part)
                elif isinstance(part, str) and len(part) > MAX_ECHO:
                    yield part


# ------------------------------------------------------------------------------ calling


@dataclass
class Outcome:
    code: grpc.StatusCode
    details: str
    reason: str | None


def _serialize(request: Message) -> bytes:
    return request.SerializeToString()


async def call(world: World, service: str, method: descriptor.MethodDescriptor, request: Message, role: str) -> Outcome:
    channel = world.channels[service]
    path = f"/{method.containing_service.full_name}/{method.name}"
    response_type = message_factory.GetMessageClass(method.output_type)
    metadata = world.metadata[role]
    try:
        if method.server_streaming:
            stream = channel.unary_stream(
                path, request_serializer=_serialize, response_deserializer=response_type.FromString
            )(request, metadata=metadata, timeout=STREAM_WINDOW_S)
            async for _ in stream:
                pass
        else:
            await channel.unary_unary(
                path, request_serializer=_serialize, response_deserializer=response_type.FromString
            )(request, metadata=metadata, timeout=UNARY_TIMEOUT_S)
    except grpc.aio.AioRpcError as error:
        reason = dict(error.trailing_metadata() or ()).get(REASON_METADATA_KEY)
        return Outcome(error.code(), error.details() or "", None if reason is None else str(reason))
    return Outcome(grpc.StatusCode.OK, "", None)


async def balances(world: World) -> dict[str, tuple[int, int]]:
    c = clients(world.channels["wallet"], world.channels["table"], world.channels["ledger"])
    return await all_balances(c)


def check(world: World, rpc: str, request: Message, role: str, outcome: Outcome, after: dict[str, Any]) -> None:
    shown = f"{rpc} as {role}: {outcome.code.name} {outcome.details[:200]!r}\nrequest: {str(request)[:600]}"
    assert outcome.code not in NEVER, shown
    if request.ByteSize() > MAX_RECEIVE_MESSAGE_BYTES:
        # Above the servers' bound (many long strings in a repeated field): gRPC refuses it before any
        # handler runs, with its own short message and no reason of ours (test_regressions).
        assert outcome.code is grpc.StatusCode.RESOURCE_EXHAUSTED, shown
        assert after == world.balances, f"a refused call changed balances: {shown}"
        return
    streaming_end = outcome.code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED) and rpc.endswith(
        "WatchTable"
    )
    if outcome.code is grpc.StatusCode.OK or streaming_end:
        return
    assert outcome.reason, f"a refusal without a reason code: {shown}"
    assert len(outcome.details) <= MAX_MESSAGE_CHARS, shown
    for long in long_values(request):
        for piece in (long, repr(long)[1:-1]):
            assert piece[:MAX_ECHO] not in outcome.details, f"a value echoed unbounded: {shown}"
    assert after == world.balances, f"a refused call changed balances: {shown}"


# ------------------------------------------------------------------------------ the test


async def _case(
    world: World, summary: dict[str, dict[str, int]], service: str, method: descriptor.MethodDescriptor, role: str,
    request: Message, kind: str,
) -> tuple[Outcome, dict[str, tuple[int, int]]]:  # fmt: skip
    outcome = await call(world, service, method, request, role)
    after = await balances(world)
    counts = summary.setdefault(f"{service}.{method.name}", Counter())
    counts[outcome.code.name] += 1
    counts[kind] += 1
    return outcome, after


@pytest.mark.parametrize(("service", "method_name"), RPCS, ids=[f"{s}.{m}" for s, m in RPCS])
def test_every_field_of_every_rpc_takes_every_boundary_value(
    world: World, fuzz_summary: dict[str, dict[str, int]], service: str, method_name: str
) -> None:
    """The sweep: a good request with one field (nested ones too) at one boundary value, for each field and value."""
    method = SERVICES[service].methods_by_name[method_name]
    rpc = f"{service}.{method_name}"
    roles = world.authorized[rpc]
    message_type = message_factory.GetMessageClass(method.input_type)
    cases = 0
    for path in leaves(method.input_type):
        for bad in sweep_values(world, path[-1]):
            role = roles[cases % len(roles)]
            base = base_values(world, method.input_type, creating=method_name.startswith(CREATING))
            request = fill(message_type(), with_hostile(base, path, bad))
            outcome, after = world.run(_case(world, fuzz_summary, service, method, role, request, "sweep"))
            try:
                check(world, rpc, request, role, outcome, after)
            finally:
                world.balances = after
            cases += 1
    print(f"{rpc}: {cases} boundary cases")


@pytest.mark.parametrize(("service", "method_name"), RPCS, ids=[f"{s}.{m}" for s, m in RPCS])
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(data=st.data())
def test_every_rpc_answers_hostile_input_precisely(
    world: World, fuzz_summary: dict[str, dict[str, int]], service: str, method_name: str, data: st.DataObject
) -> None:
    method = SERVICES[service].methods_by_name[method_name]
    rpc = f"{service}.{method_name}"
    allowed = st.sampled_from(world.authorized[rpc])
    role = data.draw(st.one_of(allowed, allowed, allowed, st.sampled_from(ROLES)), label="role")
    values = data.draw(request_values(world, method.input_type), label="fields")
    request = fill(message_factory.GetMessageClass(method.input_type)(), values)
    outcome, after = world.run(_case(world, fuzz_summary, service, method, role, request, "random"))
    try:
        check(world, rpc, request, role, outcome, after)
    finally:
        world.balances = after
