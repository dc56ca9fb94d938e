"""The audit's side of the archive (``backbone.archive``): check it, then feed its records to the replay.

``niuniu-audit replay --archive DIR`` verifies every segment (hashes, chain, offsets; with
``--archive-head`` also that no newest segment is missing) before anything is replayed: an archive
that does not verify is a finding (exit 1), each problem printed. A verified archive's records of
the journal's topics are replayed first, then Kafka's from the offsets where the archive ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from kafka import TopicPartition

from backbone.archive import Verified, archived_ends, archived_records, verify
from backbone.replay.model import Archived


class ArchiveBroken(Exception):
    """The archive does not verify: the replay is not run on it."""

    def __init__(self, checked: Verified) -> None:
        super().__init__("; ".join(checked.problems))
        self.checked = checked


def open_archive(directory: str, head: str, topics: Sequence[str]) -> tuple[Archived, Verified]:
    """The verified archive at ``directory`` as the replay's input for ``topics``; ``ArchiveBroken`` if not."""
    path = Path(directory)
    if not path.is_dir():
        raise FileNotFoundError(f"no archive at {directory}")
    checked = verify(path, head)
    if not checked.ok:
        raise ArchiveBroken(checked)
    wanted = set(topics)
    starts = {TopicPartition(t, p): end for (t, p), end in archived_ends(checked.headers).items() if t in wanted}
    return Archived(archived_records(path, topics, checked.headers), starts), checked


def print_archive(checked: Verified, out: TextIO) -> None:
    """The archive line of the report, or each of its problems and the failed result."""
    if checked.ok:
        records = sum(h.records for h in checked.headers)
        print(
            f"  archive    {len(checked.headers)} segments verified ({records} records, {checked.size_bytes} bytes),"
            f" head {checked.head}",
            file=out,
        )
        return
    print("ledger audit: archive verification", file=out)
    for problem in checked.problems:
        print(f"  [archive] {problem}", file=out)
    print(f"differences: {len(checked.problems)}", file=out)
    print("RESULT: FAILED", file=out)
