"""Players' client seeds (docs/fairness.md section 10) and sealed audit records (section 11): vectors, properties."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bull import fairness as fair
from bull.cards import deck
from bull.fairness import ClientSeedError, FairInputError, SealError

SEED_A = bytes(range(32))
COMMIT_A = "630dcd2966c4336691125448bbb25b4ff412a49c732db2c8abc1b8581bd710dd"
NONCE = bytes(range(12))
DOC = Path(__file__).resolve().parents[2] / "docs" / "fairness.md"
DOC_TEXT = " ".join(DOC.read_text().split())

ALPHABET = "".join(sorted(fair.CLIENT_SEED_CONTRIBUTION_ALPHABET))
contributions = st.text(alphabet=ALPHABET, min_size=1, max_size=fair.CLIENT_SEED_CONTRIBUTION_MAX_CHARS)
contribution_lists = st.lists(contributions, min_size=1, max_size=30)
seeds = st.binary(min_size=32, max_size=32)
round_ids = st.text(min_size=1, max_size=40)


def _field(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(4, "big") + data


def _reference_combination(values: list[str]) -> str:
    """Section 10 written out again, literally."""
    if not values:
        return ""
    ordered = sorted(values, key=lambda v: v.encode())
    message = _field("niuniu-client-seeds-v1") + len(ordered).to_bytes(4, "big") + b"".join(map(_field, ordered))
    return hashlib.sha256(message).hexdigest()


def _reference_key(seed: bytes, purpose: str, round_id: str) -> bytes:
    """RFC 5869 with HMAC-SHA256 by hand (one output block), from section 11."""
    prk = hmac.new(b"niuniu-seal-v1", seed, hashlib.sha256).digest()
    info = _field("niuniu-seal-v1") + _field(purpose) + _field(round_id)
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()


# --------------------------------------------------------------------------- client seeds


def test_combination_vector() -> None:
    combined = fair.combine_client_seeds(["lucky7", "alice-42", "b0b"])
    assert combined == "da6f7886da2cabb6022effd91aa9303a527911f064ac3cecdc4bbc3d74d0025d"
    assert combined in DOC_TEXT
    deck = " ".join(card.code for card in fair.shuffle(SEED_A, "round-0001", combined, 52))
    assert deck.startswith("8D 9C 6C QH QC 6D 3S TC")
    assert deck[:77] in DOC_TEXT  # the doc shows the same deck
    one = "2a259f824bb0f6f5907e74ac1257045a1eb3abbf70ccf6e4569f13caba956d36"
    twice = "774b10585bfa68ce93b424e7617ef2c5d66fbb60bc0b812ffc8b5fb8f00f574e"
    assert fair.combine_client_seeds(["lucky7"]) == one
    assert fair.combine_client_seeds(["b0b", "b0b"]) == twice
    assert one in DOC_TEXT and twice in DOC_TEXT


def test_no_contribution_is_the_empty_client_seed() -> None:
    assert fair.combine_client_seeds([]) == ""
    # ... so a round without contributions is dealt exactly as before (vector D1).
    assert fair.shuffle(SEED_A, "round-0001", fair.combine_client_seeds([]), 52) == fair.shuffle(SEED_A, "round-0001")


@settings(max_examples=200, deadline=None)
@given(values=contribution_lists, data=st.data())
def test_every_permutation_gives_the_same_client_seed(values: list[str], data: st.DataObject) -> None:
    permuted = data.draw(st.permutations(values))
    combined = fair.combine_client_seeds(values)
    assert fair.combine_client_seeds(permuted) == combined
    assert combined == _reference_combination(values)
    assert re.fullmatch(r"[0-9a-f]{64}", combined)


@settings(max_examples=200, deadline=None)
@given(values=contribution_lists, data=st.data())
def test_changing_any_one_contribution_changes_the_client_seed(values: list[str], data: st.DataObject) -> None:
    index = data.draw(st.integers(0, len(values) - 1))
    replacement = data.draw(contributions.filter(lambda v: v != values[index]))
    changed = [*values[:index], replacement, *values[index + 1 :]]
    combined = fair.combine_client_seeds(values)
    assert fair.combine_client_seeds(changed) != combined
    assert fair.combine_client_seeds([*values, data.draw(contributions)]) != combined  # one more
    assert fair.combine_client_seeds(values[:index] + values[index + 1 :]) != combined  # one fewer


def test_the_encoding_is_injective_where_concatenation_is_not() -> None:
    assert fair.combine_client_seeds(["ab", "c"]) != fair.combine_client_seeds(["a", "bc"])
    assert fair.combine_client_seeds(["a"]) != fair.combine_client_seeds(["a", "a"])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "a client seed must not be empty"),
        ("x" * 65, "at most 64 characters, got 65"),
        ("has space", "character 3 is U+0020"),
        ("comma,", "character 5 is U+002C"),
        ("line\n", "character 4 is U+000A"),
        ("ünï", "character 0 is U+00FC"),
        ("nul\x00", "character 3 is U+0000"),
    ],
)
def test_malformed_contributions_are_refused_precisely(value: str, message: str) -> None:
    with pytest.raises(ClientSeedError, match=re.escape(message)):
        fair.combine_client_seeds(["fine", value])
    assert issubclass(ClientSeedError, FairInputError)


def test_longest_contribution_and_whole_alphabet_are_accepted() -> None:
    assert fair.check_client_seed_contribution("x" * 64) == "x" * 64
    assert fair.combine_client_seeds([ALPHABET[:64], ALPHABET[64:]])


def test_one_string_instead_of_a_list_is_refused() -> None:
    with pytest.raises(ClientSeedError, match="not one string"):
        fair.combine_client_seeds("lucky7")
    with pytest.raises(ClientSeedError, match="must be a string"):
        fair.combine_client_seeds([7])  # type: ignore[list-item]


def test_check_client_seeds() -> None:
    combined = fair.combine_client_seeds(["a", "b"])
    assert fair.check_client_seeds(combined, ["b", "a"]).ok
    failed = fair.check_client_seeds(combined, ["a", "c"])
    assert not failed.ok and failed.name == "client_seed" and f"but the round used {combined}" in failed.detail
    assert not fair.check_client_seeds("", ["a"]).ok
    assert fair.check_client_seeds("", []).ok
    assert not fair.check_client_seeds("lucky7", []).ok


# --------------------------------------------------------------------------- sealed records


def test_key_vectors_and_reference_hkdf() -> None:
    deck_key = fair.seal_key(SEED_A, "deck", "round-0001")
    envelope_key = fair.seal_key(SEED_A, "envelope", "round-0001")
    assert deck_key.hex() == "17e20801e341fd401d65763a0f92c6f4e40237080d88627f5d4bcfa4c8926d90"
    assert envelope_key.hex() == "a8ce0fc19f350080b35ab741bd357504051c1bd35a3ea1b9ab7b9e83605f4a3d"
    assert deck_key == _reference_key(SEED_A, "deck", "round-0001")
    context = fair.seal_context("envelope", "round-0001").hex()
    assert context == "0000000e6e69756e69752d7365616c2d763100000008656e76656c6f70650000000a726f756e642d30303031"
    for value in (deck_key.hex(), envelope_key.hex(), context):
        assert value in DOC_TEXT


@settings(max_examples=50, deadline=None)
@given(seed=seeds, round_id=round_ids, purpose=st.sampled_from(fair.SEAL_PURPOSES))
def test_key_matches_reference_and_is_separated_from_the_streams(seed: bytes, round_id: str, purpose: str) -> None:
    key = fair.seal_key(seed, purpose, round_id)
    assert key == _reference_key(seed, purpose, round_id)
    stream = fair.Stream(seed, purpose, round_id, "")
    assert all(key not in stream.block(i) for i in range(4))
    assert key != fair.seal_key(seed, "envelope" if purpose == "deck" else "deck", round_id)


def _e1() -> bytes:
    split = fair.split_envelope(SEED_A, "round-0001", "", 1000, 5, 1)
    return fair.envelope_record("round-0001", COMMIT_A, 1000, 5, 1, "", [], split)


def test_envelope_seal_vector() -> None:
    record = _e1()
    assert len(record) == 289 and record.endswith(b" " * 6) and not record.endswith(b" " * 7)
    assert record.rstrip().decode() in DOC_TEXT
    sealed = fair.seal(SEED_A, "envelope", "round-0001", record, NONCE)
    assert len(sealed) == 305
    hex_ = sealed.hex()
    doc_hex = "".join(re.findall(r"^ {6}([0-9a-f]{34,96})$", DOC.read_text(), flags=re.MULTILINE))
    assert hex_ == doc_hex
    assert fair.open_sealed(SEED_A, "envelope", "round-0001", NONCE, sealed) == record
    opened = fair.open_record(SEED_A, "envelope", "round-0001", NONCE, sealed)
    assert opened["amounts"] == [361, 79, 186, 260, 114] and opened["grab_order"] == [0, 4, 2, 1, 3]


def test_deck_seal_vector() -> None:
    values = ["lucky7", "alice-42", "b0b"]
    combined = fair.combine_client_seeds(values)
    cards = [card.code for card in fair.shuffle(SEED_A, "round-0001", combined, 52)]
    record = fair.deck_record("round-0001", COMMIT_A, 52, combined, values, cards)
    assert len(record) == 549
    assert json.loads(record)["client_seeds"] == ["alice-42", "b0b", "lucky7"]
    sealed = fair.seal(SEED_A, "deck", "round-0001", record, NONCE)
    digest = hashlib.sha256(sealed).hexdigest()
    assert digest == "d03c81fc72dc8266be4711ea16d1815a365859d8f107c9b7bc11630f18eb8ac6"
    assert digest in DOC_TEXT


def test_a_sealed_record_opens_only_with_its_seed_round_purpose_and_bytes() -> None:
    record = _e1()
    sealed = fair.seal(SEED_A, "envelope", "round-0001", record, NONCE)
    other_seed = bytes([SEED_A[0] ^ 1]) + SEED_A[1:]
    flipped = bytes([sealed[0] ^ 1]) + sealed[1:]
    tag_flipped = sealed[:-1] + bytes([sealed[-1] ^ 0x80])
    other_nonce = bytes([NONCE[0] ^ 1]) + NONCE[1:]
    for args in (
        (other_seed, "envelope", "round-0001", NONCE, sealed),
        (SEED_A, "deck", "round-0001", NONCE, sealed),
        (SEED_A, "envelope", "round-0002", NONCE, sealed),
        (SEED_A, "envelope", "round-0001", other_nonce, sealed),
        (SEED_A, "envelope", "round-0001", NONCE, flipped),
        (SEED_A, "envelope", "round-0001", NONCE, tag_flipped),
        (SEED_A, "envelope", "round-0001", NONCE, sealed[:-1]),
    ):
        with pytest.raises(SealError, match="does not open with this seed"):
            fair.open_sealed(*args)
    with pytest.raises(SealError, match="at least 16 bytes"):
        fair.open_sealed(SEED_A, "envelope", "round-0001", NONCE, sealed[:15])


def test_the_version_is_bound_by_the_associated_data() -> None:
    """A record sealed under another version label with the same key does not open as niuniu-seal-v1."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    key = fair.seal_key(SEED_A, "deck", "round-0001")
    other_context = _field("niuniu-seal-v2") + _field("deck") + _field("round-0001")
    forged = AESGCM(key).encrypt(NONCE, b"{}", other_context)
    with pytest.raises(SealError):
        fair.open_sealed(SEED_A, "deck", "round-0001", NONCE, forged)
    assert AESGCM(key).encrypt(NONCE, b"{}", fair.seal_context("deck", "round-0001")) == fair.seal(
        SEED_A, "deck", "round-0001", b"{}", NONCE
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: fair.seal(SEED_A, "deck", "r", b"x", b"short"), "a seal nonce is exactly 12 bytes, got 5"),
        (lambda: fair.seal(SEED_A, "hand", "r", b"x", NONCE), "purpose is one of deck, envelope"),
        (lambda: fair.seal(SEED_A[:31], "deck", "r", b"x", NONCE), "exactly 32 bytes, got 31"),
        (lambda: fair.seal(SEED_A, "deck", "", b"x", NONCE), "round id must not be empty"),
        (lambda: fair.open_sealed(SEED_A, "deck", "r", NONCE * 2, b"x" * 20), "exactly 12 bytes, got 24"),
    ],
)
def test_malformed_seal_arguments_raise_fair_input_error(call: Callable[[], object], message: str) -> None:
    with pytest.raises(FairInputError, match=re.escape(message)):
        call()


@settings(max_examples=100, deadline=None)
@given(seed=seeds, shares=st.integers(1, 30), least=st.integers(1, 50), extra=st.integers(0, 10**12))
def test_envelope_record_length_depends_only_on_public_parameters(
    seed: bytes, shares: int, least: int, extra: int
) -> None:
    total = shares * least + extra
    split = fair.split_envelope(seed, "r", "", total, shares, least)
    equal = fair.Split((least,) * (shares - 1) + (total - least * (shares - 1),), tuple(range(shares)))
    records = [fair.envelope_record("r", COMMIT_A, total, shares, least, "", ["a"], s) for s in (split, equal)]
    assert len(records[0]) == len(records[1])
    assert json.loads(records[0])["amounts"] == list(split.amounts)  # the padding is JSON white space


@settings(max_examples=30, deadline=None)
@given(seed=seeds, size=st.sampled_from(fair.DECK_SIZES), client_seed=st.text(alphabet=ALPHABET, max_size=64))
def test_deck_record_length_depends_only_on_public_parameters(seed: bytes, size: int, client_seed: str) -> None:
    cards = [card.code for card in fair.shuffle(seed, "r", client_seed, size)]
    canonical = [card.code for card in deck(size)]
    assert len(fair.deck_record("r", COMMIT_A, size, client_seed, [], cards)) == len(
        fair.deck_record("r", COMMIT_A, size, client_seed, [], canonical)
    )


def test_check_sealed_record() -> None:
    values = ["lucky7", "b0b"]
    combined = fair.combine_client_seeds(values)
    cards = [card.code for card in fair.shuffle(SEED_A, "round-0001", combined, 52)]
    expected = fair.deck_record("round-0001", COMMIT_A, 52, combined, values, cards)
    sealed = fair.seal(SEED_A, "deck", "round-0001", expected, NONCE)
    ok = fair.check_sealed_record(SEED_A, "deck", "round-0001", combined, NONCE, sealed, expected)
    assert ok.ok and ok.name == "sealed_deck"

    other_seed = bytes(32)
    wrong = fair.check_sealed_record(other_seed, "deck", "round-0001", combined, NONCE, sealed, expected)
    assert not wrong.ok and "does not open with this seed" in wrong.detail

    swapped = [cards[1], cards[0], *cards[2:]]
    tampered = fair.seal(
        SEED_A, "deck", "round-0001", fair.deck_record("round-0001", COMMIT_A, 52, combined, values, swapped), NONCE
    )
    differs = fair.check_sealed_record(SEED_A, "deck", "round-0001", combined, NONCE, tampered, expected)
    assert not differs.ok and differs.detail.endswith("differs from the derived deal in: cards")

    test_deck = fair.seal(
        SEED_A,
        "deck",
        "round-0001",
        fair.deck_record("round-0001", COMMIT_A, 52, combined, values, cards, test_deck=True),
        NONCE,
    )
    flagged = fair.check_sealed_record(SEED_A, "deck", "round-0001", combined, NONCE, test_deck, expected)
    assert not flagged.ok and "TEST" in flagged.detail

    not_theirs = fair.seal(
        SEED_A, "deck", "round-0001", fair.deck_record("round-0001", COMMIT_A, 52, combined, ["x"], cards), NONCE
    )
    inconsistent = fair.check_sealed_record(SEED_A, "deck", "round-0001", combined, NONCE, not_theirs, expected)
    assert not inconsistent.ok and "do not combine into its client seed" in inconsistent.detail

    other_client = fair.check_sealed_record(SEED_A, "deck", "round-0001", "", NONCE, sealed, expected)
    assert not other_client.ok and "has client seed" in other_client.detail


def test_a_record_of_another_round_is_refused_even_when_it_opens() -> None:
    """The key binds the round; the record's own round_id must agree with it too."""
    record = fair.record_bytes({"purpose": "deck", "round_id": "round-0002"})
    sealed = fair.seal(SEED_A, "deck", "round-0001", record, NONCE)
    with pytest.raises(SealError, match="not the deck record of round 'round-0001'"):
        fair.open_record(SEED_A, "deck", "round-0001", NONCE, sealed)
    not_json = fair.seal(SEED_A, "deck", "round-0001", b"\xff", NONCE)
    with pytest.raises(SealError, match="not JSON"):
        fair.open_record(SEED_A, "deck", "round-0001", NONCE, not_json)
