"""What ``niuniu-audit replay`` is asked to do, and the error that ends an audit that could not be completed."""

from __future__ import annotations

from dataclasses import dataclass

from backbone.topics import Topics

DEFAULT_CUT_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class AuditConfig:
    dsn: str
    kafka: str
    topics: Topics
    live_schema: str
    replay_schema: str
    keep_replay: bool = False
    # Where the replay is rebuilt: "" = a database created for it next to the live one.
    scratch_dsn: str = ""
    # How long to wait for Kafka to hold every wallet event up to the wallet's snapshot.
    cut_timeout_s: float = DEFAULT_CUT_TIMEOUT_S
    # Processes replaying the partitions side by side (1: the replay runs in this process).
    workers: int = 1
    # A sealed archive (backbone/archive.py) replayed before Kafka, and the head hash it must end at.
    archive: str = ""
    archive_head: str = ""


class AuditError(Exception):
    """The audit could not be completed (exit 2)."""
