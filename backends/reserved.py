"""The reserved layout of a partition: the tables and metadata rows that are not keyed state.

One definition for the engine, every backend and the snapshot formats. ``$`` cannot occur
in a state, operator or job name (``snapshots/stored/names.py``), so no user name collides with
these tables, nor with the ``$``-directories a store keeps beside its jobs.
"""

from __future__ import annotations

META_TABLE = "$meta"  # job metadata rows, flat, key group 0
LIST_TABLE = "$operator-lists"  # operator list state: (operator, name, subtask) -> elements
BROADCAST_TABLE = "$broadcast"  # broadcast state: (operator, name) -> {user key: value}
# Timers (``backends/timers.py``), one flat table per time domain. They are keyed tables: stored
# per key group, so snapshots write them and restores move them with their key groups like any
# state; they are not states (no descriptor, not counted against STATEHOUSE_MAX_STATES_PER_JOB).
EVENT_TIMERS_TABLE = "$timers-event"
PROCESSING_TIMERS_TABLE = "$timers-processing"
TIMER_TABLES = frozenset({EVENT_TIMERS_TABLE, PROCESSING_TIMERS_TABLE})
# Each time domain's current time on this replica (flat, key group 0: domain -> decimal). Not
# state, as in Flink (timers are, the watermark is not): no snapshot holds it, a restore starts
# without it, and it is neither a keyed table nor part of the operator-state snapshot.
TIMER_CLOCK_TABLE = "$timer-clocks"
# Raw keyed state (``backends/raw_state.py``): one opaque stream per key group, a flat keyed table
# (so snapshots carry it per key group and restores move it with its key group, as timers).
RAW_KEYED_TABLE = "$raw-keyed"
# Raw operator state: rows of LIST_TABLE under this prefix + the operator's name (no user operator
# name holds "$"), so snapshots carry it with operator state and restores repartition it on its
# own, as Flink repartitions an operator's raw state apart from its managed state.
RAW_OPERATOR_PREFIX = "$raw/"
NON_KEYED_TABLES = frozenset({META_TABLE, LIST_TABLE, BROADCAST_TABLE, TIMER_CLOCK_TABLE})
NO_KEY_GROUP = 0  # the key group non-keyed tables are stored under

# Rows of META_TABLE
STATE_META = b"state:"  # + state name -> descriptor JSON
LIST_MODE_META = b"operator-list-mode:"  # + encoded (operator, name) -> b"split" | b"union"
EPOCH_META = b"writer-epoch"  # -> the job's writer epoch, decimal
COMMITTED_EPOCH_META = b"committed-epoch"  # -> the last epoch whose staged writes were committed, decimal
# -> the Spark micro-batch that epoch applied, decimal (absent: no commit named one). The exactly-once
# anchor: written with the batch's writes, so every snapshot and move carries it with the state.
COMMITTED_BATCH_META = b"committed-batch"
# -> the operator state a live rescale loaded for the new layout (an operator snapshot's bytes),
# applied when the move commits; durable, so a replica restarted in between still applies it.
# Not state: no snapshot takes it.
STAGED_OPERATOR_META = b"rescale-operator-state"


def keyed_tables(tables: dict[str, bool]) -> dict[str, bool]:
    """The keyed-state tables of a partition's table listing (name -> nested), sorted."""
    return {name: nested for name, nested in sorted(tables.items()) if name not in NON_KEYED_TABLES}
