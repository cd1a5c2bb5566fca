"""The data source's options, read once on the driver (and pickled to executors with the reader or
writer), and the one error type every refusal surfaces as."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from statehouse.client.config import ClientConfig
from statehouse.client.errors import StatehouseError

WRITE_OPS = ("put", "add", "map_put", "clear")
TIME_DOMAINS = ("event", "processing")


class SourceError(Exception):
    """What Spark shows when the data source refuses: one line, saying what to fix."""


@dataclass(frozen=True)
class SourceOptions:
    config: ClientConfig
    job: str
    state: str
    op: str | None  # writes only
    partitions_per_replica: int  # reads: input partitions per replica (its key groups, split evenly)
    timers: str | None = None  # reads: a time domain's timers instead of a state
    what: str | None = None  # reads: "states", the job's states and their sizes per key group
    operator: str | None = None  # reads: an operator's list and broadcast states (``state`` picks one)

    @classmethod
    def parse(cls, options: Mapping[str, str], *, writing: bool = False) -> SourceOptions:
        given = {k.lower(): v for k, v in options.items()}
        timers = given.get("timers")
        if timers is not None and (writing or timers not in TIME_DOMAINS):
            raise SourceError(
                f"option('timers', ...) reads a time domain's timers, one of {', '.join(TIME_DOMAINS)}; got {timers!r}"
                + (" (timers are read, not written)" if writing else "")
            )
        what = given.get("what")
        if what is not None and (writing or what != "states"):
            raise SourceError(f"option('what', ...) names a view to read: 'states'; got {what!r}")
        operator = given.get("operator")
        if operator is not None and (writing or not operator or timers is not None or what is not None):
            raise SourceError(
                "option('operator', name) reads an operator's state (with option('state', ...) one of its states); "
                "it is read, not written, and goes without option('timers') or option('what')"
            )
        keyed = timers is None and what is None and operator is None
        needed = ("urls", "job", "state") if keyed else ("urls", "job")
        missing = [name for name in needed if not given.get(name)]
        if missing:
            raise SourceError(
                f"format('statehouse') needs .option({missing[0]!r}, ...): urls (the replicas' URLs, comma-separated), "
                "job, and state (or timers, or operator)"
            )
        if "checkpoint" in given:  # reads take it before these options (datasource/checkpoint.py)
            raise SourceError("option('checkpoint') reads a checkpoint; a write goes to the live replicas")
        op = given.get("op")
        if writing and op not in WRITE_OPS:
            raise SourceError(f"writing needs .option('op', ...), one of {', '.join(WRITE_OPS)}; got {op!r}")
        try:
            splits = int(given.get("partitions_per_replica", "1"))
            config = ClientConfig.of(
                given["urls"], token=given.get("token") or None, timeout=float(given.get("timeout", "60"))
            )
        except ValueError as exc:
            raise SourceError(f"bad option: {exc}") from None
        if splits < 1:
            raise SourceError(f"partitions_per_replica must be at least 1; got {splits}")
        return cls(config, given["job"], given.get("state", ""), op, splits, timers, what, operator)


def refusal(exc: StatehouseError, doing: str) -> SourceError:
    """A Statehouse problem as the data source's error: its detail, and what was being done."""
    return SourceError(f"statehouse: {doing}: {exc}")
