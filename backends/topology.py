"""The replica set a data directory belongs to, persisted in it and enforced at start.

Which key groups a replica owns follows from (replica count, replica index) per job. Those used to
be two environment variables stored nowhere: a replica restarted with another count silently
re-sliced its jobs (the data stayed on disk, unreachable), and two processes could share one data
directory. Now the directory holds:

- ``$lock``: an exclusive ``flock`` held for the life of the process (released by the kernel
  when the process dies, however it dies). A second process on the directory stops at start.
- ``$topology.json`` (RocksDB backend): the replica set's identity, count, this replica's index, a
  version, and per job the key-group range its data holds. Written atomically (a temporary file,
  fsync, rename, fsync of the directory). At start, settings that disagree with it are refused
  unless the operator adopts the new layout explicitly; jobs whose recorded range then disagrees
  are not served until a restore replaces them (or they are deleted).

"$" cannot occur in a job name, so neither file can collide with a job's directory.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from statehouse.keygroups import KeyGroupRange

LOCK_FILE = "$lock"
TOPOLOGY_FILE = "$topology.json"
FORMAT = 1


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
        owned = KeyGroupRange.for_operator(max_parallelism, count, index)
        return cls(max_parallelism, owned.start, owned.end)


@dataclass(frozen=True)
class Topology:
    """One replica's place in its replica set, and the key-group range each job's data holds."""

    set_id: str
    count: int
    index: int
    version: int
    jobs: dict[str, JobRecord] = field(default_factory=dict)

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
        return cls(str(data["set_id"]), count, index, version, jobs)


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
