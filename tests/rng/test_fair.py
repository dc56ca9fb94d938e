"""The provably-fair derivation: spec conformance, test vectors, determinism, verification."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bull import fairness as fair
from bull.cards import DECK_52, DECK_54, Card, format_cards, parse_cards
from bull.fairness import EnvelopeError, EnvelopeRecord, FairInputError, Split
from services.rng.seeds import new_server_seed

SEED_A = bytes(range(32))
SEED_B = hashlib.sha256(b"niuniu vector seed 3").digest()
COMMIT_A = "630dcd2966c4336691125448bbb25b4ff412a49c732db2c8abc1b8581bd710dd"
COMMIT_B = "a1bdbd277c35e12013a1f0008f1a8cceca88b2eaa245653ab9b5291a479f1538"
ROUND_B = "牛牛-42"
CLIENT_B = "Ünïcode ✓"
DOC = Path(__file__).resolve().parents[2] / "docs" / "fairness.md"

seeds = st.binary(min_size=32, max_size=32)
texts = st.text(max_size=40)
round_ids = st.text(min_size=1, max_size=40)


# --------------------------------------------------------------------------- reference
# A second implementation written from docs/fairness.md only: slow and literal (the
# stream as a string of '0'/'1'), so that a shortcut in fair.py cannot go unnoticed.


class _ReferenceStream:
    def __init__(self, seed: bytes, purpose: str, round_id: str, client_seed: str) -> None:
        self.seed = seed
        self.fields = b"".join(
            len(s.encode()).to_bytes(4, "big") + s.encode() for s in ("niuniu-fair-v1", purpose, round_id, client_seed)
        )
        self.bits = ""
        self.blocks = 0

    def take(self, k: int) -> int:
        while len(self.bits) < k:
            message = self.fields + self.blocks.to_bytes(8, "big")
            block = hmac.new(self.seed, message, "sha256").digest()
            self.bits += "".join(format(byte, "08b") for byte in block)
            self.blocks += 1
        taken, self.bits = self.bits[:k], self.bits[k:]
        return int(taken, 2) if taken else 0

    def uniform(self, n: int) -> int:
        if n == 1:
            return 0
        k = len(bin(n - 1)) - 2
        while True:
            x = self.take(k)
            if x < n:
                return x

    def fisher_yates(self, items: list[int]) -> list[int]:
        for i in range(len(items) - 1, 0, -1):
            j = self.uniform(i + 1)
            items[i], items[j] = items[j], items[i]
        return items


def _reference_deck(seed: bytes, round_id: str, client_seed: str, size: int) -> list[int]:
    return _ReferenceStream(seed, "deck", round_id, client_seed).fisher_yates(list(range(size)))


def _reference_split(
    seed: bytes, round_id: str, client_seed: str, total: int, shares: int, least: int
) -> tuple[list[int], list[int]]:
    stream = _ReferenceStream(seed, "envelope", round_id, client_seed)
    amounts, remaining = [], total
    for s in range(shares - 1):
        left = shares - s
        high = min((2 * remaining) // left, remaining - (left - 1) * least)
        amounts.append(least + stream.uniform(high - least + 1))
        remaining -= amounts[-1]
    amounts.append(remaining)
    return amounts, stream.fisher_yates(list(range(shares)))


@settings(max_examples=150, deadline=None)
@given(seed=seeds, round_id=round_ids, client_seed=texts, size=st.sampled_from([52, 54]))
def test_shuffle_matches_reference_implementation(seed: bytes, round_id: str, client_seed: str, size: int) -> None:
    cards = fair.shuffle(seed, round_id, client_seed, size)
    assert [card.index for card in cards] == _reference_deck(seed, round_id, client_seed, size)


@settings(max_examples=150, deadline=None)
@given(
    seed=seeds,
    round_id=round_ids,
    client_seed=texts,
    shares=st.integers(1, 40),
    least=st.integers(1, 500),
    extra=st.integers(0, 10**9),
)
def test_split_matches_reference_implementation(
    seed: bytes, round_id: str, client_seed: str, shares: int, least: int, extra: int
) -> None:
    total = shares * least + extra
    split = fair.split_envelope(seed, round_id, client_seed, total, shares, least)
    amounts, grab_order = _reference_split(seed, round_id, client_seed, total, shares, least)
    assert split == Split(tuple(amounts), tuple(grab_order))


@settings(max_examples=100, deadline=None)
@given(seed=seeds, n_values=st.lists(st.integers(1, 2**70), min_size=1, max_size=30))
def test_uniform_and_bits_match_reference(seed: bytes, n_values: list[int]) -> None:
    stream = fair.Stream(seed, "deck", "r", "")
    reference = _ReferenceStream(seed, "deck", "r", "")
    for n in n_values:
        assert stream.uniform(n) == reference.uniform(n)
        assert stream.bits(n % 13) == reference.take(n % 13)


def test_stream_block_is_rfc2104_hmac_of_the_documented_message() -> None:
    stream = fair.Stream(SEED_A, "deck", "round-0001", "")
    for counter in (0, 1, 2**40 + 7):
        message = fair.stream_message("deck", "round-0001", "", counter)
        assert stream.block(counter) == hmac.new(SEED_A, message, hashlib.sha256).digest()
    blocks = stream.blocks(start=5)
    assert [next(blocks) for _ in range(3)] == [stream.block(i) for i in range(5, 8)]


def test_draw_consumes_the_minimal_number_of_bits() -> None:
    stream, reference = fair.Stream(SEED_A, "deck", "r"), _ReferenceStream(SEED_A, "deck", "r", "")
    assert stream.uniform(1) == 0  # consumes nothing
    assert stream.uniform(8) == reference.take(3)  # 3 bits, never rejected
    assert stream.uniform(2) == reference.take(1)
    assert stream.bits(250) == reference.take(250)  # crosses a block boundary


# --------------------------------------------------------------------------- vectors


def test_vector_stream_internals() -> None:
    assert fair.commit(SEED_A) == COMMIT_A
    assert fair.commit(SEED_B) == COMMIT_B
    assert SEED_B.hex() == "fc8c2e460e09d6d0eb8793beeadfd10e099c9571ed7aa61ad1794a11d64fce01"
    fields = ["0000000e6e69756e69752d666169722d7631", "000000046465636b", "0000000a726f756e642d30303031", "00000000"]
    assert fair.stream_message("deck", "round-0001", "", 0).hex() == "".join(fields) + "0000000000000000"
    deck_stream = fair.Stream(SEED_A, "deck", "round-0001", "")
    assert deck_stream.block(0).hex() == "1e2207d7dde4936e511ccfae66f9b14c9f7562bb646e6d18db2b13968d07bec8"
    assert deck_stream.block(1).hex() == "30e78557626830affeb07e487e794c25aa92d4f3e4de417063aa28b82d143ebc"
    assert [deck_stream.bits(6) for _ in range(9)] == [7, 34, 8, 7, 53, 61, 55, 36, 36]
    assert fair.stream_message("envelope", "round-0001", "", 0).hex() == (
        "0000000e6e69756e69752d666169722d763100000008656e76656c6f70650000000a726f756e642d30303031"
        "000000000000000000000000"
    )
    envelope_stream = fair.Stream(SEED_A, "envelope", "round-0001", "")
    assert envelope_stream.block(0).hex() == "dfda09cb981f6dcaa0bf9f092edd0bf89d047d3412a4a33be3c92386da590a37"
    assert ROUND_B.encode().hex() == "e7899be7899b2d3432"
    assert CLIENT_B.encode().hex() == "c39c6ec3af636f646520e29c93"


DECK_VECTORS = [
    (
        SEED_A,
        "round-0001",
        "",
        52,
        "4C QD AS 5C 7D TH QC 7S 8C AH 3S 4D 6S AC 6H JD 6C 4H 5S 9H QS 3C 4S 8H AD 5D "
        "JH JS 2S 3H 2H TC 7C 6D 2D 3D 2C 8D QH TS 7H KC KH KS TD 5H 9D JC KD 9S 9C 8S",
    ),
    (
        SEED_A,
        "round-0001",
        "lucky7",
        54,
        "4H 3C 9S 3D 2D 9D 7H 6D 8H AH 8D JS 7S 3H AC JC 6S JH 2S QS 2H QH 3S 4S BJ 9C KS "
        "5H 8C AD 8S 6C 5D KH KC QD 4C TS 5S 4D AS 9H JD KD TC 7C 2C SJ 6H 7D QC TD 5C TH",
    ),
    (
        SEED_B,
        ROUND_B,
        CLIENT_B,
        52,
        "5D 2C 7S 4S QH 8S 4H 9C 9D 3H 3S KS JD KH 7H KD 8C 4C 6H 7D AS AH 9S 8H KC JS "
        "2H 6C 5H 5C QD 8D AD TD 5S QS 3D AC 6D JH 9H TC 2D 7C 2S 6S 3C TS 4D QC JC TH",
    ),
]

ENVELOPE_VECTORS = [
    (SEED_A, "round-0001", "", (1000, 5, 1), (361, 79, 186, 260, 114), (0, 4, 2, 1, 3)),
    (
        SEED_A,
        "round-0001",
        "lucky7",
        (10000, 12, 1),
        (764, 1002, 511, 320, 1228, 1215, 963, 979, 1306, 724, 453, 535),
        (9, 8, 6, 1, 4, 11, 7, 3, 0, 5, 2, 10),
    ),
    (SEED_B, ROUND_B, CLIENT_B, (500000, 3, 100), (231426, 121268, 147306), (1, 2, 0)),
    (SEED_A, "round-0001", "", (10, 10, 1), (1,) * 10, (5, 7, 3, 4, 2, 1, 6, 9, 8, 0)),
    (SEED_A, "round-0001", "", (777, 1, 1), (777,), (0,)),
]


@pytest.mark.parametrize(("seed", "round_id", "client_seed", "size", "codes"), DECK_VECTORS)
def test_deck_vectors(seed: bytes, round_id: str, client_seed: str, size: int, codes: str) -> None:
    assert format_cards(fair.shuffle(seed, round_id, client_seed, size)) == codes
    assert " ".join(codes.split()[:26]) in " ".join(DOC.read_text().split())  # the doc shows the same vector


@pytest.mark.parametrize(("seed", "round_id", "client_seed", "params", "amounts", "grab_order"), ENVELOPE_VECTORS)
def test_envelope_vectors(
    seed: bytes,
    round_id: str,
    client_seed: str,
    params: tuple[int, int, int],
    amounts: tuple[int, ...],
    grab_order: tuple[int, ...],
) -> None:
    split = fair.split_envelope(seed, round_id, client_seed, *params)
    assert split == Split(amounts, grab_order)
    assert split.total_minor == params[0]
    doc = DOC.read_text()
    assert ", ".join(map(str, grab_order)) in doc
    if len(set(amounts)) > 1:
        assert ", ".join(map(str, amounts)) in doc
        by_position = ", ".join(map(str, split.by_position))
        assert re.search(rf"\| {re.escape(by_position)} \|", doc)


# --------------------------------------------------------------------------- determinism, separation


def test_same_inputs_same_outputs() -> None:
    for size in (52, 54):
        assert fair.shuffle(SEED_A, "r-1", "c", size) == fair.shuffle(SEED_A, "r-1", "c", size)
    envelope = (SEED_A, "r-1", "c", 10_000, 7, 3)
    assert fair.split_envelope(*envelope) == fair.split_envelope(*envelope)


def _first_block(seed: bytes, purpose: str, round_id: str, client_seed: str) -> bytes:
    return fair.Stream(seed, purpose, round_id, client_seed).block(0)


def test_different_inputs_give_different_streams() -> None:
    base = ("deck", "round-1", "client")
    variants = [
        base,
        ("envelope", "round-1", "client"),
        ("deck", "round-2", "client"),
        ("deck", "round-1", "client2"),
        ("deck", "round-1", ""),
        # Field boundaries are length-prefixed, so moving characters between fields changes the stream.
        ("deck", "round-1c", "lient"),
        ("deckr", "ound-1", "client"),
    ]
    blocks = {_first_block(SEED_A, *variant) for variant in variants}
    assert len(blocks) == len(variants)
    assert _first_block(SEED_B, *base) not in blocks
    assert fair.shuffle(SEED_A, "round-1") != fair.shuffle(SEED_A, "round-2")
    assert fair.shuffle(SEED_A, "round-1", "a") != fair.shuffle(SEED_A, "round-1", "b")


def test_deck_and_envelope_streams_of_a_round_share_no_block() -> None:
    deck_stream = fair.Stream(SEED_A, fair.PURPOSE_DECK, "round-1", "c")
    envelope_stream = fair.Stream(SEED_A, fair.PURPOSE_ENVELOPE, "round-1", "c")
    assert not {deck_stream.block(i) for i in range(64)} & {envelope_stream.block(i) for i in range(64)}


@settings(max_examples=50, deadline=None)
@given(seed=seeds, round_id=round_ids, client_seed=texts, size=st.sampled_from([52, 54]))
def test_shuffle_permutes_the_canonical_deck(seed: bytes, round_id: str, client_seed: str, size: int) -> None:
    cards = fair.shuffle(seed, round_id, client_seed, size)
    assert sorted(card.index for card in cards) == list(range(size))


def test_new_server_seed_is_32_fresh_bytes() -> None:
    produced = {new_server_seed() for _ in range(100)}
    assert len(produced) == 100
    assert all(isinstance(seed, bytes) and len(seed) == 32 for seed in produced)


# --------------------------------------------------------------------------- input validation


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: fair.commit(b"short"), "exactly 32 bytes, got 5"),
        (lambda: fair.shuffle(SEED_A + b"x", "r"), "exactly 32 bytes, got 33"),
        (lambda: fair.shuffle(SEED_A, ""), "round id must not be empty"),
        (lambda: fair.shuffle(SEED_A, "r", "x" * 1025), "client seed is 1025 bytes"),
        (lambda: fair.shuffle(SEED_A, "r", "", 53), "deck size must be 52 or 54"),
        (lambda: fair.Stream(SEED_A, "", "r"), "purpose must not be empty"),
        (lambda: fair.parse_seed("zz"), "must be hex"),
        (lambda: fair.parse_commitment("abc"), "64 hex digits"),
        (lambda: fair.stream_message("deck", "r", "", -1), "counter"),
    ],
)
def test_malformed_inputs_raise_fair_input_error(call: Callable[[], object], message: str) -> None:
    with pytest.raises(FairInputError, match=re.escape(message)):
        call()


@pytest.mark.parametrize(
    ("total", "shares", "least", "message"),
    [
        (9, 10, 1, "cannot give 10 shares of at least 1 (needs 10)"),
        (100, 0, 1, "shares must be 1..10000"),
        (10**6, 10_001, 1, "shares must be 1..10000"),
        (100, 2, 0, "min_minor must be at least 1"),
        (10**15 + 1, 2, 1, "at most 1000000000000000"),
        (100, 2, True, "min_minor must be an integer"),
        (100.0, 2, 1, "total_minor must be an integer"),
    ],
)
def test_bad_envelopes_raise_envelope_error(total: int, shares: int, least: int, message: str) -> None:
    with pytest.raises(EnvelopeError, match=re.escape(message)):
        fair.split_envelope(SEED_A, "r", "", total, shares, least)


def test_largest_envelope_is_accepted() -> None:
    split = fair.split_envelope(SEED_A, "r", "", fair.MAX_TOTAL_MINOR, fair.MAX_SHARES, 1)
    assert split.total_minor == fair.MAX_TOTAL_MINOR
    assert sorted(split.grab_order) == list(range(fair.MAX_SHARES))


# --------------------------------------------------------------------------- verify_round


@pytest.mark.parametrize("size", [52, 54])
def test_round_trip_commit_shuffle_verify(size: int) -> None:
    seed = new_server_seed()
    published = fair.commit(seed)
    cards = fair.shuffle(seed, "round-77", "client", size)
    full = fair.verify_round(published, seed, "round-77", "client", deck_size=size, dealt=cards)
    assert full.ok, full.failures
    assert [check.name for check in full.checks] == ["commitment", "deck"]
    assert full.deck == cards
    dealt_20 = fair.verify_round(published.upper(), seed, "round-77", "client", deck_size=size, dealt=cards[:20])
    assert dealt_20.ok


def test_round_trip_envelope() -> None:
    seed = new_server_seed()
    published = fair.commit(seed)
    split = fair.split_envelope(seed, "round-8", "", 6800, 9, 1)
    record = EnvelopeRecord(6800, 9, 1, split.amounts, split.grab_order)
    result = fair.verify_round(published, seed, "round-8", envelope=record)
    assert result.ok, result.failures
    assert [check.name for check in result.checks] == ["commitment", "split", "grab_order"]
    assert result.split == split


def test_tampered_seed_fails_with_a_reason() -> None:
    seed = new_server_seed()
    published = fair.commit(seed)
    cards = fair.shuffle(seed, "round-1")
    other = bytes([seed[0] ^ 1]) + seed[1:]
    result = fair.verify_round(published, other, "round-1", deck_size=52, dealt=cards)
    assert not result.ok
    assert {check.name for check in result.failures} == {"commitment", "deck"}
    assert "published commitment is " + published in result.failures[0].detail


def test_tampered_deck_fails_with_a_reason() -> None:
    seed = SEED_A
    cards = list(fair.shuffle(seed, "round-0001"))
    cards[3], cards[4] = cards[4], cards[3]
    result = fair.verify_round(COMMIT_A, seed, "round-0001", deck_size=52, dealt=cards[:5])
    assert [check.name for check in result.failures] == ["deck"]
    assert result.failures[0].detail.startswith("position 3: the table dealt 7D but the seed gives 5C")


def test_impossible_deals_fail_the_deck_check() -> None:
    duplicate = (*parse_cards("4C QD"), parse_cards("4C")[0])
    result = fair.verify_round(COMMIT_A, SEED_A, "round-0001", deck_size=52, dealt=duplicate)
    assert [check.detail for check in result.failures] == [
        "position 2: the table dealt 4C but the seed gives AS (1 of 3 dealt cards differ)"
    ]
    joker = fair.verify_round(COMMIT_A, SEED_A, "round-0001", deck_size=52, dealt=(Card(14, None),))
    assert not joker.ok
    too_many = fair.verify_round(COMMIT_A, SEED_A, "round-0001", deck_size=52, dealt=DECK_54)
    assert "dealt 54 cards from a 52-card deck" in too_many.failures[0].detail
    assert fair.verify_round(COMMIT_A, SEED_A, "round-0001", deck_size=52, dealt=()).ok


def test_tampered_split_and_grab_order_fail_with_reasons() -> None:
    honest = EnvelopeRecord(1000, 5, 1, (361, 79, 186, 260, 114), (0, 4, 2, 1, 3))
    assert fair.verify_round(COMMIT_A, SEED_A, "round-0001", envelope=honest).ok
    moved = replace(honest, amounts=(361, 79, 186, 259, 115))
    result = fair.verify_round(COMMIT_A, SEED_A, "round-0001", envelope=moved)
    assert [(c.name, c.detail) for c in result.failures] == [
        ("split", "share 3: the table recorded 259 but the seed gives 260")
    ]
    reordered = replace(honest, grab_order=(4, 0, 2, 1, 3))
    assert [c.name for c in fair.verify_round(COMMIT_A, SEED_A, "round-0001", envelope=reordered).failures] == [
        "grab_order"
    ]
    short = replace(honest, amounts=(361, 79, 186, 374))
    assert (
        "recorded 4 values but the seed gives 5"
        in fair.verify_round(COMMIT_A, SEED_A, "round-0001", envelope=short).failures[0].detail
    )


def test_verify_needs_a_deck_size_for_dealt_cards() -> None:
    with pytest.raises(FairInputError, match="deck_size"):
        fair.verify_round(COMMIT_A, SEED_A, "round-0001", dealt=DECK_52[:5])
    with pytest.raises(FairInputError, match="64 hex digits"):
        fair.verify_round("nothex", SEED_A, "round-0001")
