"""Value types shared by the variant adapters and the registry.

They live apart from ``registry.py`` so that adapter modules can import them
while ``registry.py`` imports the adapters (no import cycle).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

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
