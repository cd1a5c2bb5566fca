"""One job's RocksDB database through its life: opened, leased by every access, closed while
idle, reopened on its next use, and reopened for writing after it degraded.

``OpenInstances`` (``pool.py``) bounds how many are open: every access to the database holds a
lease, and only an instance without one is closed.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from rocksdict import AccessType, ColumnFamily, Options, Rdict

from statehouse.backends.errors import InsufficientStorage
from statehouse.backends.reserved import BROADCAST_TABLE, LIST_TABLE, META_TABLE
from statehouse.backends.rocksdb.database import (
    NESTED_PREFIX,
    KeyLayout,
    iterate,
    remove_partial_files,
)
from statehouse.backends.rocksdb.degrade import DegradePolicy
from statehouse.backends.rocksdb.space import is_out_of_space
from statehouse.snapshots.stored.keys import DEFAULT_FAMILY, MAX_PARALLELISM_KEY, column_family, prefix_successor

if TYPE_CHECKING:
    from statehouse.backends.rocksdb.pool import OpenInstances

# The partition's logger: every line about a job's database is under one name, whichever part writes it.
logger = logging.getLogger("statehouse.backends.rocksdb.partition")

# Column families a new database is created with: every job makes these tables, and creating
# them with the database writes RocksDB's OPTIONS file once instead of once per table.
_WITH_NEW_DATABASE = (LIST_TABLE, BROADCAST_TABLE)
_TICKS = itertools.count(1)  # last-use stamps, for the least recently used instance


class DatabaseInstance:
    """The open ``Rdict`` of one job's database (when it is open), and what opening it reads:
    the max parallelism, the tables with their column families and handles, the key layout.

    It owns the life cycle: the lease count (an access or a live iterator holds one), the idle
    close the pool asks for (only without a lease), the reopen on the next access, the final
    close, and the reopen for writing of a degraded database once the volume has room
    (:meth:`recover`; the :class:`DegradePolicy` it shares with the partition says whether it is
    degraded). One lock guards opening, closing and the lease count; the pool's lock is always
    taken after it, never before."""

    def __init__(
        self,
        path: str,
        max_parallelism: int | None,
        options: Options,
        pool: OpenInstances | None,
        policy: DegradePolicy,
    ) -> None:
        self.path = path
        self.options = options
        self.policy = policy
        self._pool = pool  # None: stays open until closed (staged restores, snapshot readers)
        self._guard = threading.Lock()  # opening, closing and the lease count
        self.leases = 0  # accesses in progress (and live iterators)
        self.is_open = False
        self.closed = False
        self.last_used = 0
        # Set by each open:
        self.db: Rdict
        self.max_parallelism: int
        self.column_families: set[str]  # may exceed the tables: see add_table
        self.nested: dict[str, bool]  # table -> nested (a map's table)
        self.layout: KeyLayout
        self.families: dict[str, Rdict]
        self.handles: dict[str, ColumnFamily]
        self._open(max_parallelism)
        self._opened()

    def _opened(self) -> None:
        self.last_used = next(_TICKS)
        if self._pool is not None:
            self._pool.add(self)

    # -- leases ------------------------------------------------------------------------------

    def acquire(self) -> None:
        """Hold the database open (reopening it if it was closed while idle)."""
        with self._guard:
            if self.closed:
                raise RuntimeError(f"the state partition at {self.path} is closed")
            self.leases += 1
            if self.is_open:
                self.last_used = next(_TICKS)
                return
            started = time.monotonic()
            try:
                self._open(None)
            except BaseException:
                self.leases -= 1
                raise
            self._opened()
            # Debug: with more jobs than STATEHOUSE_MAX_OPEN_JOBS this is routine, per request.
            logger.debug("reopened idle RocksDB instance %s in %.0f ms", self.path, (time.monotonic() - started) * 1000)
        if self._pool is not None:
            self._pool.trim()

    def release(self) -> None:
        """End a lease :meth:`acquire` took."""
        with self._guard:
            self.leases -= 1

    def close_idle(self) -> bool:
        """Close the database if nothing uses it (it reopens on the next access); whether it did."""
        with self._guard:
            if not self.is_open or self.leases or self.closed:
                return False
            self._close_db()
            logger.debug("closed idle RocksDB instance %s (STATEHOUSE_MAX_OPEN_JOBS)", self.path)
            return True

    # -- open --------------------------------------------------------------------------------

    def _open(self, max_parallelism: int | None) -> None:
        path = self.path
        is_new = not os.path.exists(os.path.join(path, "CURRENT"))
        existing = [] if is_new else Rdict.list_cf(path, self.options)
        if not existing and max_parallelism is not None:
            existing = [column_family(table) for table in _WITH_NEW_DATABASE]
        families = {cf: self.options for cf in existing if cf != DEFAULT_FAMILY}
        self.column_families = set(families)
        try:
            self.db = self._open_writable(families)
        except Exception as exc:
            if not is_out_of_space(exc):
                raise
            if is_new:  # nothing to read yet
                raise InsufficientStorage(
                    f"the data volume is full: a new job's database cannot be created ({exc})"
                ) from exc
            # Opening replays the write-ahead log into new table files first: without the room
            # for them, drop what the failed attempt wrote and serve reads read-only until it returns.
            removed = remove_partial_files(path, families)
            if removed:
                logger.warning("%s: removed %d partial table files of a failed open", path, len(removed))
            try:
                self.db = self._open_writable(families)
            except Exception as again:
                if not is_out_of_space(again):
                    raise
                self.db = Rdict(path, self.options, column_families=families, access_type=AccessType.read_only())
                self.policy.degrade(self)
                logger.warning("%s opened read-only: no room to replay its write-ahead log (%s)", path, again)
        self.is_open = True
        stored = self.db.get(MAX_PARALLELISM_KEY)
        if stored is not None:
            self.max_parallelism = int(stored)
        elif max_parallelism is None:
            self._close_db()
            raise FileNotFoundError(f"no state partition at {path}")
        else:
            self.max_parallelism = max_parallelism
            self.db.put(MAX_PARALLELISM_KEY, str(max_parallelism).encode())
        self.nested = {META_TABLE: False}
        for key, value in iterate(self.db, NESTED_PREFIX, prefix_successor(NESTED_PREFIX)):
            self.nested[key[len(NESTED_PREFIX) :].decode()] = value == b"1"
        self.layout = KeyLayout(self.max_parallelism, self.nested)
        self.families = {}
        self.handles = {}
        for table in self.nested:
            self._open_family(table)

    def _open_writable(self, families: dict[str, Options]) -> Rdict:
        try:
            return Rdict(self.path, self.options, column_families=families)
        except Exception as exc:
            # The lock of a database closed moments ago is held until its last Rdict object is
            # gone: a leftover one in a reference cycle (an exception's traceback) goes with a
            # collection. Only here, not on every close.
            if "lock" not in str(exc).lower():
                raise
            gc.collect()
            return Rdict(self.path, self.options, column_families=families)

    def _open_family(self, table: str) -> None:
        if table == META_TABLE:
            self.families[table] = self.db
            self.handles[table] = self.db.get_column_family_handle(DEFAULT_FAMILY)
        else:
            self.families[table] = self.db.get_column_family(column_family(table))
            self.handles[table] = self.db.get_column_family_handle(column_family(table))

    # -- tables (the caller holds a lease and checked the write) -------------------------------

    def add_table(self, table: str, nested: bool) -> None:
        """Make ``table``: its column family and its row saying whether it is nested."""
        if table in self.nested:
            return
        # A column family without its table row (made with the database, or by a crash between
        # the two writes) is taken as it is.
        if column_family(table) not in self.column_families:
            self.db.create_column_family(column_family(table), self.options)
            self.column_families.add(column_family(table))
        self.db.put(NESTED_PREFIX + table.encode(), b"1" if nested else b"0")
        self.nested[table] = nested
        self._open_family(table)

    def remove_table(self, table: str) -> None:
        """Drop ``table``, its row and its column family."""
        if table not in self.nested or table == META_TABLE:
            return
        del self.nested[table]
        self.families.pop(table, None)
        self.handles.pop(table, None)
        gc.collect()
        self.db.delete(NESTED_PREFIX + table.encode())
        self.db.drop_column_family(column_family(table))
        self.column_families.discard(column_family(table))

    # -- out of space ------------------------------------------------------------------------

    def recover(self) -> bool:
        """Reopen a degraded database for writing if the volume is above its reserve and nothing
        uses the database now; whether it takes writes (again)."""
        with self._guard:
            if not self.policy.degraded:
                return True
            if self.leases or not self.policy.room_to_reopen():
                return False
            if self.is_open:
                self._close_db()  # also forgets the degraded state
            if self.closed:
                return True
            self._open(None)  # degrades again if the volume is still too full to open writable
            self._opened()
            return not self.policy.degraded

    # -- close -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the database for good (until :meth:`reopen`)."""
        with self._guard:
            if self.closed:
                return
            self.closed = True
            if self.is_open:
                self._close_db()
        logger.info("closed RocksDB instance %s", self.path)

    def _close_db(self) -> None:
        # RocksDB closes when its last Rdict object goes: the leases say nothing uses the
        # database, and this drops every one the instance holds. No gc.collect() (a full
        # collection per close would make shutting down many jobs take tens of seconds; _open collects
        # only if a reopen finds the lock held) and no Rdict.close(), which flushes the memtables
        # first (~8 ms per job): the WAL already holds every write, and the next open replays it.
        self.is_open = False
        self.families.clear()
        self.handles.clear()
        del self.db
        self.policy.clear(self)  # the next open tries for writing again
        if self._pool is not None:
            self._pool.discard(self)

    def reopen(self) -> None:
        """Open the database at ``path`` again after :meth:`close` (it may be another one now)."""
        started = time.monotonic()
        with self._guard:
            self._open(None)
            self.closed = False
            self._opened()
        logger.info("reopened RocksDB instance %s in %.0f ms", self.path, (time.monotonic() - started) * 1000)
        if self._pool is not None:
            self._pool.trim()
