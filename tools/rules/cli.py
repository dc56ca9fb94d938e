"""``niuniu-rules``: the operator's command line for the rules engine.

Subcommands: ``eval``, ``compare``, ``census``, ``rtp``, ``report``; every one
takes ``--variant``, an id of ``bull.variants``, and dispatches to that variant's
adapter (``registry.get``). Input errors (a bad card, a bad config key or value,
an unknown variant) print one line on stderr and exit with status 2, never a
traceback.

    niuniu-rules eval --variant golden_bull AS AH AC AD 2S --json
    niuniu-rules compare --variant golden_bull KS KH KD KC QS -- AS AH AC AD 2S
    niuniu-rules census --variant golden_bull --json
    niuniu-rules rtp --variant golden_bull --set commission_bps=500 --json
    niuniu-rules rtp --variant baibian_bull --rounds 2000000 --seed 7 --json
    niuniu-rules report --variant golden_bull            # writes docs/math/golden_bull.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from bull import variants
from bull.rules import config as cfg
from tools.rules import registry
from tools.rules.adapter import CommandResult

EXIT_USAGE = 2
PROG = "niuniu-rules"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Niu Niu rules engine: evaluate, compare, count, RTP.")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--variant", required=True, help=f"one of: {', '.join(sorted(variants.VARIANTS))}")
        sub.add_argument("--config", metavar="FILE", help="settings file (.json or .toml)")
        sub.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE", help="override")
        return sub

    ev = command("eval", "category, points and multiplier of one hand")
    ev.add_argument("cards", nargs="+", metavar="CARD")
    ev.add_argument("--json", action="store_true")
    cmp = command("compare", "which of two hands wins and why: HAND_A -- HAND_B")
    cmp.add_argument("cards", nargs="+", metavar="CARD")
    cmp.add_argument("--json", action="store_true")
    census = command("census", "count every possible hand by category")
    census.add_argument("--json", action="store_true")
    rtp = command("rtp", "return to player of one area bet: exact where enumerable, else Monte Carlo")
    rtp.add_argument("--rounds", type=int, help="Monte Carlo rounds (omit for exact where the variant has it)")
    rtp.add_argument("--seed", type=int, default=1, help="Monte Carlo seed (default 1)")
    rtp.add_argument("--json", action="store_true")
    rtp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="bar on stderr")
    report = command("report", "write the markdown math report")
    report.add_argument("--out", help="output path, '-' for stdout (default docs/math/<variant>.md)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    hand_b, args_in = _split_hands(args_in)
    parser = build_parser()
    args = parser.parse_args(args_in)
    try:
        return _run(args, hand_b, sys.stdout, sys.stderr)
    except (ValueError, OSError) as exc:  # CardError and ConfigError are ValueErrors
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


# Options that take a value: after the second hand their value must move with them.
_VALUED_OPTIONS = frozenset({"--set", "--config", "--variant", "--rounds", "--seed", "--out"})


def _split_hands(argv: list[str]) -> tuple[list[str] | None, list[str]]:
    """``compare ... A -- B``: argparse would merge both hands, so split at ``--`` first.

    Options written after the second hand (``--json``, ``--set key=value``) are
    moved back in front, each with its value.
    """
    if "--" not in argv:
        return None, argv
    cut = argv.index("--")
    cards: list[str] = []
    options: list[str] = []
    after = iter(argv[cut + 1 :])
    for item in after:
        if not item.startswith("-"):
            cards.append(item)
            continue
        options.append(item)
        value = next(after, None) if item in _VALUED_OPTIONS else None
        if value is not None:
            options.append(value)
    return cards, argv[:cut] + options


def _run(args: argparse.Namespace, hand_b: list[str] | None, out: TextIO, err: TextIO) -> int:
    adapter = registry.get(args.variant)
    settings = cfg.merge(args.config, args.sets)
    if args.command == "eval":
        return _emit(adapter.eval(args.cards, settings), args.json, out)
    if args.command == "compare":
        hand_a, second = _two_hands(args.cards, hand_b)
        return _emit(adapter.compare(hand_a, second, settings), args.json, out)
    if args.command == "census":
        started = time.perf_counter()
        result = adapter.census(settings)
        seconds = round(time.perf_counter() - started, 6)
        timed = CommandResult({**result.data, "seconds": seconds}, f"{result.text}\n({seconds:.3f} s)")
        return _emit(timed, args.json, out)
    if args.command == "rtp":
        if args.rounds is not None and args.rounds <= 0:
            raise ValueError("--rounds must be positive")
        show = err.isatty() if args.progress is None else args.progress
        bar = ProgressBar(err) if show else None
        result = adapter.rtp(settings, rounds=args.rounds, seed=args.seed, progress=bar)
        if bar is not None:
            bar.close()
        return _emit(result, args.json, out)
    return _write_report(adapter.report(), args.out or f"docs/math/{adapter.variant_id}.md", out)


def _two_hands(cards: list[str], hand_b: list[str] | None) -> tuple[list[str], list[str]]:
    if hand_b is not None:
        if not hand_b:
            raise ValueError("compare: no cards after '--'")
        return cards, hand_b
    tokens = " ".join(cards).replace(",", " ").split()
    if len(tokens) != 10:
        raise ValueError("compare: give HAND_A -- HAND_B (or exactly ten cards: five and five)")
    return tokens[:5], tokens[5:]


def _emit(result: CommandResult, as_json: bool, out: TextIO) -> int:
    print(json.dumps(result.data, sort_keys=False) if as_json else result.text, file=out)
    return 0


def _write_report(markdown: str, path: str, out: TextIO) -> int:
    if path == "-":
        out.write(markdown)
        return 0
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(markdown, encoding="utf-8")
    print(f"wrote {target}", file=out)
    return 0


class ProgressBar:
    """A one-line text bar on stderr, redrawn at most once per percent."""

    WIDTH = 30

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._shown = -1

    def __call__(self, done: int, total: int) -> None:
        percent = 100 * done // max(total, 1)
        if percent == self._shown:
            return
        self._shown = percent
        filled = self.WIDTH * percent // 100
        self._stream.write(f"\r[{'#' * filled}{'.' * (self.WIDTH - filled)}] {percent:3d}% {done}/{total}")
        self._stream.flush()

    def close(self) -> None:
        if self._shown >= 0:
            self._stream.write("\n")
            self._stream.flush()


if __name__ == "__main__":
    sys.exit(main())
