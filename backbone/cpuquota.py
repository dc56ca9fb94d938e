"""CPU quotas for benchmark processes: one cgroup (v1 ``cpu`` controller) per process.

A scale-out measurement compares N processes with one, each held to the same share of a core,
so the ratio says what N pods of that size would do rather than how much of the machine's spare
capacity one process could grab. Each process gets a group of its own,
``<root>/<parent>/<name>``, whose ``cpu.cfs_quota_us`` is the share times ``cpu.cfs_period_us``;
the process is moved in by writing its pid to ``cgroup.procs`` (its threads and later children
follow). ``close`` moves whatever is left back to the root group and removes the groups, so a
benchmark leaves nothing behind. Writing there takes root and a writable v1 hierarchy.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
MIN_SHARE = 0.01
"""The smallest share of a core a group may get (the kernel's floor is 1 ms a period)."""


class QuotaUnavailable(RuntimeError):
    """No writable cgroup v1 ``cpu`` controller here (not root, cgroup v2 only, or read-only)."""


def unavailable_reason(root: Path = CPU_ROOT) -> str:
    """Why quotas cannot be set here, or "" when they can."""
    if not (root / "cpu.cfs_period_us").is_file():
        return f"no cgroup v1 cpu controller at {root}"
    if not os.access(root, os.W_OK):
        return f"{root} is not writable (quotas need root)"
    return ""


@dataclass
class CpuGroups:
    """The groups of one benchmark run, under ``root/parent``; use as a context manager."""

    parent: str
    root: Path = CPU_ROOT
    made: list[Path] = field(default_factory=list)

    def __enter__(self) -> CpuGroups:
        reason = unavailable_reason(self.root)
        if reason:
            raise QuotaUnavailable(reason)
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def cap(self, name: str, pid: int, share: float) -> Path:
        """Hold ``pid`` (with its threads) to ``share`` of one core, in a group of its own named ``name``."""
        if share < MIN_SHARE:
            raise ValueError(f"a CPU share below {MIN_SHARE} of a core: {share}")
        top = self.root / self.parent
        top.mkdir(exist_ok=True)
        group = top / name
        group.mkdir()
        self.made.append(group)
        period_us = int((self.root / "cpu.cfs_period_us").read_text())
        (group / "cpu.cfs_quota_us").write_text(str(round(share * period_us)))
        (group / "cgroup.procs").write_text(str(pid))
        return group

    def close(self) -> None:
        """Move any process still in the groups back to the root group, then remove the groups (and the
        parent once no other run uses it)."""
        for group in reversed(self.made):
            with contextlib.suppress(OSError):
                for pid in (group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):  # it may have ended meanwhile
                        (self.root / "cgroup.procs").write_text(pid)
            with contextlib.suppress(OSError):
                group.rmdir()
        self.made.clear()
        with contextlib.suppress(OSError):  # another run's groups are still there: it removes the parent
            (self.root / self.parent).rmdir()
