"""A pre-copy move's deltas (docs/rescale.md, "Pre-copy"): what an old replica's moving key groups
changed since its tracker started, written at the cut beside the move's decision, and applied by
a new owner over the copy it loaded while writes went on.

A delta is an optimisation, never needed: one missing, unreadable, corrupt, of another tracker
(the old replica restarted, so its tracker started again after the copy) or not covering what
the new owner takes leaves the new owner to load those key groups whole from the cut's
checkpoint, as a move without pre-copy does.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from statehouse.backends.base.partition import WriteOp, load_records
from statehouse.backends.change_tracker import Changed
from statehouse.backends.job import Job
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.storage.base import CheckpointStorage

log = logging.getLogger(__name__)

_FORMAT = 1
_DIGEST = hashlib.sha256().digest_size


def delta_path(set_id: str, version: int, job: str, index: int, round_: int = 0) -> str:
    return f"_topology/{set_id}/rescale-v{version}/delta-{job}-{index}-r{round_}.bin"


@dataclass(frozen=True)
class Delta:
    """What one old replica's tracker ``token`` saw change in ``ranges`` of one job in its
    ``round`` (the keys noted since the previous catch-up round's were taken): each key's whole
    content when read (``Changed``; at the cut, frozen), and the nesting of the tables they are in.
    Applied over a copy brought up to date by every earlier round, in order; ``cut``: the last
    round, written frozen at the cut."""

    token: str
    ranges: list[KeyGroupRange]
    tables: dict[str, bool]
    changed: list[Changed]
    round: int = 0
    cut: bool = True

    def covers(self, wanted: KeyGroupRange) -> bool:
        """Whether every key group of ``wanted`` was tracked."""
        return all(any(kg in r for r in self.ranges) for kg in wanted)

    def to_bytes(self) -> bytes:
        body = msgpack.packb(
            {
                "format": _FORMAT,
                "token": self.token,
                "round": self.round,
                "cut": self.cut,
                "ranges": [[r.start, r.end] for r in self.ranges],
                "tables": self.tables,
                "changed": [[kg, t, p, [list(e) for e in entries]] for kg, t, p, entries in self.changed],
            },
            use_bin_type=True,
        )
        return body + hashlib.sha256(body).digest()

    @classmethod
    def from_bytes(cls, data: bytes) -> Delta:
        body, digest = data[:-_DIGEST], data[-_DIGEST:]
        if len(data) <= _DIGEST or hashlib.sha256(body).digest() != digest:
            raise ValueError("its checksum does not match (a partial or damaged write)")
        doc = msgpack.unpackb(body, raw=False, strict_map_key=False)
        if doc.get("format") != _FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, not {_FORMAT}")
        return cls(
            str(doc["token"]),
            [KeyGroupRange(int(s), int(e)) for s, e in doc["ranges"]],
            {str(t): bool(n) for t, n in doc["tables"].items()},
            [
                (int(kg), str(t), bytes(p), [(bytes(s), bytes(v)) for s, v in entries])
                for kg, t, p, entries in doc["changed"]
            ],
            int(doc["round"]),
            bool(doc["cut"]),
        )


def write_delta(storage: CheckpointStorage, path: str, delta: Delta) -> None:
    with storage.create_output(path) as out:
        out.write(delta.to_bytes())
        out.close_and_get_handle()


def read_delta(storage: CheckpointStorage, path: str) -> Delta | None:
    """The delta at ``path``, or None when there is none or it cannot be used (logged)."""
    try:
        data = storage.read(path)
    except FileNotFoundError:
        return None
    except Exception as exc:  # storage down, a network error: the key groups are loaded whole instead
        log.warning("the pre-copy delta %s cannot be read (%s): its key groups are loaded whole", path, exc)
        return None
    try:
        return Delta.from_bytes(data)
    except (ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
        log.warning("the pre-copy delta %s is not usable (%s): its key groups are loaded whole", path, exc)
        return None


def read_rounds(
    storage: CheckpointStorage, set_id: str, version: int, job: str, index: int, token: str, start: int
) -> tuple[list[Delta], bool]:
    """Old replica ``index``'s deltas of ``job`` from round ``start`` on, in order, as far as they
    are written (under ``token``, each its round) and up to the cut's; whether the cut's ends them."""
    deltas: list[Delta] = []
    while True:
        round_ = start + len(deltas)
        delta = read_delta(storage, delta_path(set_id, version, job, index, round_))
        if delta is None or delta.token != token or delta.round != round_:
            return deltas, False
        deltas.append(delta)
        if delta.cut:
            return deltas, True


def apply_delta(job: Job, delta: Delta, wanted: Sequence[KeyGroupRange]) -> int:
    """Bring the keys ``delta`` changed in ``wanted`` to their content at the cut: each key's
    stored content cleared (a value's only when it holds nothing now: its put replaces it), then
    its entries put (the job's lock taken per batch); how many keys."""
    inside = [c for c in delta.changed if any(c[0] in r for r in wanted)]
    with job.exclusive():
        for table in {c[1] for c in inside} & delta.tables.keys():
            job.partition.create_table(table, delta.tables[table])  # as a load does: kept if it exists
        tables = job.partition.tables()

    def ops() -> list[WriteOp]:
        out = []
        for kg, table, primary, entries in inside:
            if table not in tables:
                continue  # gone at the cut and never here: nothing to clear
            if delta.tables.get(table) or not entries:  # a value's put replaces it; entries of a map or list may go
                out.append(WriteOp("clear", table, kg, primary))
            out.extend(WriteOp("put", table, kg, primary, secondary, value) for secondary, value in entries)
        return out

    load_records(job.partition, ops(), job.exclusive)
    return len(inside)
