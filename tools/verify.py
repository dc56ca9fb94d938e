"""``niuniu-verify``: recompute a round from its revealed seed and check what the table did.

Besides the deal the table recorded, it checks the players' client seeds against the
round's client seed (``--client-seeds``) and opens the sealed records of the audit topic
with the revealed seed (``--sealed-deck``, ``--sealed-envelope``).

Exit status: 0 when every check passes, 1 when a check fails, 2 on bad input.
The derivation is specified in docs/fairness.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from bull.cards import CardError, parse_card
from bull.fairness import (
    DECK_SIZES,
    PURPOSE_DECK,
    PURPOSE_ENVELOPE,
    SEAL_NONCE_BYTES,
    EnvelopeRecord,
    FairInputError,
    Verification,
    check_client_seeds,
    check_sealed_record,
    combine_client_seeds,
    commit,
    deck_record,
    envelope_record,
    parse_commitment,
    parse_seed,
    verify_round,
)

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2


class _BadInput(ValueError):
    """An argument that parses but makes no sense (reported with exit status 2)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="niuniu-verify",
        description="Verify a provably-fair Niu Niu round (deck order and red-envelope split) "
        "from its revealed server seed. Specification: docs/fairness.md.",
    )
    parser.add_argument("--commitment", required=True, metavar="HEX", help="the published SHA-256 of the seed")
    parser.add_argument("--seed", required=True, metavar="HEX", help="the revealed 32-byte server seed, in hex")
    parser.add_argument("--round", required=True, dest="round_id", metavar="ROUND_ID", help="the round id")
    parser.add_argument(
        "--client-seed", default=None, metavar="S", help="the round's client seed (default: empty, or the combination)"
    )
    parser.add_argument(
        "--client-seeds",
        metavar="A,B,C",
        help="the players' client seeds (any order): the round's client seed is their combination, "
        "checked against --client-seed when both are given",
    )
    parser.add_argument("--deck", type=int, choices=DECK_SIZES, metavar="52|54", help="derive a deck of this size")
    parser.add_argument("--dealt", metavar="CARDS", help='cards the table dealt, in deck order: "AS TD ..."')
    parser.add_argument(
        "--envelope", metavar="TOTAL_MINOR:SHARES:MIN_MINOR", help="derive the red-envelope split of these parameters"
    )
    parser.add_argument("--split", metavar="A,B,C", help="the split the table recorded (minor units, share order)")
    parser.add_argument("--grab-order", metavar="P,Q,R", help="the grab order the table recorded")
    parser.add_argument(
        "--sealed-deck",
        metavar="NONCE_HEX:CIPHERTEXT_HEX",
        help="the sealed deck record of the audit topic: opened with the seed and compared (needs --deck)",
    )
    parser.add_argument(
        "--sealed-envelope",
        metavar="NONCE_HEX:CIPHERTEXT_HEX",
        help="the sealed envelope record of the audit topic: opened and compared (needs --envelope)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse has printed usage and the error (or --help)
        return exit_.code if isinstance(exit_.code, int) else EXIT_BAD_INPUT
    try:
        result = _verify(args)
    except (_BadInput, FairInputError, CardError) as error:
        print(f"niuniu-verify: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        json.dump(_as_json(args, result), sys.stdout, ensure_ascii=False, indent=2)
        print()
    else:
        _print_text(args, result, sys.stdout)
    return EXIT_OK if result.ok else EXIT_CHECK_FAILED


def _verify(args: argparse.Namespace) -> Verification:
    seed = parse_seed(args.seed)
    contributions = None if args.client_seeds is None else _contributions(args.client_seeds)
    if args.client_seed is None:
        args.client_seed = "" if contributions is None else combine_client_seeds(contributions)
    dealt = None
    if args.dealt is not None:
        if args.deck is None:
            raise _BadInput("--dealt needs --deck 52|54")
        # Not parse_cards: a duplicate is something the table did, so it fails the deck check.
        dealt = [parse_card(code) for code in args.dealt.replace(",", " ").split()]
    envelope = None
    if args.envelope is not None:
        total_minor, shares, min_minor = _ints(args.envelope, ":", "--envelope", count=3)
        envelope = EnvelopeRecord(
            total_minor,
            shares,
            min_minor,
            amounts=None if args.split is None else _ints(args.split, ",", "--split"),
            grab_order=None if args.grab_order is None else _ints(args.grab_order, ",", "--grab-order"),
        )
    elif args.split is not None or args.grab_order is not None:
        raise _BadInput("--split and --grab-order need --envelope TOTAL_MINOR:SHARES:MIN_MINOR")
    if args.sealed_deck is not None and args.deck is None:
        raise _BadInput("--sealed-deck needs --deck 52|54")
    if args.sealed_envelope is not None and envelope is None:
        raise _BadInput("--sealed-envelope needs --envelope TOTAL_MINOR:SHARES:MIN_MINOR")
    sealed_deck = None if args.sealed_deck is None else _sealed(args.sealed_deck, "--sealed-deck")
    sealed_envelope = None if args.sealed_envelope is None else _sealed(args.sealed_envelope, "--sealed-envelope")
    result = verify_round(args.commitment, seed, args.round_id, args.client_seed, args.deck, dealt, envelope)
    checks = list(result.checks)
    if contributions is not None:
        checks.insert(1, check_client_seeds(args.client_seed, contributions))
    published = parse_commitment(args.commitment)
    if sealed_deck is not None and result.deck is not None:
        cards = [card.code for card in result.deck]
        expected = deck_record(args.round_id, published, len(cards), args.client_seed, contributions or (), cards)
        checks.append(check_sealed_record(seed, PURPOSE_DECK, args.round_id, args.client_seed, *sealed_deck, expected))
    if sealed_envelope is not None and result.split is not None and envelope is not None:
        expected = envelope_record(
            args.round_id,
            published,
            envelope.total_minor,
            envelope.shares,
            envelope.min_minor,
            args.client_seed,
            contributions or (),
            result.split,
        )
        checks.append(
            check_sealed_record(seed, PURPOSE_ENVELOPE, args.round_id, args.client_seed, *sealed_envelope, expected)
        )
    return Verification(tuple(checks), result.deck, result.split)


def _contributions(text: str) -> list[str]:
    """The players' client seeds, separated by commas and/or white space (neither can occur in one)."""
    return [part for part in text.replace(",", " ").split() if part]


def _sealed(text: str, option: str) -> tuple[bytes, bytes]:
    nonce_hex, separator, ciphertext_hex = text.strip().partition(":")
    try:
        nonce, ciphertext = bytes.fromhex(nonce_hex), bytes.fromhex(ciphertext_hex)
    except ValueError:
        raise _BadInput(f"{option} must be NONCE_HEX:CIPHERTEXT_HEX") from None
    if not separator or len(nonce) != SEAL_NONCE_BYTES or not ciphertext:
        raise _BadInput(f"{option} must be NONCE_HEX:CIPHERTEXT_HEX with a {SEAL_NONCE_BYTES}-byte nonce")
    return nonce, ciphertext


def _ints(text: str, separator: str, option: str, count: int | None = None) -> tuple[int, ...]:
    parts = [part.strip() for part in text.split(separator)]
    try:
        values = tuple(int(part) for part in parts)
    except ValueError:
        raise _BadInput(f"{option} must be integers separated by {separator!r}, got {text!r}") from None
    if count is not None and len(values) != count:
        raise _BadInput(f"{option} must be {count} integers separated by {separator!r}, got {text!r}")
    return values


def _as_json(args: argparse.Namespace, result: Verification) -> dict[str, Any]:
    split = result.split
    return {
        "ok": result.ok,
        "round_id": args.round_id,
        "client_seed": args.client_seed,
        "client_seeds": None if args.client_seeds is None else sorted(_contributions(args.client_seeds)),
        "seed_commitment": commit(parse_seed(args.seed)),
        "deck": None if result.deck is None else [card.code for card in result.deck],
        "split": None
        if split is None
        else {
            "amounts": list(split.amounts),
            "grab_order": list(split.grab_order),
            "by_position": list(split.by_position),
        },
        "checks": [{"name": check.name, "ok": check.ok, "detail": check.detail} for check in result.checks],
    }


def _print_text(args: argparse.Namespace, result: Verification, out: TextIO) -> None:
    print(f"round        {args.round_id}  (client seed {args.client_seed!r})", file=out)
    if result.deck is not None:
        print(f"deck ({len(result.deck)})    {' '.join(card.code for card in result.deck)}", file=out)
    if result.split is not None:
        print(f"envelope     {args.envelope}", file=out)
        print(f"  amounts    {_join(result.split.amounts)}", file=out)
        print(f"  grab order {_join(result.split.grab_order)}", file=out)
        print(f"  received   {_join(result.split.by_position)}  (by participant position)", file=out)
    for check in result.checks:
        print(f"{'ok  ' if check.ok else 'FAIL'}  {check.name:<10}  {check.detail}", file=out)
    failed = len(result.failures)
    verdict = "PASS" if result.ok else f"FAIL ({failed} of {len(result.checks)} checks failed)"
    print(f"result: {verdict}", file=out)


def _join(values: Sequence[int]) -> str:
    return " ".join(str(value) for value in values)


if __name__ == "__main__":
    sys.exit(main())
