"""A server process's memory as Linux reports it (/proc/<pid>/status): what a request cost it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

MB = 1 << 20


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in bytes."""
    found = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(value.split()[0]) * 1024
    return found


def cpu_ticks(pid: int) -> int:
    """User and system CPU time the process has used, in clock ticks (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)


def settle(pid: int, quiet: float = 0.04, longest: float = 0.2) -> None:
    """Until the process has used no CPU for ``quiet`` seconds (what it still does after its
    answer, freeing included, is done), ``longest`` at most."""
    deadline = time.monotonic() + longest
    ticks = cpu_ticks(pid)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = cpu_ticks(pid)
        if now == ticks:
            return
        ticks = now


@contextmanager
def peak_growth(pid: int) -> Iterator[dict[str, int]]:
    """Yields a dict that holds, after the block, how far the process's peak RSS rose above its
    RSS at the start (``peak``) and how much more it holds at the end (``kept``)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as clear:
            clear.write("5")  # peak RSS := current RSS
    except OSError:
        pytest.skip("cannot reset the server's peak RSS (/proc/<pid>/clear_refs)")
    before = memory(pid)["VmRSS"]
    result: dict[str, int] = {}
    yield result
    settle(pid)
    after = memory(pid)
    result.update(peak=after["VmHWM"] - before, kept=after["VmRSS"] - before)
