"""Provably-fair derivation of deck orders and red-envelope splits.

Everything here is a pure function of its arguments: the server seed comes in
from the rng service (``services/rng/seeds.py``, the OS CSPRNG), never from here.
The derivation is a published contract, specified in ``docs/fairness.md``;
any change to the bytes it produces must bump ``SPEC_VERSION``, which is mixed
into every stream so that old and new derivations can never be confused.

Lifecycle of a round, as the rng service uses this module::

    seed = new_server_seed()                       # kept secret until settlement
    published = commit(seed)                       # shown before betting opens
    cards = shuffle(seed, round_id, client_seed, 52)
    split = split_envelope(seed, round_id, client_seed, total_minor, shares, min_minor)
    ...                                            # after settlement reveal seed
    verify_round(published, seed, round_id, client_seed, deck_size=52, dealt=cards).ok

Two additions of the same contract (docs/fairness.md sections 10 and 11):
``combine_client_seeds`` folds the players' per-bet contributions into the round's
client seed, independent of their order; ``seal``/``open_sealed`` encrypt the deal
record published on the audit topic under a key derived from the server seed, so it
opens only once the seed is revealed (the caller supplies the nonce).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from bull.cards import Card, CardError, deck

SPEC_VERSION = "niuniu-fair-v1"
SEED_BYTES = 32
BLOCK_BYTES = 32
COUNTER_BYTES = 8
LENGTH_PREFIX_BYTES = 4
PURPOSE_DECK = "deck"
PURPOSE_ENVELOPE = "envelope"

MAX_FIELD_BYTES = 1024
MAX_SHARES = 10_000
MAX_TOTAL_MINOR = 10**15
DECK_SIZES = (52, 54)
# Each candidate is accepted with probability > 1/2, so 1024 rejections in a
# row has probability < 2**-1024: reaching the bound means a broken stream.
MAX_REJECTIONS_PER_DRAW = 1024

_T = TypeVar("_T")


class FairInputError(ValueError):
    """An argument to the derivation is malformed (seed length, field size, deck size)."""


class EnvelopeError(FairInputError):
    """Envelope parameters that cannot be split (too few minor units, too many shares)."""


# --------------------------------------------------------------------------- seeds


def commit(server_seed: bytes) -> str:
    """The commitment published before betting: SHA-256(server_seed), lowercase hex."""
    _check_seed(server_seed)
    return hashlib.sha256(server_seed).hexdigest()


def parse_commitment(text: str) -> str:
    """Normalise a commitment to 64 lowercase hex digits, or raise ``FairInputError``."""
    value = text.strip().lower()
    if len(value) != 2 * hashlib.sha256().digest_size or any(c not in "0123456789abcdef" for c in value):
        raise FairInputError(f"commitment must be 64 hex digits, got {text!r}")
    return value


def parse_seed(text: str) -> bytes:
    """A server seed from its hex form (64 hex digits), or raise ``FairInputError``."""
    try:
        seed = bytes.fromhex(text.strip())
    except ValueError:
        raise FairInputError(f"server seed must be hex, got {text!r}") from None
    _check_seed(seed)
    return seed


def _check_seed(server_seed: bytes) -> None:
    if not isinstance(server_seed, bytes | bytearray) or len(server_seed) != SEED_BYTES:
        size = len(server_seed) if isinstance(server_seed, bytes | bytearray) else type(server_seed).__name__
        raise FairInputError(f"server seed must be exactly {SEED_BYTES} bytes, got {size}")


# --------------------------------------------------------------------------- stream


def _field(value: str, name: str, *, allow_empty: bool) -> bytes:
    if not isinstance(value, str):
        raise FairInputError(f"{name} must be a string, got {type(value).__name__}")
    data = value.encode("utf-8")
    if not data and not allow_empty:
        raise FairInputError(f"{name} must not be empty")
    if len(data) > MAX_FIELD_BYTES:
        raise FairInputError(f"{name} is {len(data)} bytes of UTF-8, at most {MAX_FIELD_BYTES} allowed")
    return len(data).to_bytes(LENGTH_PREFIX_BYTES, "big") + data


def stream_prefix(purpose: str, round_id: str, client_seed: str = "") -> bytes:
    """The HMAC message of a stream, without its trailing 8-byte counter."""
    return (
        _field(SPEC_VERSION, "version", allow_empty=False)
        + _field(purpose, "purpose", allow_empty=False)
        + _field(round_id, "round id", allow_empty=False)
        + _field(client_seed, "client seed", allow_empty=True)
    )


def stream_message(purpose: str, round_id: str, client_seed: str, counter: int) -> bytes:
    """The full HMAC message for block ``counter`` of a stream."""
    if not 0 <= counter < 1 << (8 * COUNTER_BYTES):
        raise FairInputError(f"counter must fit in {COUNTER_BYTES} bytes, got {counter}")
    return stream_prefix(purpose, round_id, client_seed) + counter.to_bytes(COUNTER_BYTES, "big")


class Stream:
    """The deterministic bit stream of one (server seed, purpose, round id, client seed).

    Block ``i`` is HMAC-SHA256(server_seed, prefix || u64be(i)); the stream is the
    blocks in counter order, read bit by bit, most significant bit of each byte first.
    """

    __slots__ = ("_acc", "_counter", "_keyed", "_nbits")

    def __init__(self, server_seed: bytes, purpose: str, round_id: str, client_seed: str = "") -> None:
        _check_seed(server_seed)
        # The key and the constant prefix are absorbed once; each block copies that state.
        self._keyed = hmac.new(bytes(server_seed), stream_prefix(purpose, round_id, client_seed), hashlib.sha256)
        self._counter = 0
        self._acc = 0  # unread bits, the next one most significant
        self._nbits = 0

    def block(self, counter: int) -> bytes:
        """Block ``counter`` of the stream (random access; does not move the read position)."""
        keyed = self._keyed.copy()
        keyed.update(counter.to_bytes(COUNTER_BYTES, "big"))
        return keyed.digest()

    def blocks(self, start: int = 0) -> Iterator[bytes]:
        """Blocks ``start``, ``start + 1``, ... (independent of the read position)."""
        counter = start
        while counter < 1 << (8 * COUNTER_BYTES):
            yield self.block(counter)
            counter += 1

    def bits(self, k: int) -> int:
        """The next ``k`` bits of the stream as an unsigned big-endian integer."""
        if k < 0:
            raise ValueError(f"cannot read {k} bits")
        while self._nbits < k:
            self._acc = (self._acc << (8 * BLOCK_BYTES)) | int.from_bytes(self.block(self._counter), "big")
            self._counter += 1
            self._nbits += 8 * BLOCK_BYTES
        self._nbits -= k
        value = self._acc >> self._nbits
        self._acc &= (1 << self._nbits) - 1
        return value

    def uniform(self, n: int) -> int:
        """An unbiased integer in ``[0, n)``: draw bit_length(n - 1) bits, reject values >= n."""
        if n < 1:
            raise ValueError(f"uniform needs n >= 1, got {n}")
        if n == 1:
            return 0
        k = (n - 1).bit_length()
        for _ in range(MAX_REJECTIONS_PER_DRAW):
            value = self.bits(k)
            if value < n:
                return value
        raise AssertionError(f"{MAX_REJECTIONS_PER_DRAW} rejections in a row drawing from [0, {n}): broken stream")

    def shuffle_in_place(self, items: list[_T]) -> None:
        """Fisher-Yates: for i from len - 1 down to 1, j = uniform(i + 1), swap items i and j.

        Bit for bit the same as calling ``uniform`` in that loop; inlined because the
        statistics tests and the service shuffle hundreds of thousands of decks.
        """
        acc, nbits, counter = self._acc, self._nbits, self._counter
        block, from_bytes = self.block, int.from_bytes
        for i, k, mask in _fisher_yates_plan(len(items)):
            j = i + 1
            rejections = -1
            while j > i:
                rejections += 1
                if rejections == MAX_REJECTIONS_PER_DRAW:
                    raise AssertionError(f"{rejections} rejections in a row drawing from [0, {i + 1}): broken stream")
                if nbits < k:
                    acc = ((acc & ((1 << nbits) - 1)) << (8 * BLOCK_BYTES)) | from_bytes(block(counter), "big")
                    counter += 1
                    nbits += 8 * BLOCK_BYTES
                nbits -= k
                j = (acc >> nbits) & mask
            items[i], items[j] = items[j], items[i]
        self._acc, self._nbits, self._counter = acc & ((1 << nbits) - 1), nbits, counter


@functools.lru_cache(maxsize=32)
def _fisher_yates_plan(n: int) -> tuple[tuple[int, int, int], ...]:
    """(i, bits drawn for uniform(i + 1), mask of those bits) for i = n - 1 down to 1."""
    return tuple((i, i.bit_length(), (1 << i.bit_length()) - 1) for i in range(n - 1, 0, -1))


# --------------------------------------------------------------------------- deck


def shuffle(server_seed: bytes, round_id: str, client_seed: str = "", deck_size: int = 52) -> tuple[Card, ...]:
    """The round's deck order; position 0 is dealt first."""
    cards = list(_canonical_deck(deck_size))
    Stream(server_seed, PURPOSE_DECK, round_id, client_seed).shuffle_in_place(cards)
    return tuple(cards)


def _canonical_deck(deck_size: int) -> tuple[Card, ...]:
    try:
        return deck(deck_size)
    except CardError as error:
        raise FairInputError(str(error)) from None


# --------------------------------------------------------------------------- envelope


@dataclass(frozen=True, slots=True)
class Split:
    """A red-envelope split.

    ``amounts[k]`` is the k-th share drawn (minor units); participant ``grab_order[k]``
    (a position in the round's participant list) grabs k-th and receives ``amounts[k]``.
    """

    amounts: tuple[int, ...]
    grab_order: tuple[int, ...]

    @property
    def total_minor(self) -> int:
        return sum(self.amounts)

    @property
    def by_position(self) -> tuple[int, ...]:
        """``by_position[p]`` is what participant position ``p`` receives."""
        received = [0] * len(self.amounts)
        for amount, position in zip(self.amounts, self.grab_order, strict=True):
            received[position] = amount
        return tuple(received)


def check_envelope(total_minor: int, shares: int, min_minor: int) -> None:
    """Raise ``EnvelopeError`` unless the envelope can be split as specified."""
    for name, value in (("total_minor", total_minor), ("shares", shares), ("min_minor", min_minor)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise EnvelopeError(f"{name} must be an integer, got {value!r}")
    if not 1 <= shares <= MAX_SHARES:
        raise EnvelopeError(f"shares must be 1..{MAX_SHARES}, got {shares}")
    if min_minor < 1:
        raise EnvelopeError(f"min_minor must be at least 1, got {min_minor}")
    if total_minor > MAX_TOTAL_MINOR:
        raise EnvelopeError(f"total_minor must be at most {MAX_TOTAL_MINOR}, got {total_minor}")
    if total_minor < shares * min_minor:
        raise EnvelopeError(
            f"total_minor {total_minor} cannot give {shares} shares of at least {min_minor} "
            f"(needs {shares * min_minor})"
        )


def split_envelope(
    server_seed: bytes, round_id: str, client_seed: str, total_minor: int, shares: int, min_minor: int
) -> Split:
    """Split ``total_minor`` into ``shares`` by the double-mean method, then draw the grab order."""
    check_envelope(total_minor, shares, min_minor)
    stream = Stream(server_seed, PURPOSE_ENVELOPE, round_id, client_seed)
    amounts: list[int] = []
    remaining = total_minor
    for drawn in range(shares - 1):
        left = shares - drawn  # shares still to draw, this one included
        # Double mean, capped so every later share can still get min_minor.
        high = min(2 * remaining // left, remaining - (left - 1) * min_minor)
        amount = min_minor + stream.uniform(high - min_minor + 1)
        amounts.append(amount)
        remaining -= amount
    amounts.append(remaining)
    grab_order = list(range(shares))
    stream.shuffle_in_place(grab_order)
    if sum(amounts) != total_minor or min(amounts) < min_minor:
        raise AssertionError(f"split {amounts} breaks total {total_minor} / min {min_minor}")
    return Split(tuple(amounts), tuple(grab_order))


# --------------------------------------------------------------------------- verification


@dataclass(frozen=True, slots=True)
class EnvelopeRecord:
    """What a table recorded for a round's envelope: its parameters and, to check, its split."""

    total_minor: int
    shares: int
    min_minor: int
    amounts: tuple[int, ...] | None = None
    grab_order: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Check:
    """One verification step; ``name`` is commitment, deck, split or grab_order."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True, slots=True)
class Verification:
    checks: tuple[Check, ...]
    deck: tuple[Card, ...] | None
    split: Split | None

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(check for check in self.checks if not check.ok)


def verify_round(
    commitment: str,
    server_seed: bytes,
    round_id: str,
    client_seed: str = "",
    deck_size: int | None = None,
    dealt: Sequence[Card] | None = None,
    envelope: EnvelopeRecord | None = None,
) -> Verification:
    """Recompute a round from its revealed seed and check it against what was published and dealt.

    ``dealt`` is the cards the table dealt in deck order (a prefix of the deck, or all of
    it). Malformed arguments raise ``FairInputError``; a mismatch is a failed ``Check``.
    """
    published = parse_commitment(commitment)
    derived = commit(server_seed)
    stream_prefix(PURPOSE_DECK, round_id, client_seed)  # rejects a malformed round id even with nothing to derive
    checks = [
        Check("commitment", True, f"SHA-256(seed) = {derived}")
        if hmac.compare_digest(published, derived)
        else Check("commitment", False, f"SHA-256(seed) = {derived} but the published commitment is {published}")
    ]
    cards: tuple[Card, ...] | None = None
    if dealt is not None and deck_size is None:
        raise FairInputError("deck_size (52 or 54) is required to check dealt cards")
    if deck_size is not None:
        cards = shuffle(server_seed, round_id, client_seed, deck_size)
        if dealt is not None:
            checks.append(_check_dealt(cards, tuple(dealt)))
    split: Split | None = None
    if envelope is not None:
        split = split_envelope(
            server_seed, round_id, client_seed, envelope.total_minor, envelope.shares, envelope.min_minor
        )
        if envelope.amounts is not None:
            checks.append(_check_sequence("split", "share", split.amounts, tuple(envelope.amounts)))
        if envelope.grab_order is not None:
            checks.append(_check_sequence("grab_order", "grab", split.grab_order, tuple(envelope.grab_order)))
    return Verification(tuple(checks), cards, split)


def _check_dealt(cards: tuple[Card, ...], dealt: tuple[Card, ...]) -> Check:
    if len(dealt) > len(cards):
        return Check("deck", False, f"the table dealt {len(dealt)} cards from a {len(cards)}-card deck")
    for position, (expected, actual) in enumerate(zip(cards, dealt, strict=False)):
        if expected != actual:
            wrong = sum(e != a for e, a in zip(cards, dealt, strict=False))
            return Check(
                "deck",
                False,
                f"position {position}: the table dealt {actual.code} but the seed gives {expected.code} "
                f"({wrong} of {len(dealt)} dealt cards differ)",
            )
    return Check("deck", True, f"the {len(dealt)} dealt cards are the top of the derived {len(cards)}-card deck")


def _check_sequence(name: str, noun: str, derived: tuple[int, ...], recorded: tuple[int, ...]) -> Check:
    if len(derived) != len(recorded):
        return Check(name, False, f"the table recorded {len(recorded)} values but the seed gives {len(derived)}")
    for index, (expected, actual) in enumerate(zip(derived, recorded, strict=True)):
        if expected != actual:
            return Check(name, False, f"{noun} {index}: the table recorded {actual} but the seed gives {expected}")
    return Check(name, True, f"all {len(recorded)} values match")


# --------------------------------------------------------------------------- client seeds (section 10)

CLIENT_SEEDS_VERSION = "niuniu-client-seeds-v1"
CLIENT_SEED_CONTRIBUTION_MAX_CHARS = 64
# Letters, digits and the punctuation of hex, base64 and base64url: a seed a player's
# client generates fits, and nothing in it needs escaping in a log, a URL or a list.
CLIENT_SEED_CONTRIBUTION_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~+/=-")
MAX_CLIENT_SEED_CONTRIBUTIONS = 100_000
_CONTRIBUTION = re.compile(r"[A-Za-z0-9._~+/=-]{1,64}")


class ClientSeedError(FairInputError):
    """A player's client seed contribution that the combination does not accept."""


def check_client_seed_contribution(contribution: str) -> str:
    """Return ``contribution`` if it is 1..64 characters of ``[A-Za-z0-9._~+/=-]``, else raise ``ClientSeedError``."""
    if not isinstance(contribution, str):
        raise ClientSeedError(f"a client seed must be a string, got {type(contribution).__name__}")
    if _CONTRIBUTION.fullmatch(contribution):
        return contribution
    if not contribution:
        raise ClientSeedError("a client seed must not be empty")
    if len(contribution) > CLIENT_SEED_CONTRIBUTION_MAX_CHARS:
        raise ClientSeedError(
            f"a client seed is at most {CLIENT_SEED_CONTRIBUTION_MAX_CHARS} characters, got {len(contribution)}"
        )
    for position, char in enumerate(contribution):
        if char not in CLIENT_SEED_CONTRIBUTION_ALPHABET:
            raise ClientSeedError(
                f"a client seed may hold only letters, digits and . _ ~ + / = -; "
                f"character {position} is U+{ord(char):04X}"
            )
    raise AssertionError(f"{contribution!r} fails the pattern but no check")  # the pattern and the checks disagree


def combine_client_seeds(contributions: Iterable[str]) -> str:
    """The round's client seed from the players' contributions, whatever their order.

    No contribution gives the empty client seed (the round is derived exactly as
    before client seeds existed). Otherwise, with ``c_1 <= ... <= c_n`` the
    contributions sorted by their bytes (duplicates kept)::

        hex(SHA-256(field("niuniu-client-seeds-v1") || u32be(n) || field(c_1) || ... || field(c_n)))

    Sorting makes the result independent of the order the bets arrived in; the length
    prefixes make the encoding injective, so changing any one contribution changes it.
    """
    if isinstance(contributions, str):
        raise ClientSeedError("contributions must be a list of client seeds, not one string")
    ordered = sorted(check_client_seed_contribution(c).encode("ascii") for c in contributions)
    if len(ordered) > MAX_CLIENT_SEED_CONTRIBUTIONS:
        raise ClientSeedError(f"at most {MAX_CLIENT_SEED_CONTRIBUTIONS} client seeds per round, got {len(ordered)}")
    if not ordered:
        return ""
    digest = hashlib.sha256(_field(CLIENT_SEEDS_VERSION, "version", allow_empty=False))
    digest.update(len(ordered).to_bytes(LENGTH_PREFIX_BYTES, "big"))
    for contribution in ordered:
        digest.update(len(contribution).to_bytes(LENGTH_PREFIX_BYTES, "big") + contribution)
    return digest.hexdigest()


# --------------------------------------------------------------------------- sealed records (section 11)

SEAL_VERSION = "niuniu-seal-v1"
SEAL_KEY_BYTES = 32
SEAL_NONCE_BYTES = 12
SEAL_TAG_BYTES = 16
SEAL_PURPOSES = (PURPOSE_DECK, PURPOSE_ENVELOPE)


class SealError(ValueError):
    """A sealed record that does not open: wrong seed, round, purpose or version, or altered bytes."""


def seal_context(purpose: str, round_id: str) -> bytes:
    """``field(version) || field(purpose) || field(round_id)``: the HKDF info and the AEAD associated data."""
    if purpose not in SEAL_PURPOSES:
        raise FairInputError(f"a sealed record's purpose is one of {', '.join(SEAL_PURPOSES)}, got {purpose!r}")
    return (
        _field(SEAL_VERSION, "version", allow_empty=False)
        + _field(purpose, "purpose", allow_empty=False)
        + _field(round_id, "round id", allow_empty=False)
    )


def seal_key(server_seed: bytes, purpose: str, round_id: str) -> bytes:
    """HKDF-SHA256 (RFC 5869): salt ``utf8("niuniu-seal-v1")``, key material the seed, info ``seal_context``."""
    _check_seed(server_seed)
    hkdf = HKDF(
        algorithm=hashes.SHA256(),
        length=SEAL_KEY_BYTES,
        salt=SEAL_VERSION.encode("utf-8"),
        info=seal_context(purpose, round_id),
    )
    return hkdf.derive(bytes(server_seed))


def seal(server_seed: bytes, purpose: str, round_id: str, plaintext: bytes, nonce: bytes) -> bytes:
    """AES-256-GCM of ``plaintext`` under ``seal_key``; returns ciphertext || 16-byte tag.

    ``nonce`` (12 bytes) comes from the caller: the rng draws a fresh random one per
    record, so this module draws no randomness.
    """
    _check_nonce(nonce)
    context = seal_context(purpose, round_id)
    return AESGCM(seal_key(server_seed, purpose, round_id)).encrypt(bytes(nonce), bytes(plaintext), context)


def open_sealed(server_seed: bytes, purpose: str, round_id: str, nonce: bytes, sealed: bytes) -> bytes:
    """The plaintext of a sealed record, or ``SealError`` when it does not authenticate."""
    _check_nonce(nonce)
    if len(sealed) < SEAL_TAG_BYTES:
        raise SealError(f"a sealed record is at least {SEAL_TAG_BYTES} bytes (the tag), got {len(sealed)}")
    context = seal_context(purpose, round_id)
    try:
        return AESGCM(seal_key(server_seed, purpose, round_id)).decrypt(bytes(nonce), bytes(sealed), context)
    except InvalidTag:
        raise SealError(
            f"the sealed {purpose} record of round {round_id!r} does not open with this seed "
            "(wrong seed, round or purpose, or altered bytes)"
        ) from None


def _check_nonce(nonce: bytes) -> None:
    if not isinstance(nonce, bytes | bytearray) or len(nonce) != SEAL_NONCE_BYTES:
        size = len(nonce) if isinstance(nonce, bytes | bytearray) else type(nonce).__name__
        raise FairInputError(f"a seal nonce is exactly {SEAL_NONCE_BYTES} bytes, got {size}")


def record_bytes(record: Mapping[str, Any]) -> bytes:
    """The canonical bytes of a deal record: compact UTF-8 JSON, keys sorted (what is sealed)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def deck_record(
    round_id: str,
    commitment: str,
    deck_size: int,
    client_seed: str,
    client_seeds: Sequence[str],
    cards: Sequence[str],
    *,
    test_deck: bool = False,
) -> bytes:
    """The sealed record of a drawn deck (section 11)."""
    return record_bytes(
        {
            "purpose": PURPOSE_DECK,
            "round_id": round_id,
            "commitment": commitment,
            "deck_size": deck_size,
            "client_seed": client_seed,
            "client_seeds": sorted(client_seeds),
            "cards": list(cards),
            "test_deck": test_deck,
        }
    )


def envelope_record(
    round_id: str,
    commitment: str,
    total_minor: int,
    shares: int,
    min_minor: int,
    client_seed: str,
    client_seeds: Sequence[str],
    split: Split,
    *,
    test_envelope: bool = False,
) -> bytes:
    """The sealed record of a red-envelope split (section 11), padded so its length tells nothing.

    The amounts' decimal lengths vary with the split, and AES-GCM keeps the length: the
    JSON is followed by spaces up to the length it would have if every amount were
    ``total_minor`` (the grab order is a permutation, so its length is fixed already).
    """
    fields: dict[str, Any] = {
        "purpose": PURPOSE_ENVELOPE,
        "round_id": round_id,
        "commitment": commitment,
        "total_minor": total_minor,
        "shares": shares,
        "min_minor": min_minor,
        "client_seed": client_seed,
        "client_seeds": sorted(client_seeds),
        "amounts": list(split.amounts),
        "grab_order": list(split.grab_order),
        "test_envelope": test_envelope,
    }
    body = record_bytes(fields)
    padded = len(record_bytes({**fields, "amounts": [total_minor] * len(split.amounts)}))
    return body + b" " * max(0, padded - len(body))


def open_record(server_seed: bytes, purpose: str, round_id: str, nonce: bytes, sealed: bytes) -> dict[str, Any]:
    """Open a sealed record and parse it; ``SealError`` if it does not open or is not a record of this round."""
    plaintext = open_sealed(server_seed, purpose, round_id, nonce, sealed)
    try:
        record = json.loads(plaintext.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SealError(f"the sealed {purpose} record opens but is not JSON: {error}") from None
    if not isinstance(record, dict) or record.get("purpose") != purpose or record.get("round_id") != round_id:
        raise SealError(f"the sealed record opens but is not the {purpose} record of round {round_id!r}")
    return record


def check_sealed_record(
    server_seed: bytes, purpose: str, round_id: str, client_seed: str, nonce: bytes, sealed: bytes, expected: bytes
) -> Check:
    """Open a sealed record with the revealed seed and compare it with ``expected``, the record as derived.

    ``expected`` is ``deck_record``/``envelope_record`` of the derived deal (its
    ``client_seeds`` are not compared: the record's own list must combine into its
    client seed, which must be ``client_seed``). Records are compared parsed, so a
    verifier need not reproduce our bytes.
    """
    name = f"sealed_{purpose}"
    try:
        record = open_record(server_seed, purpose, round_id, nonce, sealed)
    except SealError as error:
        return Check(name, False, str(error))
    if record.get("test_deck") or record.get("test_envelope"):
        return Check(name, False, "the sealed record says the deal was a TEST deck/envelope, not derived from the seed")
    sealed_client_seed = record.get("client_seed")
    if sealed_client_seed != client_seed:
        return Check(name, False, f"the sealed record has client seed {sealed_client_seed!r}, not {client_seed!r}")
    contributions = record.get("client_seeds")
    try:
        combined = combine_client_seeds(contributions) if contributions else ""
    except (ClientSeedError, TypeError) as error:
        return Check(name, False, f"the sealed record's client seeds are malformed: {error}")
    if contributions and combined != sealed_client_seed:
        return Check(name, False, "the sealed record's client seeds do not combine into its client seed")
    derived = json.loads(expected.decode("utf-8"))
    keys = (derived.keys() | record.keys()) - {"client_seeds"}
    differing = sorted(key for key in keys if record.get(key) != derived.get(key))
    if differing:
        return Check(name, False, f"the sealed record differs from the derived deal in: {', '.join(differing)}")
    return Check(name, True, f"opens with the revealed seed and matches the derived {purpose} record")


def check_client_seeds(client_seed: str, contributions: Sequence[str]) -> Check:
    """Check that the players' contributions combine into the round's published client seed.

    Malformed contributions raise ``ClientSeedError`` (bad input, not a failed check).
    """
    combined = combine_client_seeds(contributions)
    if hmac.compare_digest(combined.encode("ascii"), client_seed.encode("utf-8")):
        return Check("client_seed", True, f"the {len(contributions)} client seeds combine into {combined or '(empty)'}")
    return Check(
        "client_seed",
        False,
        f"the {len(contributions)} client seeds combine into {combined or '(empty)'}, "
        f"but the round used {client_seed or '(empty)'}",
    )
