"""Configuration from ``STATEHOUSE_*`` environment variables (names are part of the contract)."""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, Literal, NoReturn, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import Field, PrivateAttr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from statehouse.app.access_log import AccessLog
from statehouse.app.tokens import Grant, TokenError, parse_tokens
from statehouse.backends.heap.snapshot import DELTA_WEIGHT
from statehouse.backends.rocksdb import row_cache
from statehouse.backends.rocksdb.database import Compression, TableFiles
from statehouse.protocol.routes import LISTING_PAGE
from statehouse.snapshots.errors import InvalidLocation
from statehouse.snapshots.storage.locations import parse_restore_locations
from statehouse.snapshots.storage.timeouts import S3Timeouts


class Settings(BaseSettings):
    """The server's configuration, read from ``STATEHOUSE_*`` environment variables (each field's
    name, upper-cased, after the prefix): backend and directories, the replica set, checkpoint
    storage, tokens, limits and the HTTP server's. :func:`load_settings` reads it at start."""

    model_config = SettingsConfigDict(env_prefix="STATEHOUSE_", extra="ignore")

    backend: Literal["rocksdb", "heap"] = Field(default="rocksdb", description="state backend")
    data_dir: str = Field(default="./data", description="local working directory (RocksDB files)")
    replica_index: int = Field(default=0, ge=0, description="this replica's index (StatefulSet ordinal)")
    replica_count: int = Field(default=1, ge=1, description="number of replicas")
    adopt_topology: bool = Field(
        default=False,
        description="start even if the data directory was written under another replica count or index: the "
        "replica serves as STATEHOUSE_REPLICA_INDEX of STATEHOUSE_REPLICA_COUNT (topology version + 1) and refuses "
        "its jobs written under the old layout (409 layout_mismatch) until each is restored or deleted",
    )
    topology_version: int | None = Field(
        default=None,
        ge=1,
        description="the topology version a rescale brings the replica set to (the set's version + 1, which "
        "statehouse rescale prints): recorded by a new, empty replica and by an adopting one, so that every replica "
        "reports one version; a data directory recorded at an older version is refused unless adopted "
        "(unset: 1 at a first start, the recorded version + 1 at an adoption)",
    )
    replica_set_id: str | None = Field(
        default=None,
        description="the replica set's identity, recorded in each replica's data directory at its first start "
        "(unset: a UUID named after STATEHOUSE_CHECKPOINT_DIR, which a set's replicas share); when set, a data "
        "directory of another set is refused at start",
    )
    replica_urls: str = Field(
        default="",
        description="how clients reach this replica set's replicas, shown in GET /v1/topology so that a client "
        "given one seed URL learns the rest: one URL template with {index} (the chart's headless-Service names), "
        "or every replica's URL, comma-separated in index order; empty: clients list every replica themselves",
    )
    checkpoint_dir: str = Field(
        default="./checkpoints", description="checkpoint storage: a path, file://..., s3://bucket/prefix or memory://"
    )
    s3_endpoint_url: str | None = Field(default=None, description="S3 endpoint for S3-compatible servers")
    s3_abandoned_upload_age_s: int = Field(
        default=3600,
        ge=0,
        description="seconds after which an in-progress S3 multipart upload under the checkpoint prefix counts as "
        "abandoned: the sweep at start aborts it (younger ones may be another replica's live upload)",
    )
    s3_connect_timeout_s: float = Field(
        default=5.0, gt=0, le=300, description="seconds an S3 call may take to connect before botocore retries it"
    )
    s3_read_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="seconds an S3 call may wait for an answer before botocore retries it (also the longest a "
        "graceful shutdown waits for an upload on a silent link)",
    )
    s3_max_attempts: int = Field(
        default=4,
        ge=1,
        le=20,
        description="attempts per S3 call, the first one included (botocore's standard retry mode), before it fails",
    )
    checkpoint_transfer_threads: int = Field(
        default=4,
        ge=1,
        le=16,
        description="files one checkpoint uploads, or one restore or rescale load downloads, at once "
        "(Flink's state.backend.rocksdb.checkpoint.transfer.thread.num)",
    )
    num_retained: int = Field(default=3, ge=1, description="completed checkpoints kept")
    api_tokens: str = Field(
        default="",
        description="comma-separated bearer tokens, each TOKEN (every job) or TOKEN:SCOPE+SCOPE (job names, *, "
        "@admin); empty (and no tokens file) = auth off",
    )
    api_tokens_file: str | None = Field(
        default=None,
        description="a file of tokens in the STATEHOUSE_API_TOKENS syntax, one or more per line; # comments",
    )
    restore_locations: str = Field(
        default="",
        description="comma-separated prefixes (paths, s3://bucket/prefix) a restore may read besides the checkpoint "
        "storage: @admin tokens only when auth is on",
    )
    snapshot_compression: Literal["zstd", "none"] = Field(
        default="zstd", description="per-key-group compression of full snapshots"
    )
    incremental_checkpoints: bool = Field(
        default=True,
        description="RocksDB checkpoints upload only new SST files; heap checkpoints write only the keys changed since "
        "the last one, over a full base they share",
    )
    heap_changelog_delta_weight: float = Field(
        default=DELTA_WEIGHT,
        gt=0,
        le=16,
        description="heap backend: the most a changelog's deltas may weigh, as a multiple of their bases; a checkpoint "
        "that would pass it rewrites the heaviest slices of key groups whole. A restore reads at most 1 + this times "
        "the state's bytes; a larger weight rewrites less often",
    )
    heap_background_bases: bool = Field(
        default=False,
        description="heap backend: once a checkpoint's deltas weigh half of their bound, a forked child writes "
        "a new base from the fork's memory while the replica goes on, instead of checkpoints rewriting slices of it "
        "inline later; needs room for a second copy of the replica's memory while it "
        "writes, and is skipped where the memory limit leaves none",
    )
    batch_lease_s: float = Field(
        default=60.0,
        ge=0,
        le=86400,
        description="a live rescale prepares at a micro-batch boundary: a micro-batch a coordinator began (its fence) "
        "holds the prepare off until it is committed or aborted, or shows no sign of life (a staged write, its "
        "prepare) for this many seconds (its driver died)",
    )
    rescale_reclaim_delay_s: float = Field(
        default=60.0,
        ge=0,
        le=86400,
        description="after a live rescale's commit, a replica compacts away the key groups it gave away (their disk "
        "space, and the table files its checkpoints would upload with them) this many seconds later, not beside the "
        "first micro-batches on the new layout; the next rescale and the shutdown do it at once",
    )
    rescale_compact_moving: bool = Field(
        default=False,
        description="before a live rescale's incremental checkpoint, RocksDB compacts the key groups that move into "
        "4 MiB files, so each load downloads about its share rather than files spanning every key group (costs the "
        "old replicas that compaction and the upload of what it rewrote)",
    )

    max_key_bytes: int = Field(default=4096, ge=1, description="largest key, namespace or map user key, in bytes")
    max_value_bytes: int = Field(default=1 << 20, ge=1, description="largest encoded value, in bytes")
    max_batch_ops: int = Field(default=10_000, ge=1, description="most operations in one batch request")
    max_staged_bytes: int = Field(
        default=256 << 20,
        ge=1,
        description="memory task attempts hold under one epoch, per job: their writes (request bytes plus 512 per "
        "write), the timers their advances fired and the answers kept for re-sent requests",
    )
    max_staged_attempts: int = Field(default=10_000, ge=1, description="task attempts staged under one epoch, per job")
    max_body_bytes: int = Field(default=64 << 20, ge=1, description="largest request body, in bytes")
    max_page_size: int = Field(default=LISTING_PAGE, ge=1, description="largest page of a listing")
    max_jobs: int = Field(
        default=1000, ge=1, description="most jobs on one replica (creates and restores past it are refused)"
    )
    max_states_per_job: int = Field(
        default=100, ge=1, description="most keyed states one job registers (operator states do not count)"
    )
    max_open_jobs: int = Field(
        default=128,
        ge=1,
        description="RocksDB instances (one per job) kept open; the least recently used idle one closes",
    )
    rocksdb_block_cache_bytes: int = Field(
        default=256 << 20,
        ge=0,
        description="RocksDB backend: one cache of table blocks (data, index, Bloom filters) shared by every job on "
        "the replica, in bytes (Flink's shared cache per slot); 0 leaves RocksDB's own 8 MiB per job",
    )
    rocksdb_row_cache_bytes: int = Field(
        default=row_cache.DEFAULT_MAX_BYTES,
        ge=0,
        description="RocksDB backend: one cache of the rows that point reads and writes of value, reducing, "
        "aggregating and list states found, in front of RocksDB, shared by every job on the replica, in bytes "
        "(Kafka Streams' statestore.cache.max.bytes, for reads); 0 reads every row from RocksDB",
    )
    rocksdb_target_file_bytes: int = Field(
        default=TableFiles.target_file_bytes,
        ge=1 << 20,
        le=1 << 30,
        description="RocksDB backend: the size of the table files compactions write (target_file_size_base; Flink's "
        "compaction.level.target-file-size-base)",
    )
    rocksdb_level_base_bytes: int = Field(
        default=TableFiles.level_base_bytes,
        ge=1 << 20,
        le=16 << 30,
        description="RocksDB backend: the size of the level that level 0 compacts into (max_bytes_for_level_base; "
        "Flink's compaction.level.max-size-level-base), levels sized from the last one up; a compaction rewrites the "
        "files of that level that overlap what it merges, and the next incremental checkpoint uploads them",
    )
    rocksdb_compression: Compression = Field(
        default=TableFiles.compression,
        description="RocksDB backend: how table files' blocks are compressed (Flink's compression.per.level, one "
        "algorithm for every level): zstd makes the data and the checkpoints smaller for more CPU per read and "
        "write; applies to the files written from then on",
    )
    max_map_read_entries: int = Field(
        default=100_000, ge=1, description="most entries a whole-map read returns; larger maps are read page by page"
    )
    max_list_bytes: int = Field(default=16 << 20, ge=1, description="largest stored list state of one key, in bytes")
    max_raw_stream_bytes: int = Field(
        default=16 << 20,
        ge=1,
        description="largest raw keyed stream of one key group, and largest raw operator state of one subtask "
        "(its partitions together), in bytes",
    )
    disk_reserve_bytes: int = Field(
        default=256 << 20,
        ge=0,
        description="free space kept on the data volume (RocksDB): below it writes are refused with 507 "
        "insufficient_storage and /readyz answers 503, so that every job can still be reopened (replaying its "
        "write-ahead log, kept under a quarter of this) and read; writes resume by themselves when space returns",
    )
    max_answer_bytes: int = Field(
        default=64 << 20,
        ge=1,
        description="most stored bytes of values one request reads back (batch, columnar, whole maps, listings, "
        "operator lists); larger answers are refused with 413 answer_too_large. Stored (msgpack) bytes: a JSON "
        "answer is up to 6x larger (docs/operations.md, Limits)",
    )
    max_header_bytes: int = Field(
        default=64 << 10,
        ge=1024,
        description="largest request head (request line and headers), in bytes: past it 431 header_too_large and "
        "the connection is closed",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="seconds a request head may take to arrive, from the connection's opening (or the head's first "
        "byte on a kept-alive connection): past it 408 request_timeout and the connection is closed",
    )
    body_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="seconds a request body may take to arrive after its head: past it the connection is closed",
    )
    max_connections: int = Field(
        default=1024,
        ge=1,
        description="HTTP connections open at once: one more is answered 503 too_many_connections and closed at once",
    )
    keep_alive_timeout_s: float = Field(
        default=5.0, gt=0, description="seconds an idle kept-alive connection stays open"
    )
    access_log: AccessLog = Field(
        default="control",
        description="uvicorn's access log: every request (all), or all but the data plane's successful requests "
        "(control: the batch, columnar and timer-columnar endpoints' 2xx, which /metrics counts)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info",
        description="the server's own log (loggers statehouse.*, on stderr): info shows RocksDB instances opened "
        "and closed, restore swaps and data-volume reserve crossings; debug adds each request a limit refuses",
    )
    problem_docs_url: str = Field(
        default="",
        description="empty: a problem's `type` is its page on this service, /problems/<code>; else where the table "
        "of problem codes (app/problems.md) is published: `type` is <this>#<code>, one anchor per code",
    )

    @model_validator(mode="after")
    def _check_replica(self) -> Settings:
        if self.replica_index >= self.replica_count:
            raise ValueError(
                f"STATEHOUSE_REPLICA_INDEX='{self.replica_index}' must be < STATEHOUSE_REPLICA_COUNT "
                f"({self.replica_count})"
            )
        try:
            self._replica_urls = expand_replica_urls(self.replica_urls, self.replica_count)
        except ValueError as exc:
            raise ValueError(f"STATEHOUSE_REPLICA_URLS={self.replica_urls!r}: {exc}") from None
        return self

    _replica_urls: tuple[str, ...] = PrivateAttr(default=())
    _grants: dict[str, Grant] = PrivateAttr(default_factory=dict)
    _restore_locations: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _parse_tokens(self) -> Settings:
        # Messages name the variable and the entry, never the token: they go to the log.
        file = None
        if self.api_tokens_file is not None:
            variable = f"STATEHOUSE_API_TOKENS_FILE={self.api_tokens_file!r}"
            try:
                with open(self.api_tokens_file, encoding="utf-8") as f:
                    file = (variable, f.read().splitlines())
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"{variable} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            self._grants = parse_tokens(self.api_tokens, file)
        except TokenError as exc:
            raise ValueError(str(exc)) from None
        if file is not None and not self._grants:
            raise ValueError(f"{file[0]} holds no token: auth would be off")
        try:
            self._restore_locations = parse_restore_locations(self.restore_locations)
        except InvalidLocation as exc:
            raise ValueError(f"STATEHOUSE_RESTORE_LOCATIONS={self.restore_locations!r}: {exc.detail}") from None
        return self

    @property
    def grants(self) -> dict[str, Grant]:
        """Token → what it may reach; empty when auth is off."""
        return self._grants

    @property
    def tokens(self) -> frozenset[str]:
        return frozenset(self._grants)

    @property
    def replica_url_list(self) -> tuple[str, ...]:
        """Every replica's URL in index order (STATEHOUSE_REPLICA_URLS expanded); empty when unset."""
        return self._replica_urls

    @property
    def s3_timeouts(self) -> S3Timeouts:
        """The S3 client's timeouts and attempts, as the storage takes them."""
        return S3Timeouts(self.s3_connect_timeout_s, self.s3_read_timeout_s, self.s3_max_attempts)

    @property
    def restore_location_list(self) -> tuple[str, ...]:
        """Where restores may read besides the checkpoint storage (canonical locations)."""
        return self._restore_locations


PREFIX = "STATEHOUSE_"


def expand_replica_urls(value: str, count: int) -> tuple[str, ...]:
    """STATEHOUSE_REPLICA_URLS as ``count`` URLs in index order: a template with ``{index}`` filled
    for each replica, or a list of exactly ``count`` URLs (checked as the client checks them)."""
    if not value.strip():
        return ()
    entries = [entry.strip() for entry in value.split(",") if entry.strip()]
    if len(entries) == 1 and "{index}" in entries[0]:
        entries = [entries[0].replace("{index}", str(i)) for i in range(count)]
    elif any("{index}" in entry for entry in entries):
        raise ValueError("give one URL template with {index}, or a list of URLs without it")
    elif len(entries) != count:
        raise ValueError(f"lists {len(entries)} URLs for STATEHOUSE_REPLICA_COUNT={count} replicas: list each one")
    for url in entries:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
            raise ValueError(f"{url!r} is not http(s)://host[:port]")
    return tuple(url.rstrip("/") for url in entries)


# STATEHOUSE_* variables that are not server settings: read by the Makefile (`make run`), the
# tests and the tools. The server accepts them in its environment and ignores them; any other
# unknown STATEHOUSE_* name is refused at start (docs/operations.md, "Configuration reference").
NOT_SERVER_SETTINGS = frozenset(
    {
        "STATEHOUSE_HOST",  # Makefile: `make run`'s --host
        "STATEHOUSE_PORT",  # Makefile: `make run`'s --port
        "STATEHOUSE_FUZZ_EXAMPLES",  # tests: Hypothesis/schemathesis examples per run
        "STATEHOUSE_FUZZ_SEED",  # tests: their seed
        "STATEHOUSE_SHUTDOWN_JOBS",  # tests/operations/test_shutdown.py: jobs to shut down
        "STATEHOUSE_SKIP_BROWSER",  # tests/operations/test_docs_offline.py: no Chromium
        "STATEHOUSE_TEST_REPLICAS",  # tests/client: replicas the client-only venv talks to
        "STATEHOUSE_FLINK_LIB",  # tests/support/flink_vectors: Flink's jars
        "STATEHOUSE_SPARK_NO_CDS",  # tests/support/spark.py: test Spark JVMs without the class-data archive
        "STATEHOUSE_URLS",  # the statehouse command (client/cli): the replicas it talks to
        "STATEHOUSE_TOKEN",  # the statehouse command: its bearer token
    }
)


def setting_variables() -> list[str]:
    return [f"{PREFIX}{name.upper()}" for name in Settings.model_fields]


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """``STATEHOUSE_BAKEND='heap' is not a setting: did you mean STATEHOUSE_BACKEND?`` per unknown variable.

    A misspelled setting would otherwise be ignored and its default used (a RocksDB server
    where heap was asked for) without a word.
    """
    known = setting_variables()
    problems = []
    for name in sorted(environ):
        upper = name.upper()  # pydantic-settings reads the names case-insensitively
        if not upper.startswith(PREFIX) or upper in known or upper in NOT_SERVER_SETTINGS:
            continue
        close = difflib.get_close_matches(upper, known, n=1, cutoff=0.75)
        hint = f"did you mean {close[0]}?" if close else "see docs/operations.md for the settings"
        problems.append(f"{name}={environ[name]!r} is not a setting: {hint}")
    return problems


def load_settings() -> Settings:
    """The settings from the environment; on a bad one, one line per problem on stderr and exit 2.

    A pydantic traceback names the field (``backend``), not the variable the operator set
    (``STATEHOUSE_BACKEND``), and buries it in fifty lines.
    """
    problems = unknown_variables(os.environ)
    try:
        settings = Settings()
    except ValidationError as exc:
        exit_at_start(problems + describe_errors(exc))
    if problems:
        exit_at_start(problems)
    return settings


def _raise_exit(status: int) -> NoReturn:
    raise SystemExit(status)


def exit_at_start(problems: list[str], exit: Callable[[int], NoReturn] = _raise_exit) -> NoReturn:
    """One line per problem on stderr, then exit status 2: what every failed start looks like."""
    for problem in problems:
        print(f"statehouse: {problem}", file=sys.stderr, flush=True)
    exit(2)


def describe_errors(exc: ValidationError) -> list[str]:
    """``STATEHOUSE_<FIELD>='given' <what is allowed>`` for each error of a Settings validation."""
    return [_describe(error) for error in exc.errors(include_url=False)]


def _describe(error: Any) -> str:
    loc, kind, ctx = error["loc"], error["type"], error.get("ctx") or {}
    if not loc:  # a model validator's message (it names the variables itself)
        return str(ctx.get("error") or error["msg"])
    field = str(loc[0])
    variable = f"{Settings.model_config.get('env_prefix', '')}{field}".upper()
    given = f"{variable}={error['input']!r}"
    if kind == "literal_error":
        annotation = Settings.model_fields[field].annotation
        choices = get_args(annotation) if get_origin(annotation) is Literal else ()
        allowed = ", ".join(map(str, choices)) if choices else ctx.get("expected", "")
        return f"{given} is not one of: {allowed}"
    if kind == "int_parsing":
        return f"{given} is not an integer"
    if kind == "bool_parsing":
        return f"{given} is not a boolean (true/false, 1/0, yes/no, on/off)"
    bounds = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
    if kind in bounds:
        limit = next(iter(ctx.values()), "?")
        return f"{given} must be {bounds[kind]} {limit}"
    return f"{given}: {error['msg']}"
