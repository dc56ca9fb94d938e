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


def decode_payload(envelope: events_pb2.EventEnvelope) -> Message | None:
    """The payload as its own message type, or None when this process does not know the type."""
    full_name = envelope.payload.type_url.rpartition("/")[2]
    try:
        descriptor = descriptor_pool.Default().FindMessageTypeByName(full_name)
    except KeyError:
        return None
    message = message_factory.GetMessageClass(descriptor)()
    try:
        message.ParseFromString(envelope.payload.value)
    except DecodeError:
        return None
    return message


def find_movements(message: Message, depth: int = 0) -> Iterator[wallet_pb2.Movement]:
    """Every Movement inside ``message``, in field-number order, at most MAX_WALK_DEPTH deep."""
    if message.DESCRIPTOR.full_name == MOVEMENT:
        yield _as_movement(message)
        return
    if depth >= MAX_WALK_DEPTH:
        return
    for field, value in message.ListFields():
        if field.type != FieldDescriptor.TYPE_MESSAGE or field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            map_value = field.message_type.fields_by_name["value"]
            if map_value.type != FieldDescriptor.TYPE_MESSAGE:
                continue
            children = [value[key] for key in sorted(value)]
        else:
            children = value if _is_repeated(field) else [value]
        for child in children:
            yield from find_movements(child, depth + 1)


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _as_movement(message: Message) -> wallet_pb2.Movement:
    if isinstance(message, wallet_pb2.Movement):
        return message
    # Same type from another message factory: convert through the wire format.
    return wallet_pb2.Movement.FromString(message.SerializeToString())


def journal_event(envelope: events_pb2.EventEnvelope) -> Journaled:
    """The entries (and rejected movements) of one wallet event."""
    payload = decode_payload(envelope)
    if payload is None:
        if not is_wallet_event(envelope):
            return Journaled((), ())  # a table event type this build does not know: no money in it
        detail = f"cannot decode payload {envelope.payload.type_url!r} of {envelope.event_type!r}"
        return Journaled((), (Rejected(-1, f"{envelope.event_id}:-", Reason.PAYLOAD_UNDECODABLE, detail),))
    default_round = _string_field(payload, "round_id") or envelope.correlation_id
    default_hold = _string_field(payload, "hold_id")
    entries: list[Entry] = []
    rejected: list[Rejected] = []
    for index, movement in enumerate(find_movements(payload)):
        result = build_entry(envelope.event_id, index, movement, default_round, default_hold)
        if isinstance(result, Entry):
            entries.append(result)
        else:
            rejected.append(result)
    return Journaled(tuple(entries), tuple(rejected))


def is_wallet_event(envelope: events_pb2.EventEnvelope) -> bool:
    return envelope.producer == "wallet" or envelope.event_type.startswith("wallet.")


def _string_field(message: Message, name: str) -> str:
    field = message.DESCRIPTOR.fields_by_name.get(name)
    if field is None or field.type != FieldDescriptor.TYPE_STRING or field.is_repeated:
        return ""
    return str(getattr(message, name))


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
        try:
            account_type(leg.account)
        except AccountError as error:
            return reject(Reason.ACCOUNT_INVALID, f"leg {number}: {error}")
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
