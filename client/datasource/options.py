"""The data source's options, read once on the driver (and pickled to executors with the reader or
writer), and the one error type every refusal surfaces as."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from statehouse.client.config import ClientConfig
from statehouse.client.errors import StatehouseError

WRITE_OPS = ("put", "add", "map_put", "clear")
TIME_DOMAINS = ("event", "processing")

# The options each use takes (Spark hands them over lower-cased); any other is refused, naming these.
READ_OPTIONS = ("urls", "job", "state", "timers", "what", "operator", "partitions_per_replica", "token", "timeout")
WRITE_OPTIONS = ("urls", "job", "state", "op", "token", "timeout")
# A streaming query's own option, which Spark passes to the sink too.
STREAM_WRITE_OPTIONS = (*WRITE_OPTIONS, "checkpointlocation")
CHECKPOINT_OPTIONS = (
    "checkpoint",
    "checkpoint_storage",
    "s3_endpoint_url",
    "job",
    "state",
    "operator",
    "partitions_per_replica",
)


class SourceError(Exception):
    """What Spark shows when the data source refuses: one line, saying what to fix."""


class ReadMode(enum.Enum):
    """What a read reads, decided once from its options (:func:`read_mode`): a keyed state, a time
    domain's timers, the job's states and their sizes, or an operator's state from the live
    replicas; a keyed state or an operator's state from a checkpoint."""

    KEYED = "keyed"
    TIMERS = "timers"
    STATES = "states"
    OPERATOR = "operator"
    CHECKPOINT_KEYED = "checkpoint_keyed"
    CHECKPOINT_OPERATOR = "checkpoint_operator"

    @property
    def from_checkpoint(self) -> bool:
        return self in (ReadMode.CHECKPOINT_KEYED, ReadMode.CHECKPOINT_OPERATOR)


def read_mode(options: Mapping[str, str]) -> ReadMode:
    """The read the options name: ``checkpoint`` reads one (an ``operator``'s state, else a keyed
    state); otherwise the live replicas' ``timers``, else the states (``what``), else an
    ``operator``'s state, else a keyed state. Which options go together is the parsers' to
    refuse (:meth:`SourceOptions.parse`, ``CheckpointOptions.parse``)."""
    given = {k.lower(): v for k, v in options.items()}
    if "checkpoint" in given:
        return ReadMode.CHECKPOINT_OPERATOR if given.get("operator") else ReadMode.CHECKPOINT_KEYED
    if "timers" in given:
        return ReadMode.TIMERS
    if "what" in given:
        return ReadMode.STATES
    if "operator" in given:
        return ReadMode.OPERATOR
    return ReadMode.KEYED


def check_known(options: Mapping[str, str], known: tuple[str, ...], doing: str) -> None:
    """Refuse an option ``doing`` does not take (a misspelt or misplaced one would be ignored)."""
    given = [name.lower() for name in options]
    if "path" in given:  # load(path) / save(path)
        raise SourceError(
            "format('statehouse') takes no path (load(path), save(path)): name the job and state with "
            "option('job', ...) and option('state', ...)"
        )
    unknown = [name for name in given if name not in known]
    if unknown:
        raise SourceError(
            f"{', '.join(repr(name) for name in unknown)}: not an option of {doing}, which takes {', '.join(known)}"
        )


@dataclass(frozen=True)
class SourceOptions:
    """A live read's or a write's options, checked (:meth:`parse`): where the replicas are and
    how to reach them (``config``), which job and state, and what the read or write does."""

    config: ClientConfig
    job: str
    state: str
    op: str | None  # writes only
    partitions_per_replica: int  # reads: input partitions per replica (its key groups, split evenly)
    timers: str | None = None  # reads: a time domain's timers instead of a state
    what: str | None = None  # reads: "states", the job's states and their sizes per key group
    operator: str | None = None  # reads: an operator's list and broadcast states (``state`` picks one)

    @classmethod
    def parse(cls, options: Mapping[str, str], *, writing: bool = False, splits: int = 1) -> SourceOptions:
        """The options of a live read, or of a write (``writing``); one line naming what to fix
        when they are not right. A read refuses options it does not take here; a write's are
        checked by the data source's ``writer`` or ``streamWriter``, which know which write it is.
        ``splits``: the input partitions per replica when ``partitions_per_replica`` is not given."""
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
        splits = partitions_option(given, splits)
        try:
            config = ClientConfig.of(
                given["urls"], token=given.get("token") or None, timeout=float(given.get("timeout", "60"))
            )
        except ValueError as exc:
            raise SourceError(f"bad option: {exc}") from None
        if not writing:
            check_known(given, READ_OPTIONS, "a read of the live replicas")
        return cls(config, given["job"], given.get("state", ""), op, splits, timers, what, operator)


def partitions_option(given: Mapping[str, str], default: int) -> int:
    """``partitions_per_replica``: input partitions per replica (or per part of a checkpoint)."""
    try:
        splits = int(given.get("partitions_per_replica", str(default)))
    except ValueError as exc:
        raise SourceError(f"bad option: {exc}") from None
    if splits < 1:
        raise SourceError(f"partitions_per_replica must be at least 1; got {splits}")
    return splits


def default_partitions(parallelism: int | None, sources: int) -> int:
    """Input partitions per replica (or part) when the read does not say: enough for the
    session's default parallelism (every core reads), one when it is not known."""
    if not parallelism or sources < 1:
        return 1
    return max(1, -(-parallelism // sources))


def refusal(exc: StatehouseError, doing: str) -> SourceError:
    """A Statehouse problem as the data source's error: its detail, and what was being done."""
    return SourceError(f"statehouse: {doing}: {exc}")
