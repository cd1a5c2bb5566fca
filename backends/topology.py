"""The replica set a data directory belongs to, persisted in it and enforced at start.

Which key groups a replica owns follows from (replica count, replica index) per job. Kept only in
settings, a replica restarted with another count would silently re-slice its jobs (the data on
disk, unreachable), and two processes could share one data directory; so the directory holds:

- ``$lock``: an exclusive ``flock`` held for the life of the process (released by the kernel
  when the process dies, however it dies). A second process on the directory stops at start.
- ``$topology.json`` (RocksDB backend): the replica set's identity, count, this replica's index, a
  version, and per job the key-group range its data holds. Written atomically (a temporary file,
  fsync, rename, fsync of the directory). At start, settings that disagree with it are refused
  unless the operator adopts the new layout explicitly; jobs whose recorded range then disagrees
  are not served until a restore replaces them (or they are deleted).

A live rescale (docs/rescale.md, backends/checkpointing/rescale.py) records its progress here too: ``move``
(the target layout, the phase this replica reached, the checkpoints it loaded from) while it is
pending, then the new layout with ``previous`` (the count and version it replaced), so that a
restart knows where it stands: the durable decision in checkpoint storage says which way a pending
move goes (:func:`start_action`), and an environment still naming the previous layout serves
the recorded one with a warning instead of refusing or re-slicing.

"$" cannot occur in a job name, so neither file can collide with a job's directory.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from statehouse.protocol.keygroups import KeyGroupRange

LOCK_FILE = "$lock"
TOPOLOGY_FILE = "$topology.json"
FORMAT = 1
MovePhase = Literal["copying", "prepared", "loaded"]

log = logging.getLogger(__name__)


class TopologyError(Exception):
    """A data directory that must not be served as configured; ``detail`` is one line saying what to do."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True)
class JobRecord:
    """What one job's data on this replica holds: its max parallelism and key groups [start, end]."""

    max_parallelism: int
    start: int
    end: int

    @classmethod
    def of(cls, max_parallelism: int, count: int, index: int) -> JobRecord:
        owned = owned_range(max_parallelism, count, index)
        return cls(max_parallelism, owned.start, owned.end)


def owned_range(max_parallelism: int, count: int, index: int) -> KeyGroupRange:
    """Replica ``index`` of ``count``'s key groups; none past the count (a replica a rescale
    removed, or one that was not there before it: ``count`` 0)."""
    if index >= count:
        return KeyGroupRange.empty()
    return KeyGroupRange.for_operator(max_parallelism, count, index)


def subtract(a: KeyGroupRange, b: KeyGroupRange) -> list[KeyGroupRange]:
    """The key groups of ``a`` not in ``b``: at most two contiguous ranges, empty ones left out."""
    if not len(b) or not len(a.intersection(b)):
        return [a] if len(a) else []
    pieces = [KeyGroupRange(a.start, b.start - 1), KeyGroupRange(b.end + 1, a.end)]
    return [r for r in pieces if len(r)]


@dataclass(frozen=True)
class Move:
    """A live rescale to ``replica_count`` replicas at topology ``version``, as far as this replica
    got: ``copying`` (a pre-copy: nothing frozen, what changes in the moving-out key groups noted
    while their bulk is copied), ``prepared`` (its moving-out key groups frozen; a ``joining``
    replica: recorded, serving nothing) or ``loaded`` (its moving-in key groups loaded from
    ``checkpoints``, not served until the commit). ``from_count`` is the replica count before the
    move (0 on a joining replica: it held nothing); ``started`` (Unix seconds) when this replica
    prepared; ``initiator`` who started it (``operator``, or a query's coordinator), so a
    coordinator only ever aborts its own moves."""

    version: int
    replica_count: int
    from_count: int
    replica_urls: tuple[str, ...] = ()
    phase: MovePhase = "prepared"
    joining: bool = False
    checkpoints: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    initiator: str = "operator"

    def moving_out(self, max_parallelism: int, index: int) -> list[KeyGroupRange]:
        """What replica ``index`` holds now and gives away: O_i minus W_i."""
        return subtract(
            owned_range(max_parallelism, self.from_count, index),
            owned_range(max_parallelism, self.replica_count, index),
        )

    def moving_in(self, max_parallelism: int, index: int) -> list[KeyGroupRange]:
        """What replica ``index`` gains: W_i minus O_i (loaded from the checkpoint)."""
        return subtract(
            owned_range(max_parallelism, self.replica_count, index),
            owned_range(max_parallelism, self.from_count, index),
        )

    def same_target(self, version: int, replica_count: int) -> bool:
        return (self.version, self.replica_count) == (version, replica_count)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "replica_count": self.replica_count,
            "from_count": self.from_count,
            "replica_urls": list(self.replica_urls),
            "phase": self.phase,
            "joining": self.joining,
            "checkpoints": dict(sorted(self.checkpoints.items())),
            "started": self.started,
            "initiator": self.initiator,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Move:
        phase = data["phase"]
        if phase not in get_args(MovePhase):
            raise ValueError(f"unknown move phase {phase!r}")
        return cls(
            int(data["version"]),
            int(data["replica_count"]),
            int(data["from_count"]),
            tuple(str(u) for u in data["replica_urls"]),
            phase,
            bool(data["joining"]),
            {str(k): int(v) for k, v in data["checkpoints"].items()},
            float(data["started"]),
            str(data.get("initiator", "operator")),  # absent in records of older versions
        )


@dataclass(frozen=True)
class Previous:
    """The layout a committed live rescale replaced: its replica count and topology version (on a
    replica the move added: the ones it was started with). ``dropped``: the key groups the move
    took away from this replica are gone from its storage (else the next start drops them)."""

    count: int
    version: int
    dropped: bool = False


@dataclass(frozen=True)
class Topology:
    """One replica's place in its replica set, and the key-group range each job's data holds."""

    set_id: str
    count: int
    index: int
    version: int
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    move: Move | None = None
    previous: Previous | None = None
    # Every replica's URL in index order, once a live rescale set them (else the settings').
    replica_urls: tuple[str, ...] = ()
    # A replica a live rescale was to add, whose move was aborted: it holds nothing and is in no
    # serving layout (not ready, skipped by clients) until a later move it joins commits.
    unassigned: bool = False

    @property
    def retired(self) -> bool:
        """A live rescale removed this replica: it owns no key group."""
        return self.index >= self.count

    def expected(self, max_parallelism: int) -> JobRecord:
        """The record of a job of that max parallelism whose data matches this topology."""
        return JobRecord.of(max_parallelism, self.count, self.index)

    def mismatched(self, job: str) -> JobRecord | None:
        """The job's record if its data holds other key groups than this topology gives it."""
        record = self.jobs.get(job)
        if record is None or record == self.expected(record.max_parallelism):
            return None
        return record

    def to_json(self) -> dict[str, Any]:
        """The record as ``$topology.json`` stores it (:meth:`from_json` reads it back)."""
        return {
            "format": FORMAT,
            "set_id": self.set_id,
            "replica_count": self.count,
            "replica_index": self.index,
            "version": self.version,
            "jobs": {
                name: {"max_parallelism": r.max_parallelism, "key_group_range": [r.start, r.end]}
                for name, r in sorted(self.jobs.items())
            },
            "move": self.move.to_json() if self.move is not None else None,
            "previous": vars(self.previous) if self.previous else None,
            "replica_urls": list(self.replica_urls),
            "unassigned": self.unassigned,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Topology:
        if data.get("format") != FORMAT:
            raise ValueError(f"unknown format {data.get('format')!r}")
        jobs = {
            str(name): JobRecord(int(r["max_parallelism"]), int(r["key_group_range"][0]), int(r["key_group_range"][1]))
            for name, r in data["jobs"].items()
        }
        count, index, version = int(data["replica_count"]), int(data["replica_index"]), int(data["version"])
        # Written before live rescales: no move, no previous layout, no URLs.
        move = Move.from_json(data["move"]) if data.get("move") else None
        was = data.get("previous")
        previous = Previous(int(was["count"]), int(was["version"]), bool(was.get("dropped", False))) if was else None
        urls = tuple(str(u) for u in data.get("replica_urls", ()))
        unassigned = bool(data.get("unassigned", False))
        return cls(str(data["set_id"]), count, index, version, jobs, move, previous, urls, unassigned)


class DataDirLock:
    """An exclusive lock on a data directory for the life of the process."""

    def __init__(self, data_dir: str) -> None:
        os.makedirs(data_dir, exist_ok=True)
        path = os.path.join(data_dir, LOCK_FILE)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(self._fd)
            raise TopologyError(
                f"is in use by another statehouse process (pid {holder}); each replica needs its own data directory"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = -1


class ReplicaLayout:
    """The persisted topology of one data directory (``persist=False``: kept in memory only, for
    the heap backend, whose jobs do not outlive the process).

    ``open`` checks it against the settings; :meth:`record` and :meth:`forget` keep each job's
    range in step with what its data holds.
    """

    def __init__(self, data_dir: str, topology: Topology, persist: bool) -> None:
        self.data_dir = data_dir
        self.topology = topology
        self.persist = persist
        self._lock = threading.Lock()

    @classmethod
    def open(
        cls,
        data_dir: str,
        *,
        count: int,
        index: int,
        set_id: str | None,
        adopt: bool,
        persist: bool = True,
        default_set_id: str | None = None,
        version: int | None = None,
    ) -> ReplicaLayout:
        """The directory's topology, written from the settings if it has none.

        Raises :class:`TopologyError` when the settings disagree with it and ``adopt`` is false,
        or when ``set_id`` names another replica set (adopting never changes the set).
        ``default_set_id`` is the identity recorded at the first start when ``set_id`` is None; it
        is not checked later. ``version`` (STATEHOUSE_TOPOLOGY_VERSION) is the version a rescale
        brings the whole set to: recorded at a first start (else 1) and by an adoption (else the
        recorded one + 1), so that new, empty replicas and adopting ones report one version; a
        directory recorded at an older version is one of an earlier layout and is adopted only
        explicitly.
        """
        path = os.path.join(data_dir, TOPOLOGY_FILE)
        stored = _read(path) if persist else None
        if stored is None:
            first = set_id or default_set_id or str(uuid.uuid4())
            layout = cls(data_dir, Topology(first, count, index, version or 1), persist)
            layout._write()
            return layout
        if set_id is not None and set_id != stored.set_id:
            raise TopologyError(
                f"holds replica {stored.index} of {stored.count} of replica set {stored.set_id!r}, not of "
                f"STATEHOUSE_REPLICA_SET_ID={set_id!r}: use that replica set's data directory, or unset "
                f"STATEHOUSE_REPLICA_SET_ID"
            )
        layout = cls(data_dir, stored, persist)
        recorded = _served_as_recorded(stored, count, index, version)
        if recorded is not None:
            log.warning("%s", recorded)
            return layout
        if version is not None and version < stored.version:
            raise TopologyError(
                f"holds topology version {stored.version}, newer than STATEHOUSE_TOPOLOGY_VERSION={version}: unset it, "
                f"or set it to the replica set's version (statehouse status shows it)"
            )
        behind = version is not None and version > stored.version
        if (stored.count, stored.index) == (count, index) and not behind:
            return layout
        if not adopt and (stored.count, stored.index) == (count, index):
            raise TopologyError(
                f"holds replica {stored.index} of {stored.count} at topology version {stored.version}, older than "
                f"STATEHOUSE_TOPOLOGY_VERSION={version}: a replica of an earlier layout (its data is stale); give "
                f"it an empty data directory, or add STATEHOUSE_ADOPT_TOPOLOGY=1 and restore every job from a savepoint"
            )
        if not adopt:
            raise TopologyError(
                f"holds replica {stored.index} of {stored.count} (topology version {stored.version}), but "
                f"STATEHOUSE_REPLICA_INDEX={index} and STATEHOUSE_REPLICA_COUNT={count}: start it with "
                f"STATEHOUSE_REPLICA_INDEX={stored.index} STATEHOUSE_REPLICA_COUNT={stored.count}, or, to rescale, "
                f"add STATEHOUSE_ADOPT_TOPOLOGY=1 and restore every job from a savepoint (docs/operations.md, "
                f"Rescaling)"
            )
        if version == stored.version:
            raise TopologyError(
                f"holds replica {stored.index} of {stored.count} at topology version {stored.version}: adopting another"
                f" layout needs a higher version than STATEHOUSE_TOPOLOGY_VERSION={version} (or unset it)"
            )
        layout.topology = replace(stored, count=count, index=index, version=version or stored.version + 1)
        layout._write()
        return layout

    # -- a live rescale's progress ------------------------------------------------------------

    def begin_move(self, move: Move) -> None:
        """Record a prepared move (durably, before the prepare answers); an unassigned replica
        joining it is part of the move from now on."""
        self._set(move=move, unassigned=False)

    def update_move(self, **changes: Any) -> Move:
        """The pending move with ``changes`` (e.g. ``phase="loaded"``), recorded."""
        with self._lock:
            move = self.topology.move
            assert move is not None, "no move is pending"
            move = replace(move, **changes)
            self.topology = replace(self.topology, move=move)
            self._write()
            return move

    def commit_move(self) -> None:
        """The pending move's layout is this replica's from now on: count, version, URLs, each
        job's range, and the layout it replaced (``previous``)."""
        with self._lock:
            topology = self.topology
            move = topology.move
            assert move is not None, "no move is pending"
            # A joining replica held nothing: nothing of it is left to drop.
            previous = Previous(topology.count, topology.version, dropped=move.joining)
            moved = replace(
                topology,
                count=move.replica_count,
                version=move.version,
                move=None,
                previous=previous,
                replica_urls=move.replica_urls or topology.replica_urls,
            )
            jobs = {name: moved.expected(r.max_parallelism) for name, r in moved.jobs.items()}
            self.topology = replace(moved, jobs=jobs)
            self._write()

    def set_previous(self, previous: Previous) -> None:
        self._set(previous=previous)

    def clear_move(self, *, unassigned: bool = False) -> None:
        """Forget the pending move (aborted); ``unassigned``: this replica was joining it."""
        self._set(move=None, unassigned=unassigned)

    def _set(self, **changes: Any) -> None:
        with self._lock:
            self.topology = replace(self.topology, **changes)
            self._write()

    def record(self, job: str, max_parallelism: int) -> None:
        """The job's data now holds what this topology gives it (created, restored, or found unrecorded)."""
        with self._lock:
            record = self.topology.expected(max_parallelism)
            if self.topology.jobs.get(job) == record:
                return
            self.topology = replace(self.topology, jobs={**self.topology.jobs, job: record})
            self._write()

    def forget(self, job: str) -> None:
        with self._lock:
            if job in self.topology.jobs:
                self.topology = replace(self.topology, jobs={k: v for k, v in self.topology.jobs.items() if k != job})
                self._write()

    def keep_only(self, jobs: list[str]) -> None:
        """Drop the records of jobs that are no longer on disk (deleted while the record was not
        rewritten, or a heap backend's jobs of a previous process)."""
        with self._lock:
            kept = {k: v for k, v in self.topology.jobs.items() if k in set(jobs)}
            if kept != self.topology.jobs:
                self.topology = replace(self.topology, jobs=kept)
                self._write()

    def _write(self) -> None:
        if not self.persist:
            return
        path = os.path.join(self.data_dir, TOPOLOGY_FILE)
        temporary = path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(self.topology.to_json(), f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
        directory = os.open(self.data_dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def _served_as_recorded(stored: Topology, count: int, index: int, version: int | None) -> str | None:
    """Why a data directory is served as recorded although the settings name another layout, or
    None. A live rescale changes the recorded layout while the environment (a StatefulSet's
    replica count, a container's variables) still names the one before it until someone updates
    it: a restart then (Kubernetes OnDelete, a container restart) serves what the record says,
    never re-slicing; one warning line names the settings to set."""
    if index != stored.index or ((stored.count, version) in ((count, None), (count, stored.version))):
        return None
    settings = f"STATEHOUSE_REPLICA_COUNT={count}" + (f" STATEHOUSE_TOPOLOGY_VERSION={version}" if version else "")
    previous, move = stored.previous, stored.move
    if previous is not None and count == previous.count and version in (None, previous.version):
        if stored.retired:
            return (
                f"{settings} name the layout before a live rescale, which removed this replica (index {index} of "
                f"{stored.count}, topology version {stored.version}): it owns nothing; stop it"
            )
        return (
            f"{settings} name the layout before a live rescale; serving the recorded one, replica {index} of "
            f"{stored.count} at topology version {stored.version}: set STATEHOUSE_REPLICA_COUNT={stored.count} "
            f"STATEHOUSE_TOPOLOGY_VERSION={stored.version}"
        )
    if move is not None and count == move.replica_count and version in (None, move.version):
        return (
            f"{settings} name the layout of a live rescale still pending here (recorded: replica {index} of "
            f"{stored.count} at topology version {stored.version}, moving to {move.replica_count} replicas at version "
            f"{move.version}); serving the recorded layout until the move commits or aborts (statehouse rescale "
            "--resume or --abort)"
        )
    return None


StartAction = Literal["serve", "commit", "abort", "wait", "copying"]


def start_action(topology: Topology, outcome: str | None) -> tuple[StartAction, str]:
    """What a replica starting with ``topology`` does about a pending move, given the durable
    decision's ``outcome`` for it ("commit", "abort", None: undecided or unreadable), and one line
    saying why. After a commit the move only goes forward (a replica that had loaded commits; one
    that had not waits, frozen or joining, for the coordinator's load and commit); after an abort
    only back; undecided, the replica stays frozen (safe) until the coordinator decides."""
    move = topology.move
    if move is None:
        return "serve", ""
    target = f"the live rescale to {move.replica_count} replicas (topology version {move.version})"
    if outcome == "abort":
        return "abort", f"{target} was aborted: undoing it here"
    if move.phase == "copying":  # never decided commit: the freeze and the load come first
        return "copying", (
            f"{target} was copying its key groups, nothing frozen: serving as before (changes are no longer "
            "noted, so the move loads this replica's key groups whole) until the coordinator goes on or aborts it "
            "(statehouse rescale --resume or --abort)"
        )
    if outcome == "commit":
        if move.phase == "loaded" or topology.index >= move.replica_count:
            return "commit", f"{target} was decided commit: committing it here"
        return "wait", (
            f"{target} was decided commit, but this replica had not loaded its key groups: waiting, frozen, for the "
            "coordinator's load and commit (statehouse rescale --resume)"
        )
    return "wait", (
        f"{target} is undecided (or its decision cannot be read): this replica stays frozen until the coordinator "
        "finishes or aborts it (statehouse rescale --resume or --abort)"
    )


def _read(path: str) -> Topology | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TopologyError(f"{TOPOLOGY_FILE} cannot be read ({exc}): restore it from a backup of the volume") from None
    try:
        return Topology.from_json(data)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise TopologyError(
            f"{TOPOLOGY_FILE} is not a topology ({exc!r}): restore it from a backup of the volume"
        ) from None
