"""One replica's side of a live rescale (docs/rescale.md): prepare, load, decide, commit,
abort, and what a restart does about a move it finds in its record.

The coordinator (``client/rescale.py``) drives every replica through the steps; each is
idempotent, and each replica records how far it got in its topology (``backends/topology.py``:
``Move``). Which way a move goes after a failure is the durable decision's
(``backends/checkpointing/decision.py``), never a replica's memory. The engine does the moving
(``Job.freeze``/``switch_layout``/``drop_key_groups``, ``MergeRestore``); this module holds the
rules of when, in what order, and what is recorded. The HTTP routes (``app/routers/topology.py``)
only translate.

Order of a commit, and why: operator state applied (idempotent: staged once, applied once), the
new layout recorded durably, the jobs switched (unfrozen; 421 for what moved away), then the key
groups that moved away dropped; a crash before the drop leaves key groups nobody is served from,
which the next start drops (``Previous.dropped``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.checkpointing.decision import Decision, Outcome, RescaleDecided, decide, read_decision
from statehouse.backends.checkpointing.manager import CheckpointManager
from statehouse.backends.checkpointing.precopy import Delta, apply_delta, delta_path, read_rounds, write_delta
from statehouse.backends.checkpointing.restore import MergeRestore, check_coverage
from statehouse.backends.errors import BatchInFlight, JobNotFound, StateError
from statehouse.backends.job import Job
from statehouse.backends.topology import Move, Previous, ReplicaLayout, owned_range, start_action, subtract
from statehouse.protocol.errors import InvalidArgument
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.errors import CheckpointNotFound
from statehouse.snapshots.stored.names import validate_name

log = logging.getLogger(__name__)


class RescalePending(StateError):
    """Another move is pending on this replica: finish or abort it first."""

    code = "rescale_pending"


class RescaleConflict(StateError):
    """The request names a move this replica is not part of (another version, no move here)."""

    code = "rescale_conflict"


class RescaleIncomplete(StateError):
    """A load that does not name every job this replica has."""

    code = "rescale_incomplete"


class RescaleNotDecided(StateError):
    """A commit before the coordinator decided commit."""

    code = "rescale_not_decided"


class RescaleNotLoaded(StateError):
    """A commit on a replica that has not loaded its key groups (it restarted mid-load): load again."""

    code = "rescale_not_loaded"


def _spans(ranges: list[Any]) -> list[list[int]]:
    """Each range once, in order, as ``[start, end]``."""
    return [[r.start, r.end] for r in dict.fromkeys(ranges)]


def _run_all(calls: list[Callable[[], None]]) -> None:
    """Each compaction of what a commit dropped, one job's failing not keeping the others' from running
    (a failed one is logged: the space stays taken until a compaction reaches those files)."""
    for call in calls:
        try:
            call()
        except Exception:
            log.exception("compacting the key groups the last live rescale moved away failed")


class RescaleParticipant:
    """The live-rescale steps of one replica, over its catalog, its recorded layout and the
    checkpoint storage the set shares. Steps run one at a time (a lock); each may block for long
    (a load reads from storage): call them off the event loop."""

    def __init__(
        self,
        catalog: JobCatalog,
        checkpoints: CheckpointManager,
        *,
        work_dir: str | None = None,
        on_committed: Callable[[float], None] | None = None,
        batch_lease_s: float = 60.0,
        reclaim_delay_s: float = 0.0,
    ) -> None:
        assert catalog.layout is not None, "a live rescale needs the replica's recorded layout"
        self.catalog = catalog
        self.layout: ReplicaLayout = catalog.layout
        self.checkpoints = checkpoints
        self.storage = checkpoints.storage
        self.work_dir = work_dir
        self.on_committed = on_committed  # (seconds from prepare to commit): the duration metric
        self.batch_lease_s = batch_lease_s  # how long a begun micro-batch holds off a prepare without a sign of life
        self._lock = threading.RLock()
        # A pre-copy, in memory only (a restart forgets both, and the move then loads whole): the
        # token of this replica's change tracking per move version, and per (version, job) the
        # old replicas' tokens the copy loaded here was taken under.
        self._tokens: dict[int, str] = {}
        self._copied: dict[tuple[int, str], dict[int, str]] = {}
        # Per (version, job), per old replica index: the round of its deltas the copy here needs
        # next (every earlier one applied). And the deltas this replica wrote per move version,
        # removed when the move ends.
        self._rounds: dict[tuple[int, str], dict[int, int]] = {}
        self._written: dict[int, list[str]] = {}
        # The compaction of what a commit dropped runs ``reclaim_delay_s`` after its answer, while
        # the new layout serves: not beside the first micro-batches on it, which it would slow down
        # and whose checkpoints would upload what it rewrote. The next move, and the shutdown, run
        # it at once and wait for it, so that no checkpoint of theirs carries the dropped data.
        self.reclaim_delay_s = reclaim_delay_s
        self._reclaim_now = threading.Event()
        self._reclaimer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="statehouse-reclaim")
        self._reclaiming: Future[None] | None = None

    @property
    def index(self) -> int:
        return self.layout.topology.index

    # -- prepare ----------------------------------------------------------------------------------

    def prepare(
        self,
        version: int,
        replica_count: int,
        replica_urls: list[str],
        initiator: str = "operator",
        precopy: bool = False,
    ) -> Move:
        """Record the move to ``replica_count`` replicas at ``version`` and freeze what moves out.

        A serving replica (its recorded version below ``version``) freezes, in every job, the key
        groups it gives away and its operator state; refused with ``batch_in_flight`` (nothing
        frozen, nothing recorded) while a micro-batch is in flight (``Job.freeze``). A new, empty
        replica records that it joins. The same move again changes nothing; the same version with
        another count or other URLs is refused.

        ``precopy``: record the move as ``copying`` instead, nothing frozen, and note from now on
        what changes in the key groups this replica gives away (:meth:`tracking_token` names it);
        the same move prepared again without ``precopy`` freezes them and writes that delta
        (docs/rescale.md, "Pre-copy")."""
        if replica_count < 1:
            raise InvalidArgument(f"replica_count must be at least 1; got {replica_count}")
        if replica_urls and len(replica_urls) != replica_count:
            raise InvalidArgument(
                f"replica_urls names {len(replica_urls)} URLs for {replica_count} replicas: give one per replica "
                "(in index order) or none"
            )
        with self._lock:
            self._wait_reclaimed()
            topology = self.layout.topology
            if topology.move is not None:
                if topology.move.same_target(version, replica_count):
                    if replica_urls and tuple(replica_urls) != topology.move.replica_urls:
                        raise RescaleConflict(
                            f"the move to topology version {version} was prepared here with other replica URLs "
                            f"({', '.join(topology.move.replica_urls) or 'none'}): resume or abort it as prepared",
                            version=version,
                        )
                    if topology.move.phase == "copying":
                        return self._track(topology.move) if precopy else self._cut(topology.move)
                    return topology.move
                raise RescalePending(
                    f"a live rescale to {topology.move.replica_count} replicas (topology version "
                    f"{topology.move.version}) is pending on this replica: finish it or abort it first (statehouse "
                    "rescale --resume or --abort)",
                    version=topology.move.version,
                )
            fresh = not self.catalog.names() and topology.previous is None
            if topology.version == version and topology.count == replica_count and not fresh:
                return Move(version, replica_count, replica_count, tuple(topology.replica_urls))  # committed already
            if version < topology.version or (version == topology.version and not fresh):
                raise RescaleConflict(
                    f"this replica serves topology version {topology.version} (replica {topology.index} of "
                    f"{topology.count}): a move to version {version} is prepared on the replicas of an older version "
                    "and on new, empty ones",
                    version=topology.version,
                )
            for job in self._jobs():
                if replica_count > job.max_parallelism:
                    raise InvalidArgument(
                        f"job {job.name!r} has max_parallelism {job.max_parallelism}: it cannot be spread over "
                        f"{replica_count} replicas"
                    )
            existing = read_decision(self.storage, topology.set_id, version)
            if existing is not None:
                raise RescaleDecided(
                    f"a live rescale to topology version {version} was decided {existing.outcome} already: a new "
                    f"rescale takes version {version + 1} (new, empty replicas accept it as they are)",
                    version=version,
                    outcome=existing.outcome,
                )
            move = Move(
                version,
                replica_count,
                0 if fresh else topology.count,
                tuple(replica_urls),
                phase="copying" if precopy else "prepared",
                joining=fresh,
                initiator=initiator,
            )
            if precopy:
                self._track(move)
            else:
                self._freeze(move)
            try:
                self.layout.begin_move(move)
            except BaseException:
                self._unfreeze()
                raise
            self.checkpoints.hold_for(version)
            log.info(
                "live rescale to %d replicas (topology version %d) %s%s",
                replica_count,
                version,
                "copying (nothing frozen)" if precopy else "prepared",
                " (joining)" if fresh else "",
            )
            return move

    def _track(self, move: Move) -> Move:
        """Note what changes in every job's moving-out key groups under this move's token (jobs
        opened later as they open); a joining replica gives nothing away, and serves nothing."""
        if move.joining:
            self.catalog.serving = False
            return move
        token = self._tokens.setdefault(move.version, uuid.uuid4().hex)
        index = self.index

        def track(job: Job) -> None:
            job.track_changes(move.moving_out(job.max_parallelism, index), token)

        self.catalog.on_open = track
        for job in self._jobs():
            track(job)
        return move

    def _cut(self, move: Move) -> Move:
        """The end of a pre-copy: freeze as a prepare does, then write each job's delta (what its
        tracker saw change, as it is now, frozen) beside the decision, for the new owners."""
        self._freeze(move)
        token = self._tokens.get(move.version)
        if token is not None and not move.joining:
            for job in self._jobs():
                self._write_delta(move, job, token)
        move = self.layout.update_move(phase="prepared")
        log.info("live rescale to %d replicas (topology version %d) prepared", move.replica_count, move.version)
        return move

    def catch_up(self, version: int) -> dict[str, dict[str, int]]:
        """A catch-up round of a pre-copy, writes going on: each job's delta of what its tracker
        noted since the last round (their content now), and the next round begun, so that the cut
        carries only what changes after it. Per job written: the round and the keys in it. A
        replica that gives nothing away writes nothing."""
        with self._lock:
            move = self._pending(version)
            if move.phase != "copying":
                raise RescaleConflict(
                    f"the move to topology version {version} is {move.phase} here, past its pre-copy: a catch-up "
                    "round belongs to the copy",
                    version=version,
                )
            token = self._tokens.get(version)
            if token is None or move.joining:
                return {}
            written = {}
            for job in self._jobs():
                done = self._write_delta(move, job, token, take_round=True)
                if done is not None:
                    written[job.name] = {"round": done[0], "keys": done[1]}
            return written

    def _write_delta(self, move: Move, job: Job, token: str, take_round: bool = False) -> tuple[int, int] | None:
        """Write ``job``'s delta of its tracker's round (at the cut, frozen; ``take_round``: a
        catch-up's, beginning the next round); the round and its keys, or None if none was written."""
        changed = job.changed(token, take_round)
        if changed is None:
            log.info("job %s: no valid change tracking; its moving key groups are loaded whole at the cut", job.name)
            return None
        round_, tables, entries = changed
        path = delta_path(self.layout.topology.set_id, move.version, job.name, self.index, round_)
        ranges = move.moving_out(job.max_parallelism, self.index)
        self._written.setdefault(move.version, []).append(path)
        try:
            write_delta(self.storage, path, Delta(token, ranges, tables, entries, round_, cut=not take_round))
        except Exception as exc:  # storage down: the new owners load these key groups whole
            if take_round:  # the round's keys are taken: no later delta can stand for them
                job.invalidate_tracking(token, f"the delta of catch-up round {round_} could not be written")
            log.warning(
                "job %s: the pre-copy delta could not be written (%s); its key groups are loaded whole", job.name, exc
            )
            return None
        return round_, len(entries)

    def tracking_token(self, version: int) -> str | None:
        """The token of this replica's change tracking for the move to ``version`` (a pre-copy's
        loads name it), or None when it tracks nothing."""
        return self._tokens.get(version)

    def _forget_precopy(self, move: Move) -> None:
        """A move ended: tracking stops, copies are forgotten, this replica's deltas removed, and
        the move's checkpoints are retained as any others."""
        self.checkpoints.release_held()
        jobs = self._jobs()
        for job in jobs:
            job.stop_tracking()
        self._copied = {k: v for k, v in self._copied.items() if k[0] != move.version}
        self._rounds = {k: v for k, v in self._rounds.items() if k[0] != move.version}
        self._tokens.pop(move.version, None)
        paths = self._written.pop(move.version, [])
        if paths:
            try:
                self.storage.delete(paths)
            except Exception as exc:  # left behind: harmless, named after a spent version
                log.warning("the pre-copy deltas of topology version %d were not removed: %s", move.version, exc)

    def _jobs(self) -> list[Job]:
        """Every job of this replica, opened (a job found on disk opens on first use); one deleted
        meanwhile is left out."""
        jobs = []
        for name in self.catalog.names():
            with contextlib.suppress(JobNotFound):
                jobs.append(self.catalog.get(name, serving=False))
        return jobs

    def _freeze(self, move: Move) -> None:
        """Freeze every job's moving-out key groups (and operator state), all or none; jobs opened
        or created later are frozen as they open. A joining replica gives nothing away, and owns
        nothing until the commit: frozen too, its jobs answer 503 (retry) rather than 421."""
        index = self.index
        if move.joining:
            self.catalog.serving = False

        def freeze(job: Job) -> None:
            job.freeze(move.moving_out(job.max_parallelism, index), move.version, self.batch_lease_s)

        self.catalog.on_open = freeze
        try:
            for job in self._jobs():
                freeze(job)
        except BatchInFlight:
            self._unfreeze()
            raise

    def _unfreeze(self) -> None:
        self.catalog.on_open = None
        for job in self._jobs():
            job.unfreeze()

    # -- load -------------------------------------------------------------------------------------

    def load(
        self,
        version: int,
        checkpoints: dict[str, int],
        precopy: dict[int, str] | None = None,
        catch_up: bool = False,
    ) -> dict[str, dict[str, Any]]:
        """Merge each job's moving-in key groups from its checkpoint into the live job (not served
        until the commit) and stage its operator state for the new layout; record ``loaded``.
        What a previous partial load left is cleared first. Per job: the key groups, the entries
        loaded and the bytes read from storage.

        ``precopy`` (old replica index -> tracking token, each as its pre-copy prepare answered,
        before the checkpoints were triggered): the copy of a move still ``copying``, recorded in
        memory only; the load at the cut then takes, from each old replica whose delta was written
        under the token named here, only what changed since, and the rest whole. With ``catch_up``
        (still ``copying``), nothing is read from ``checkpoints``: the copy loaded from them is
        brought up to date by each old replica's next catch-up round (:meth:`catch_up`)."""
        with self._lock:
            topology = self.layout.topology
            move = topology.move
            if move is None and topology.version == version:
                return {}  # committed: nothing left to load
            move = self._pending(version)
            if (precopy is not None or catch_up) and move.phase != "copying":
                raise RescaleConflict(
                    f"the move to topology version {version} is {move.phase} here, past its pre-copy: load at the "
                    "cut (without precopy)",
                    version=version,
                )
            if topology.index >= move.replica_count:
                return {}  # removed by the move: it loads nothing
            for job in checkpoints:
                validate_name(job, "job")  # before it names a path in storage
            if catch_up:  # over the copy's jobs; one made since has no copy, and moves whole at the cut
                return {job: self._catch_up_job(move, job) for job in sorted(checkpoints)}
            missing = sorted(set(self.catalog.names()) - set(checkpoints))
            if missing:
                raise RescaleIncomplete(
                    f"the load names no checkpoint of job(s) {', '.join(map(repr, missing))}, which this replica "
                    "has: take a global checkpoint of every job after the prepare, and load them all",
                    jobs=missing,
                )
            loaded: dict[str, dict[str, Any]] = {}
            for job, checkpoint_id in sorted(checkpoints.items()):
                copied = None if precopy is not None else self._copied.get((version, job))
                loaded[job] = self._load_job(move, job, checkpoint_id, copied)
                if precopy is not None:
                    self._copied[(version, job)] = dict(precopy)
                    self._rounds[(version, job)] = dict.fromkeys(precopy, 0)
                    # No checkpoint of its own holds what it loaded: upload it now, off the cut.
                    wanted = move.moving_in(self.catalog.get(job, serving=False).max_parallelism, self.index)
                    loaded[job]["bytes_seeded"] = self.checkpoints.seed(job, wanted, joining=move.joining)
            if precopy is None:
                self.layout.update_move(phase="loaded", checkpoints=dict(checkpoints))
            return loaded

    def _load_job(self, move: Move, job: str, checkpoint_id: int, copied: dict[int, str] | None) -> dict[str, Any]:
        _directory, parts = self.checkpoints.snapshots.parts(job, checkpoint_id)
        if not parts:
            raise CheckpointNotFound(
                f"checkpoint {checkpoint_id} of job {job!r} has no completed part: complete the global checkpoint "
                "on every replica before the load"
            )
        wanted = move.moving_in(parts[0].metadata.max_parallelism, self.index)
        deltas, whole = self._deltas(move, job, parts, wanted, copied) if copied else ([], wanted)
        operation = MergeRestore(
            self.catalog, self.storage, job, parts, whole, move.replica_count, self.index, work_dir=self.work_dir
        )
        live = operation.run()
        changed = sum(apply_delta(live, delta, [share]) for delta, share in deltas)
        return {
            "key_groups": _spans(wanted),
            "entries": operation.entries,
            "bytes_read": operation.bytes_read,
            "delta_key_groups": _spans([share for _, share in deltas]),
            "delta_keys": changed,
        }

    def _catch_up_job(self, move: Move, job: str) -> dict[str, Any]:
        """Apply the catch-up rounds each old replica wrote since the last over the copy of ``job``
        loaded here, each old replica's up to its first round missing or of another tracker (the
        cut's load then finds that gap too, and loads that share whole)."""
        copied, rounds = self._copied.get((move.version, job)), self._rounds.get((move.version, job))
        empty = {"key_groups": [], "entries": 0, "bytes_read": 0, "delta_key_groups": [], "delta_keys": 0}
        if not copied or rounds is None:
            return empty
        live = self.catalog.get(job, serving=False)
        moving_in = move.moving_in(live.max_parallelism, self.index)
        set_id, applied, changed = self.layout.topology.set_id, [], 0
        for index, token in sorted(copied.items()):
            start = rounds[index]
            deltas, _ = read_rounds(self.storage, set_id, move.version, job, index, token, start)
            for delta in deltas:
                wanted = [r for r in (given.intersection(own) for given in delta.ranges for own in moving_in) if len(r)]
                changed += apply_delta(live, delta, wanted)
                applied += wanted
            rounds[index] = start + len(deltas)
        return {**empty, "delta_key_groups": _spans(applied), "delta_keys": changed}

    def _deltas(
        self, move: Move, job: str, parts: list[Any], wanted: list[KeyGroupRange], copied: dict[int, str]
    ) -> tuple[list[tuple[Delta, KeyGroupRange]], list[KeyGroupRange]]:
        """Each old part's share of ``wanted``, split: brought up to the cut by that old replica's
        delta over the copy loaded here (written under the token the copy was taken under, and
        covering the share), or loaded whole."""
        set_id = self.layout.topology.set_id
        by_delta: list[tuple[Delta, KeyGroupRange]] = []
        whole: list[KeyGroupRange] = []
        found: dict[int, list[Delta]] = {}
        rounds = self._rounds.get((move.version, job), {})
        for target in wanted:
            for part in check_coverage(parts, target):  # refuses a checkpoint that does not cover it
                share = part.metadata.key_group_range.intersection(target)
                index = part.metadata.replica_index
                if index in copied and index not in found:
                    start = rounds.get(index, 0)
                    deltas, to_cut = read_rounds(self.storage, set_id, move.version, job, index, copied[index], start)
                    found[index] = deltas if to_cut else []
                deltas = found.get(index, [])
                if deltas and all(delta.covers(share) for delta in deltas):
                    by_delta += [(delta, share) for delta in deltas]
                else:
                    whole.append(share)
        return by_delta, whole

    def _pending(self, version: int) -> Move:
        move = self.layout.topology.move
        if move is None or move.version != version:
            topology = self.layout.topology
            pending = f"a move to version {move.version} is pending" if move else "no move is pending"
            raise RescaleConflict(
                f"this replica (topology version {topology.version}) is not in a move to version {version}: "
                f"{pending}; prepare it first",
                version=topology.version,
            )
        return move

    # -- decide -----------------------------------------------------------------------------------

    def decide(
        self,
        version: int,
        outcome: Outcome,
        replica_count: int | None = None,
        replica_urls: list[str] | None = None,
        checkpoints: dict[str, int] | None = None,
        metadata: dict[str, Any] | None = None,
        from_count: int | None = None,
    ) -> Decision:
        """Write the durable decision of the move to ``version`` (once; the same outcome again
        answers the record that stands). A version this replica already serves (or an older one)
        is refused unless its move is pending here or was decided: a stray decision would spend
        that version for every later move. ``from_count`` (the count the move started from) is
        this replica's record of it when not given and it is an old replica of the move. Commit
        is refused (``rescale_incomplete``) until what it commits exists: a checkpoint of every
        job this replica has, each completed in storage, so that a resume can always finish it."""
        topology = self.layout.topology
        pending = topology.move is not None and topology.move.version == version
        if from_count is None and topology.move is not None and pending and not topology.move.joining:
            from_count = topology.move.from_count
        if version <= topology.version and not pending and self.decision(version) is None:
            raise RescaleConflict(
                f"this replica serves topology version {topology.version}: no move to version {version} is pending "
                f"or decided; a move goes to version {topology.version + 1} or later",
                version=topology.version,
            )
        if outcome == "commit" and self.decision(version) is None:
            self._check_committable(checkpoints or {})
        decision = Decision(
            self.layout.topology.set_id,
            version,
            outcome,
            replica_count,
            tuple(replica_urls or ()),
            dict(checkpoints or {}),
            dict(metadata or {}),
            from_count=from_count,
        )
        return decide(self.storage, decision)

    def _check_committable(self, checkpoints: dict[str, int]) -> None:
        missing = sorted(set(self.catalog.names()) - set(checkpoints))
        if missing:
            raise RescaleIncomplete(
                f"a commit decision must name the move's checkpoint of every job; none for "
                f"{', '.join(map(repr, missing))}: take the global checkpoints and load them first",
                jobs=missing,
            )
        named = sorted(checkpoints.items())
        for job, _checkpoint_id in named:
            validate_name(job, "job")  # before it names a path in storage

        def completed(item: tuple[str, int]) -> bool:
            try:
                return bool(self.checkpoints.snapshots.parts(*item)[1])
            except CheckpointNotFound:
                return False

        # The jobs' checkpoints looked up several at once: the decision is inside the frozen window.
        for (job, checkpoint_id), found in zip(named, self.storage.transfer(completed, named), strict=True):
            if not found:
                raise RescaleIncomplete(
                    f"checkpoint {checkpoint_id} of job {job!r} has no completed part in storage: a commit "
                    "decision names the move's completed checkpoints (take them and load them first)",
                    jobs=[job],
                )

    def decision(self, version: int) -> Decision | None:
        return read_decision(self.storage, self.layout.topology.set_id, version)

    # -- commit -----------------------------------------------------------------------------------

    def commit(self, version: int) -> bool:
        """Serve the new layout (the decision must be commit); whether it was applied now (False:
        it had been)."""
        with self._lock:
            topology = self.layout.topology
            if topology.move is None and topology.version == version:
                return False
            move = self._pending(version)
            decision = self.decision(version)
            if decision is None or decision.outcome != "commit":
                raise RescaleNotDecided(
                    f"the live rescale to topology version {version} is "
                    + ("undecided" if decision is None else "decided abort")
                    + ": a commit needs the decision commit (POST /v1/topology/decide), written once every replica "
                    "loaded",
                    version=version,
                )
            if decision.replica_count not in (None, move.replica_count):
                raise RescaleConflict(
                    f"the decision of topology version {version} commits {decision.replica_count} replicas, but "
                    f"this replica prepared a move to {move.replica_count}: the coordinator that decided it must "
                    "finish it (statehouse rescale --resume)",
                    version=topology.version,
                )
            if topology.index < move.replica_count and move.phase != "loaded":
                raise RescaleNotLoaded(
                    f"this replica has not loaded its key groups of the move to topology version {version} (it "
                    "restarted mid-load): load again (POST /v1/topology/load), then commit",
                    version=version,
                )
            self._apply_commit(move)
            return True

    def _apply_commit(self, move: Move) -> None:
        index = self.index
        for job in self._jobs():
            job.apply_staged_operator_state()
        dropping = {job.name: move.moving_out(job.max_parallelism, index) for job in self._jobs()}
        self.layout.commit_move()  # from here on the move only goes forward, whatever happens
        self.catalog.on_open = None
        self.catalog.switch_layout(move.replica_count, index, move.version)
        self.checkpoints.relayout()
        reclaims = [
            self.catalog.get(name, serving=False).drop_key_groups(ranges, False) for name, ranges in dropping.items()
        ]
        self._mark_dropped()
        self._forget_precopy(move)
        self._reclaim_now.clear()
        self._reclaiming = self._reclaimer.submit(self._reclaim_later, reclaims)
        seconds = max(0.0, time.time() - move.started)
        log.info(
            "live rescale to %d replicas (topology version %d) committed: replica %d %s, %.1f s after its prepare",
            move.replica_count,
            move.version,
            index,
            "serves its new key groups" if index < move.replica_count else "was removed and owns nothing",
            seconds,
        )
        if self.on_committed is not None:
            self.on_committed(seconds)

    def _reclaim_later(self, reclaims: list[Callable[[], None]]) -> None:
        self._reclaim_now.wait(self.reclaim_delay_s)
        started = time.monotonic()
        _run_all(reclaims)
        log.info(
            "compacted away what the last live rescale moved off this replica (%d jobs) in %.2f s",
            len(reclaims),
            time.monotonic() - started,
        )

    def close(self) -> None:
        """At shutdown, before the catalog closes: the compaction a commit left pending runs now."""
        with self._lock:
            self._wait_reclaimed()
        self._reclaimer.shutdown(wait=True)

    def _wait_reclaimed(self) -> None:
        """Run now and wait for the compaction of what the last commit dropped (:func:`_run_all`)."""
        self._reclaim_now.set()
        reclaiming, self._reclaiming = self._reclaiming, None
        if reclaiming is not None:
            reclaiming.result()

    def _mark_dropped(self) -> None:
        previous = self.layout.topology.previous
        if previous is not None and not previous.dropped:
            self.layout.set_previous(Previous(previous.count, previous.version, dropped=True))

    # -- abort ------------------------------------------------------------------------------------

    def abort(self, version: int) -> bool:
        """Undo the move to ``version`` here (deciding abort if undecided; refused once commit was
        decided); whether there was anything to undo."""
        with self._lock:
            topology = self.layout.topology
            if topology.move is not None and topology.move.version != version:
                self._pending(version)  # raises: another move is pending
            if topology.move is None and version <= topology.version and self.decision(version) is None:
                return False  # nothing here to undo, and nothing to decide: a version it already serves
            self.decide(version, "abort")
            if topology.move is None:
                return False
            self._apply_abort(topology.move)
            return True

    def _apply_abort(self, move: Move) -> None:
        index = self.index
        self._forget_precopy(move)
        self.checkpoints.discard_seeds()
        if move.joining:
            self.catalog.on_open = None
            for name in self.catalog.names():  # what it loaded for the move; it held nothing before
                self.catalog.delete(name)
            self.layout.clear_move(unassigned=True)
            log.warning("%s", self.unassigned_line())
            return
        for job in self._jobs():
            wanted = move.moving_in(job.max_parallelism, index)
            MergeRestore(self.catalog, self.storage, job.name, [], wanted, move.replica_count, index).clear(job)
        self._unfreeze()
        self.layout.clear_move()
        self.catalog.serving = True
        log.info("live rescale to %d replicas (topology version %d) aborted here", move.replica_count, move.version)

    def unassigned_line(self) -> str:
        """What an aborted joining replica is and what the operator does with it (logged at the
        abort and at each start while it lasts)."""
        topology = self.layout.topology
        return (
            f"unassigned: the live rescale that was to add this replica (index {topology.index} of {topology.count}, "
            f"topology version {topology.version}) was aborted; it holds nothing and serves nothing (not ready, "
            "skipped by clients): stop it (delete the pod, stop the process), or keep it running for a later "
            "`statehouse rescale --to` to join"
        )

    # -- a start with a move in the record --------------------------------------------------------

    def resume_at_start(self) -> str:
        """What a starting replica does about its record (docs/rescale.md, "Start of a replica
        with a move in its record"); the line it logged ("" when there was nothing to do)."""
        with self._lock:
            topology = self.layout.topology
            if topology.previous is not None and not topology.previous.dropped:
                self._drop_unowned(topology.previous)
            move = topology.move
            if move is None and topology.unassigned:
                self.catalog.serving = False  # nothing of a layout is its: a job made here owns nothing
                why = self.unassigned_line()
                log.warning("%s", why)
                return why
            if move is None:
                return ""
            self.checkpoints.hold_for(move.version)
            try:
                decision = self.decision(move.version)
            except StateError as exc:
                log.warning("reading the decision of the pending live rescale failed: %s", exc.detail)
                decision = None
            action, why = start_action(topology, decision.outcome if decision is not None else None)
            log.warning("%s", why)
            if action == "commit":
                self._apply_commit(move)
            elif action == "abort":
                self._apply_abort(move)
            elif action == "copying":
                if move.joining:  # nothing frozen; a joining replica serves nothing yet
                    self.catalog.serving = False
            else:
                self._freeze(move)
            return why

    def _drop_unowned(self, previous: Previous) -> None:
        """The key groups a committed move took away from this replica, dropped by the next start
        when the commit did not finish dropping them."""
        topology = self.layout.topology
        for job in self._jobs():
            held = owned_range(job.max_parallelism, previous.count, topology.index)
            job.drop_key_groups(subtract(held, owned_range(job.max_parallelism, topology.count, topology.index)))
        self._mark_dropped()
        log.warning("dropped the key groups a committed live rescale moved away from this replica")

    # -- what GET /v1/topology shows --------------------------------------------------------------

    def frozen_key_groups(self) -> dict[str, list[list[int]]]:
        """Per job, the key groups frozen for the pending move (none when no move is pending)."""
        move = self.layout.topology.move
        if move is None or move.joining or move.phase == "copying":
            return {}
        return {job.name: _spans(move.moving_out(job.max_parallelism, self.index)) for job in self._jobs()}
