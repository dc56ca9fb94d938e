"""What a variant offers the rules CLI and the report generator: the ``VariantAdapter`` protocol.

An adapter translates between text (card codes, ``key=value`` settings) and the
pure rules and analysis functions; it returns ``CommandResult`` values and never
prints, exits, reads the clock or draws randomness of its own (a seed comes in),
so the CLI stays a thin shell and every command is testable without a subprocess.

Input errors are raised as ``ValueError`` subclasses: ``cards.CardError`` for a
bad card or hand, ``ConfigError`` for a bad setting (its message names the key).
The CLI turns those into a message on stderr and exit code 2. Anything else is a
bug and is allowed to surface as a traceback.

These types live apart from ``registry.py`` so that the adapter modules can import
them while ``registry.py`` imports the adapters (no import cycle).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bull.rules.config import Settings

# Called as progress(done, total) by long computations (Monte Carlo, exact sums);
# the CLI draws a bar on stderr, tests pass None.
ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a command produced: ``data`` is printed for ``--json``, ``text`` otherwise.

    ``data`` must be JSON-serialisable (str, int, float, bool, None, lists, dicts).
    """

    data: Mapping[str, Any]
    text: str


class VariantAdapter(Protocol):
    """The operations every variant offers to the CLI.

    ``settings`` is a flat mapping of dotted config keys to raw values (strings
    from ``--set``, or JSON/TOML values); the adapter validates it with its own
    config dataclass and raises ``ConfigError`` naming the bad key.
    """

    @property
    def variant_id(self) -> str:
        """The id used everywhere (``golden_bull``): CLI, config files, protos, ``bull.variants``."""
        ...

    @property
    def title(self) -> str:
        """A human name for report headings."""
        ...

    def eval(self, cards: Sequence[str], settings: Settings) -> CommandResult:
        """Evaluate one hand. ``data`` has at least ``category``, ``points``, ``multiplier``."""
        ...

    def compare(self, hand_a: Sequence[str], hand_b: Sequence[str], settings: Settings) -> CommandResult:
        """Compare two hands. ``data`` has ``winner`` ("a", "b" or "tie") and ``reason``."""
        ...

    def census(self, settings: Settings) -> CommandResult:
        """Count every possible hand by category: ``data`` = ``{"counts": {...}, "total": N}``.

        The CLI adds ``"seconds"`` (wall time) itself.
        """
        ...

    def rtp(self, settings: Settings, *, rounds: int | None, seed: int, progress: ProgressFn | None) -> CommandResult:
        """Return to player of one area bet.

        ``rounds=None`` asks for the exact figure where the variant can enumerate
        it, otherwise a default-sized Monte Carlo; a number asks for a Monte
        Carlo of that many rounds from ``seed``. ``data`` has ``rtp`` (float),
        ``method`` ("exact" or "monte_carlo") and, for Monte Carlo,
        ``ci95`` = [low, high] and ``rounds``; exact results add ``rtp_fraction``.
        """
        ...

    def report(self) -> str:
        """The markdown math report (deterministic: fixed seeds, no timings)."""
        ...
