"""From a wallet event to balanced journal entries: pure functions, no I/O.

The ledger does not list the wallet's event types. It decodes the payload named by
the envelope's ``type_url`` and walks its fields (protobuf reflection) for every
``niuniu.wallet.v1.Movement``, wherever it sits, so a new wallet event type that
carries movements is journaled without a change here, and an event without
movements is simply not journaled.

One movement becomes one entry. A leg that grows an account's bucket is a credit,
a leg that shrinks it is a debit, so an entry balances (debits == credits) exactly
when its legs sum to zero. A movement that does not balance, or names an account
outside the chart, is rejected with a reason, never journaled.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from niuniu.v1 import events_pb2
from niuniu.wallet.v1 import events_pb2 as wallet_pb2

from services.ledger.accounts import AccountError, account_type, bucket_name

MOVEMENT = wallet_pb2.Movement.DESCRIPTOR.full_name
MAX_WALK_DEPTH = 8
# Far above any stake, far below where a sum of legs could overflow BIGINT.
MAX_LEG_MINOR = 10**15
MAX_LEGS_PER_MOVEMENT = 1_000


class Reason:
    """Stable reason codes of rejected movements (journal_rejects.reason)."""

    UNBALANCED = "UNBALANCED"
    NO_LEGS = "NO_LEGS"
    TOO_MANY_LEGS = "TOO_MANY_LEGS"
    ACCOUNT_INVALID = "ACCOUNT_INVALID"
    BUCKET_INVALID = "BUCKET_INVALID"
    AMOUNT_OUT_OF_RANGE = "AMOUNT_OUT_OF_RANGE"
    DUPLICATE_ENTRY_ID = "DUPLICATE_ENTRY_ID"
    PAYLOAD_UNDECODABLE = "PAYLOAD_UNDECODABLE"


@dataclass(frozen=True, slots=True)
class Line:
    account: str
    bucket: str  # "available" | "held"
    debit_minor: int
    credit_minor: int


@dataclass(frozen=True, slots=True)
class Entry:
    entry_id: str
    movement_index: int
    kind: str
    round_id: str
    hold_id: str
    bet_id: str
    lines: tuple[Line, ...]

    @property
    def debit_minor(self) -> int:
        return sum(line.debit_minor for line in self.lines)

    @property
    def credit_minor(self) -> int:
        return sum(line.credit_minor for line in self.lines)


@dataclass(frozen=True, slots=True)
class Rejected:
    """A movement (or, with index -1, a whole event) the ledger refuses to journal."""

    movement_index: int
    entry_id: str
    reason: str
    detail: str
    movement: bytes = b""


@dataclass(frozen=True, slots=True)
class Journaled:
    entries: tuple[Entry, ...]
    rejected: tuple[Rejected, ...]


_CLASSES: dict[str, type[Message] | None] = {}
MAX_CACHED_TYPES = 4_096
# Account names already found in the chart (whether a name is in it depends on the name alone).
_CHARTED: set[str] = set()
MAX_CACHED_ACCOUNTS = 100_000


def _message_class(type_url: str) -> type[Message] | None:
    """The generated class of a payload's type (looked up once per type url; None: unknown here)."""
    try:
        return _CLASSES[type_url]
    except KeyError:
        pass
    try:
        descriptor = descriptor_pool.Default().FindMessageTypeByName(type_url.rpartition("/")[2])
        cls: type[Message] | None = message_factory.GetMessageClass(descriptor)
    except KeyError:
        cls = None
    if len(_CLASSES) < MAX_CACHED_TYPES:  # type urls come from events: bounded, whatever they say
        _CLASSES[type_url] = cls
    return cls


def decode_payload(envelope: events_pb2.EventEnvelope) -> Message | None:
    """The payload as its own message type, or None when this process does not know the type."""
    cls = _message_class(envelope.payload.type_url)
    if cls is None:
        return None
    message = cls()
    try:
        message.ParseFromString(envelope.payload.value)
    except DecodeError:
        return None
    return message


SINGULAR, REPEATED, MAP = 0, 1, 2
# Per message type (full name): the fields a Movement can be under, in field-number order, with their kind.
_WALKS: dict[str, tuple[tuple[str, int], ...]] = {}
# Per message type: whether a Movement can be inside it (a type being decided counts as yes: cycles).
_HOLDS_MOVEMENT: dict[str, bool] = {}


def _can_hold_movement(descriptor: Any) -> bool:
    name = descriptor.full_name
    if name == MOVEMENT:
        return True
    known = _HOLDS_MOVEMENT.get(name)
    if known is not None:
        return known
    _HOLDS_MOVEMENT[name] = True  # in progress: a recursive type is walked (what find_movements did)
    found = bool(_walk_of(descriptor))
    _HOLDS_MOVEMENT[name] = found
    return found


def _walk_of(descriptor: Any) -> tuple[tuple[str, int], ...]:
    """The message fields of ``descriptor`` a Movement can be under (the reflection walk, decided once per type)."""
    name = descriptor.full_name
    walk = _WALKS.get(name)
    if walk is not None:
        return walk
    fields: list[tuple[str, int]] = []
    for field in sorted(descriptor.fields, key=lambda f: f.number):
        if field.type != FieldDescriptor.TYPE_MESSAGE or field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            map_value = field.message_type.fields_by_name["value"]
            if map_value.type == FieldDescriptor.TYPE_MESSAGE and _can_hold_movement(map_value.message_type):
                fields.append((field.name, MAP))
        elif _can_hold_movement(field.message_type):
            fields.append((field.name, REPEATED if _is_repeated(field) else SINGULAR))
    walk = _WALKS[name] = tuple(fields)
    return walk


def find_movements(message: Message, depth: int = 0) -> Iterator[wallet_pb2.Movement]:
    """Every Movement inside ``message``, in field-number order, at most MAX_WALK_DEPTH deep.

    The walk visits only the fields a Movement can be under (``_walk_of``, per type), in the
    order ``ListFields`` gives: set fields by number, map entries by key.
    """
    descriptor = message.DESCRIPTOR
    if descriptor.full_name == MOVEMENT:
        yield _as_movement(message)
        return
    if depth >= MAX_WALK_DEPTH:
        return
    for name, kind in _walk_of(descriptor):
        if kind == SINGULAR:
            if not message.HasField(name):
                continue
            children: Any = (getattr(message, name),)
        elif kind == REPEATED:
            children = getattr(message, name)
        else:
            value = getattr(message, name)
            children = [value[key] for key in sorted(value)]
        for child in children:
            yield from find_movements(child, depth + 1)


# Per message type: its walk when every field in it holds Movements directly (singular or
# repeated, not in a map): then the Movements are read without the recursive walk.
_DIRECT: dict[str, tuple[tuple[str, int], ...] | None] = {}


def _direct_walk(descriptor: Any) -> tuple[tuple[str, int], ...] | None:
    name = descriptor.full_name
    try:
        return _DIRECT[name]
    except KeyError:
        pass
    walk = _walk_of(descriptor)
    direct = all(
        kind != MAP and descriptor.fields_by_name[field].message_type.full_name == MOVEMENT for field, kind in walk
    )
    found = _DIRECT[name] = walk if direct else None
    return found


def _movements(payload: Message) -> Iterator[wallet_pb2.Movement] | list[wallet_pb2.Movement]:
    """``find_movements(payload)``, read directly when the type allows (``_direct_walk``)."""
    descriptor = payload.DESCRIPTOR
    walk = _direct_walk(descriptor) if descriptor.full_name != MOVEMENT else None
    if walk is None:
        return find_movements(payload)
    found: list[wallet_pb2.Movement] = []
    for name, kind in walk:
        if kind == SINGULAR:
            if payload.HasField(name):
                found.append(_as_movement(getattr(payload, name)))
        else:
            found.extend(_as_movement(m) for m in getattr(payload, name))
    return found


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _as_movement(message: Message) -> wallet_pb2.Movement:
    if isinstance(message, wallet_pb2.Movement):
        return message
    # Same type from another message factory: convert through the wire format.
    return wallet_pb2.Movement.FromString(message.SerializeToString())


# An entry as plain values, for the replay's hot path (no object per entry or line):
# (entry_id, movement_index, kind, round_id, hold_id, bet_id, lines), each line (account, bucket, debit, credit).
EntryRow = tuple[str, int, str, str, str, str, tuple[tuple[str, str, int, int], ...]]


def journal_event(envelope: events_pb2.EventEnvelope) -> Journaled:
    """The entries (and rejected movements) of one wallet event."""
    rows, rejected = journal_rows(envelope)
    entries = tuple(
        Entry(entry_id, index, kind, round_id, hold_id, bet_id, tuple(Line(*line) for line in lines))
        for entry_id, index, kind, round_id, hold_id, bet_id, lines in rows
    )
    return Journaled(entries, tuple(rejected))


def journal_rows(envelope: events_pb2.EventEnvelope) -> tuple[list[EntryRow], list[Rejected]]:
    """``journal_event`` as plain values: the same entries (in movement order) and rejects."""
    payload = decode_payload(envelope)
    if payload is None:
        if not is_wallet_event(envelope):
            return [], []  # a table event type this build does not know: no money in it
        detail = f"cannot decode payload {envelope.payload.type_url!r} of {envelope.event_type!r}"
        return [], [Rejected(-1, f"{envelope.event_id}:-", Reason.PAYLOAD_UNDECODABLE, detail)]
    walk = _walk_of(payload.DESCRIPTOR) if payload.DESCRIPTOR.full_name != MOVEMENT else True
    if not walk:
        return [], []  # no Movement can be inside this type
    default_hold = _string_field(payload, "hold_id")
    default_round = _string_field(payload, "round_id") or _round_of(envelope, payload, default_hold)
    entries: list[EntryRow] = []
    rejected: list[Rejected] = []
    for index, movement in enumerate(_movements(payload)):
        row = _fast_entry(envelope.event_id, index, movement, default_round, default_hold)
        if row is not None:
            entries.append(row)
            continue
        result = build_entry(envelope.event_id, index, movement, default_round, default_hold)
        if isinstance(result, Entry):
            lines = tuple((line.account, line.bucket, line.debit_minor, line.credit_minor) for line in result.lines)
            entries.append((result.entry_id, index, result.kind, result.round_id, result.hold_id, result.bet_id, lines))
        else:
            rejected.append(result)
    return entries, rejected


_BUCKETS = {wallet_pb2.BUCKET_AVAILABLE: "available", wallet_pb2.BUCKET_HELD: "held"}


def _fast_entry(
    event_id: str, index: int, movement: wallet_pb2.Movement, default_round: str, default_hold: str
) -> EntryRow | None:
    """``build_entry``'s entry when every leg is plainly valid (charted account, known bucket, amount in
    range) and the legs balance; None when ``build_entry`` must decide (and name the reject)."""
    legs = movement.legs
    if not legs or len(legs) > MAX_LEGS_PER_MOVEMENT:
        return None
    lines: list[tuple[str, str, int, int]] = []
    total = 0
    for leg in legs:
        account, amount = leg.account, leg.amount_minor
        bucket = _BUCKETS.get(leg.bucket)
        if bucket is None or account not in _CHARTED or amount > MAX_LEG_MINOR or amount < -MAX_LEG_MINOR:
            return None
        total += amount
        if amount > 0:
            lines.append((account, bucket, 0, amount))
        elif amount < 0:
            lines.append((account, bucket, -amount, 0))
    if total != 0:
        return None
    return (
        movement.movement_id or f"{event_id}:{index}",
        index,
        movement.kind,
        movement.round_id or default_round,
        movement.hold_id or default_hold,
        movement.bet_id,
        tuple(lines),
    )


# Cash movements correlate with the cashier's request id, not a round: their own reference is the
# movement (entry) id, so a statement line must not show that request id as a round id.
_CASH_PAYLOADS = frozenset({"niuniu.wallet.v1.Deposited", "niuniu.wallet.v1.Withdrawn"})


def _round_of(envelope: events_pb2.EventEnvelope, payload: Message, hold_id: str) -> str:
    """The round an event's movements belong to when they do not say: its correlation id, unless
    that names something else (a cash request, or the hold itself for a hold outside any round)."""
    if payload.DESCRIPTOR.full_name in _CASH_PAYLOADS or envelope.correlation_id == hold_id:
        return ""
    return envelope.correlation_id


def is_wallet_event(envelope: events_pb2.EventEnvelope) -> bool:
    return envelope.producer == "wallet" or envelope.event_type.startswith("wallet.")


# Per (message type, field name): whether the type has that singular string field.
_STRING_FIELDS: dict[tuple[str, str], bool] = {}


def _string_field(message: Message, name: str) -> str:
    descriptor = message.DESCRIPTOR
    key = (descriptor.full_name, name)
    has = _STRING_FIELDS.get(key)
    if has is None:
        field = descriptor.fields_by_name.get(name)
        has = field is not None and field.type == FieldDescriptor.TYPE_STRING and not field.is_repeated
        if len(_STRING_FIELDS) < MAX_CACHED_TYPES:
            _STRING_FIELDS[key] = has
    return str(getattr(message, name)) if has else ""


def entry_id_of(event_id: str, index: int, movement: wallet_pb2.Movement) -> str:
    return movement.movement_id or f"{event_id}:{index}"


def build_entry(
    event_id: str, index: int, movement: wallet_pb2.Movement, default_round: str = "", default_hold: str = ""
) -> Entry | Rejected:
    """One balanced entry from ``movement``, or why it cannot be journaled."""
    entry_id = entry_id_of(event_id, index, movement)

    def reject(reason: str, detail: str) -> Rejected:
        return Rejected(index, entry_id, reason, detail, movement.SerializeToString())

    if not movement.legs:
        return reject(Reason.NO_LEGS, "the movement has no legs")
    if len(movement.legs) > MAX_LEGS_PER_MOVEMENT:
        return reject(Reason.TOO_MANY_LEGS, f"{len(movement.legs)} legs (at most {MAX_LEGS_PER_MOVEMENT})")
    lines: list[Line] = []
    for number, leg in enumerate(movement.legs):
        if leg.account not in _CHARTED:
            try:
                account_type(leg.account)
            except AccountError as error:
                return reject(Reason.ACCOUNT_INVALID, f"leg {number}: {error}")
            if len(_CHARTED) < MAX_CACHED_ACCOUNTS:
                _CHARTED.add(leg.account)
        try:
            bucket = bucket_name(leg.bucket)
        except AccountError as error:
            return reject(Reason.BUCKET_INVALID, f"leg {number} ({leg.account}): {error}")
        if abs(leg.amount_minor) > MAX_LEG_MINOR:
            return reject(Reason.AMOUNT_OUT_OF_RANGE, f"leg {number} ({leg.account}): {leg.amount_minor}")
        if leg.amount_minor != 0:  # a zero leg moves nothing and would be neither debit nor credit
            lines.append(Line(leg.account, bucket, max(0, -leg.amount_minor), max(0, leg.amount_minor)))
    total = sum(leg.amount_minor for leg in movement.legs)
    if total != 0:
        legs = ", ".join(f"{leg.account}/{bucket_name(leg.bucket)} {leg.amount_minor:+d}" for leg in movement.legs)
        return reject(Reason.UNBALANCED, f"legs sum to {total:+d}, not 0: {legs}")
    entry = Entry(
        entry_id=entry_id,
        movement_index=index,
        kind=movement.kind,
        round_id=movement.round_id or default_round,
        hold_id=movement.hold_id or default_hold,
        bet_id=movement.bet_id,
        lines=tuple(lines),
    )
    assert entry.debit_minor == entry.credit_minor, f"entry {entry_id} built unbalanced"
    return entry
