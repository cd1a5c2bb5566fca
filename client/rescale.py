"""The driver of a live rescale (docs/rescale.md, docs/operations.md "Rescaling"): N replicas to M while
writers keep running. The CLI (``statehouse rescale --to M``) and a Spark driver
(``MicroBatchCoordinator.rescale``) share it.

Every step is idempotent and the replicas record where they are, so a coordinator that dies between
steps is replaced by another that calls :meth:`LiveRescale.resume`: it reads the replicas' phases
and the durable decision and goes on (decided commit: forward only; undecided: forward from prepare,
or :meth:`LiveRescale.abort`). Steps, on the replicas' ``/v1/topology/...`` endpoints:

1. prepare every replica, old and new (moving-out key groups freeze: writes to them answer 503
   ``rescale_in_progress``, which clients retry); a 409 ``batch_in_flight`` is retried until ``wait``;
2. one global checkpoint of every job on the old replicas (it holds exactly what moves);
3. load on every replica of the new layout (each merges the key groups it gains);
4. decide commit, once, in checkpoint storage (any failure before: decide abort, abort everywhere);
5. commit on every replica (one that restarted mid-load is loaded again first);
6. verify: each job's range on each replica of the new layout, and the removed ones retired.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from statehouse.client.errors import NotFound, StatehouseError, Unavailable
from statehouse.client.global_checkpoints import CheckpointCoordinator
from statehouse.client.job import JobClient
from statehouse.client.replicas import Replicas
from statehouse.client.transport import ReplicaConnection
from statehouse.protocol import routes
from statehouse.protocol.keygroups import KeyGroupRange

if TYPE_CHECKING:
    from statehouse.client.client import StatehouseClient

# A step's report to the progress callback: its name ("copying" and "copied": a pre-copy's start
# and its end, "caught up": each of its catch-up rounds, with the keys it carried; "prepared",
# "checkpointed", "loaded", "decided", "committed", "verified", "aborted", or "waiting": a batch in
# flight holds prepare (``for``: "batch_in_flight"), or a replica or its checkpoint storage does not
# answer a step (``for``: the problem's code, e.g. "storage_unavailable", or "unreachable"; with
# ``step``, ``url``, ``detail``)) and what it did. An exception raised by the callback stops the
# driver there, as a dead coordinator would (the tests use this). A checkpoint's "waiting" comes
# from the thread that checkpoints that job (the jobs are checkpointed side by side).
Progress = Callable[[str, dict[str, Any]], None]

# A pre-copy catches up in at most this many rounds, and stops once a round carries fewer keys
# per old replica than CATCH_UP_KEYS (tens of milliseconds of work on either side).
CATCH_UP_ROUNDS = 3
CATCH_UP_KEYS = 5_000

STEPS = ("copying", "caught up", "copied", "prepared", "checkpointed", "loaded", "decided", "committed", "verified")


class RescaleFailed(StatehouseError):
    """The live rescale did not complete; ``detail`` says where it stopped and what to run next."""


class RescaleLeftPending(RescaleFailed):
    """The move could not be ended either way (its checkpoint storage or a replica did not answer
    within ``wait``): it stays pending, moving key groups frozen, until ``resume()`` or ``abort()``."""


class RescalePending(RescaleFailed):
    """Another move is pending on the replicas: finish it (resume) or abort it first."""


class NewReplicasMissing(RescaleFailed):
    """The replicas a grow adds are not given, not running, or not new and empty: start them."""


@dataclass
class RescaleReport:
    """What a live rescale did: ``outcome`` is "committed" or "aborted"."""

    outcome: str
    from_count: int
    to_count: int
    version: int
    urls: list[str]  # the serving set's URLs in index order, afterwards
    checkpoints: dict[str, int] = field(default_factory=dict)  # job -> the checkpoint moved
    loaded: dict[str, dict[str, int]] = field(default_factory=dict)  # url -> bytes_read, entries, delta_keys
    ranges: dict[str, list[list[int]]] = field(default_factory=dict)  # job -> each replica's [start, end]
    seconds: float = 0.0  # from the first prepare (or the resume) to commit, verified
    copied: dict[str, dict[str, int]] = field(default_factory=dict)  # the pre-copy's loads, as ``loaded``

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "from": self.from_count,
            "to": self.to_count,
            "version": self.version,
            "urls": self.urls,
            "checkpoints": self.checkpoints,
            "loaded": self.loaded,
            "copied": self.copied,
            "ranges": self.ranges,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class _Move:
    """One move: old replicas (index order) to ``count`` replicas at ``version``."""

    old_urls: list[str]
    count: int
    version: int
    urls: list[str]  # the new layout's replica URLs, index order (``count`` of them)
    jobs: dict[str, int]  # job -> max parallelism
    initiator: str = "operator"

    @property
    def everyone(self) -> list[str]:
        """Every replica taking part: the old ones and the new ones."""
        return self.old_urls + [url for url in self.urls if url not in self.old_urls]

    @property
    def body(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "replica_count": self.count,
            "replica_urls": self.urls,
            "initiator": self.initiator,
        }


class LiveRescale:
    """Rescale the replica set ``client`` (a StatehouseClient, or its ``replicas``) reaches to
    ``to`` replicas without stopping its writers; afterwards ``client`` routes by the new layout.

    ``new_urls``: the URLs of the replicas the move adds (indices N..M-1), each already started
    empty with ``STATEHOUSE_REPLICA_COUNT=M`` and ``STATEHOUSE_TOPOLOGY_VERSION=v+1`` (or above);
    or the whole new set's M URLs in index order (the first ones then name the old replicas).
    ``wait`` bounds each wait: a micro-batch holding prepare, a checkpoint, a load, a replica
    coming back to commit. ``initiator``: who starts the move (``operator``, or a query's
    coordinator), recorded by every replica: a coordinator recovering from a crash aborts only
    its own. Which micro-batch each job's state holds moves with the state (its checkpoint records
    it), so a query meeting the move goes on at the next batch on the new layout.

    ``precopy`` (the default): the bulk of what moves is checkpointed and loaded while writes go
    on everywhere, then what changed meanwhile in up to ``catch_up_rounds`` rounds (fewer when a
    round carries few keys), and only what changed after the last at the cut, frozen
    (docs/rescale.md, "Pre-copy"); without it everything moves at the cut, frozen from the prepare
    to the commit."""

    def __init__(
        self,
        client: StatehouseClient | Replicas,
        to: int | None = None,
        new_urls: list[str] | None = None,
        *,
        wait: float = 300.0,
        progress: Progress | None = None,
        initiator: str = "operator",
        precopy: bool = True,
        catch_up_rounds: int = CATCH_UP_ROUNDS,
    ) -> None:
        self.replicas = client if isinstance(client, Replicas) else client.replicas
        self.to = to
        self.new_urls = [url.rstrip("/") for url in new_urls or []]
        self.wait = wait
        self.progress = progress or (lambda step, info: None)
        self.initiator = initiator
        self.precopy = precopy
        self.catch_up_rounds = catch_up_rounds
        self._connections: dict[str, ReplicaConnection] = {}
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="statehouse-rescale")

    # -- the three entry points ----------------------------------------------------------

    def run(self) -> RescaleReport:
        """The whole move; a pending move of the same target is resumed, another one refused."""
        if self.to is None or self.to < 1:
            raise RescaleFailed("give the new replica count (to >= 1)")
        surveyed = self._survey()
        pending = _pending(surveyed)
        if pending is not None:
            version, count = pending
            if count != self.to:
                raise RescalePending(
                    f"a rescale to {count} replicas (topology version {version}) is pending: finish or abort it "
                    f"(statehouse rescale --resume|--abort) before rescaling to {self.to}"
                )
            return self.resume()
        shown = self.replicas.learn()
        first = shown[0]
        count = first["replica_count"]
        if self.to == count:
            raise RescaleFailed(f"the replica set already has {count} replicas")
        jobs = _jobs(shown)
        for name, parallelism in jobs.items():
            if parallelism < self.to:
                raise RescaleFailed(f"job {name!r} has max_parallelism {parallelism} < {self.to} replicas")
        old_urls = self.replicas.urls
        added = self.to - count
        if len(self.new_urls) == self.to:  # the whole new set: its first ones are the old replicas
            kept = min(count, self.to)
            if self.new_urls[:kept] != old_urls[:kept]:
                raise RescaleFailed(
                    f"the new set's URLs {self.new_urls} must start with the old replicas' {old_urls[:kept]}"
                )
            self.new_urls = self.new_urls[kept:]
        if added > 0 and len(self.new_urls) != added:
            raise NewReplicasMissing(
                f"growing {count} -> {self.to} replicas needs the {added} new replicas' URLs (got "
                f"{len(self.new_urls)}): start them empty with STATEHOUSE_REPLICA_COUNT={self.to}, then give their URLs"
            )
        version = self._free_version(first["version"] + 1)
        move = _Move(old_urls, self.to, version, (old_urls + self.new_urls)[: self.to], jobs, self.initiator)
        self._check_new(move, first["set_id"])
        return self._forward(move, count, time.monotonic())

    def pending(self) -> str | None:
        """None when no move is pending on the replicas; else its decision: "commit", "abort", or
        "undecided"."""
        if _pending(self._survey()) is None:
            return None
        move, _from_count = self._pending_move()
        return self._decision(move) or "undecided"

    def pending_initiator(self) -> str | None:
        """Who started the move pending on the replicas (as they recorded it), or None when none is."""
        shown = self.pending_move_info()
        return None if shown is None else shown.get("initiator", "operator")

    def pending_move_info(self) -> dict[str, Any] | None:
        """The ``move`` some replica's ``GET /v1/topology`` shows pending (its version, count,
        initiator, ...), or None: one round of asking, resolving nothing."""
        return next((s["move"] for s in self._survey().values() if s.get("move")), None)

    def resume(self) -> RescaleReport:
        """Continue the pending move from where the replicas and the decision say it is."""
        started = time.monotonic()
        move, from_count = self._pending_move()
        decision = self._decision(move)
        if decision == "abort":
            return self._abort(move, from_count, started)
        if decision == "commit":
            return self._commit(move, from_count, started, self._recorded_checkpoints(move))
        return self._forward(move, from_count, started)

    def abort(self) -> RescaleReport:
        """Roll the pending move back (refused once commit was decided: resume it instead)."""
        move, from_count = self._pending_move()
        return self._abort(move, from_count, time.monotonic())

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for connection in self._connections.values():
            connection.close()

    # -- steps ----------------------------------------------------------------------------

    def _forward(self, move: _Move, from_count: int, started: float) -> RescaleReport:
        copied: dict[str, dict[str, int]] = {}
        try:
            if self.precopy:
                copied = self._copy(move)
            self._prepare(move)
            if copied:  # a job made during the copy moves too (whole: it has no copy)
                move = self._with_current_jobs(move)
            self.progress("prepared", {"version": move.version, "replicas": move.everyone})
            checkpoints = self._checkpoint(move)
            self.progress("checkpointed", {"checkpoints": checkpoints})
            loaded = self._load_all(move, checkpoints)
            self.progress("loaded", {"loaded": loaded})
        except StatehouseError as exc:
            self._abort(move, from_count, started, failed=exc)
            raise RescaleFailed(
                f"the rescale to {move.count} replicas was aborted (the old layout serves): {exc}"
            ) from exc
        decision = {**move.body, "outcome": "commit", "checkpoints": checkpoints}
        del decision["initiator"]
        if from_count:
            decision["from_count"] = from_count
        try:
            self._call(move.urls[0], "decide", decision)
        except StatehouseError as exc:  # unknown whether it was written (storage down): the record will say
            raise RescaleLeftPending(
                f"the rescale to {move.count} replicas (topology version {move.version}) could not be decided "
                f"({exc.detail}); it stays pending, the moving key groups frozen (their writes wait): once the "
                "checkpoint storage answers, run statehouse rescale --resume (or --abort)"
            ) from exc
        self.progress("decided", {"outcome": "commit", "version": move.version})
        report = self._commit(move, from_count, started, checkpoints)
        report.loaded, report.copied = loaded, copied
        return report

    def _copy(self, move: _Move) -> dict[str, dict[str, int]]:
        """The pre-copy: every replica records the move, nothing frozen, the old ones noting what
        changes in what they give away; a global checkpoint; each replica of the new layout loads
        what it gains from it (what each loaded). A move already past it (resumed) skips it."""
        answers = self._each(move.everyone, lambda url: self._call(url, "prepare", {**move.body, "precopy": True}))
        moves = [answer.get("move") or {} for answer in answers]
        if any(shown.get("phase") != "copying" for shown in moves):
            return {}
        tokens = {
            str(answer["replica_index"]): shown["tracking"]
            for answer, shown in zip(answers, moves, strict=True)
            if shown.get("tracking")
        }
        self.progress("copying", {"version": move.version, "tracking": len(tokens)})
        checkpoints = self._checkpoint(move)
        body = {"version": move.version, "checkpoints": checkpoints, "precopy": tokens}
        answers = self._each(move.urls, lambda url: self._call(url, "load", body))
        copied = {url: _load_totals(answer) for url, answer in zip(move.urls, answers, strict=True)}
        if tokens:
            self._catch_up(move, {**body, "catch_up": True})
        # The loads wrote new files on the old replicas that gain key groups (and writes went on): a
        # checkpoint now uploads them while nothing is frozen, so that the cut's builds on it.
        self._checkpoint(move)
        self.progress("copied", {"checkpoints": checkpoints, "loaded": copied})
        return copied

    def _catch_up(self, move: _Move, body: dict[str, Any]) -> None:
        """Catch-up rounds, writes going on: the old replicas write what changed since the last
        round, the new layout applies it; until a round carries fewer than ``CATCH_UP_KEYS`` keys on
        every old replica (the cut's delta, inside the freeze, then carries about as few), or
        ``catch_up_rounds`` were taken."""
        for round_ in range(self.catch_up_rounds):
            written = self._each(move.old_urls, lambda url: self._call(url, "catch-up", {"version": move.version}))
            self._each(move.urls, lambda url: self._call(url, "load", body))
            keys = [sum(job["keys"] for job in (answer.get("jobs") or {}).values()) for answer in written]
            self.progress("caught up", {"round": round_ + 1, "keys": sum(keys)})
            if max(keys, default=0) < CATCH_UP_KEYS:
                return

    def _with_current_jobs(self, move: _Move) -> _Move:
        """``move`` with every job the old replicas hold now (their ``GET /v1/topology``)."""
        shown = self._each(move.old_urls, lambda url: self._connection(url).json("GET", routes.TOPOLOGY))
        return replace(move, jobs={**move.jobs, **_jobs(shown)})

    def _prepare(self, move: _Move) -> None:
        """Prepare every replica; a micro-batch in flight over a moving key group holds it, retried
        until ``wait``."""
        deadline = time.monotonic() + self.wait
        while True:
            try:
                self._each(move.everyone, lambda url: self._call(url, "prepare", move.body))
                return
            except StatehouseError as exc:
                if exc.code != "batch_in_flight" or time.monotonic() > deadline:
                    raise
                self.progress("waiting", {"for": "batch_in_flight", "detail": exc.detail})
                time.sleep(0.2)

    def _checkpoint(self, move: _Move) -> dict[str, int]:
        """One global checkpoint of every job on the old replicas, the jobs side by side (the cut's
        is inside the freeze: one after the other, a set of many jobs would stay frozen for the sum
        of their round trips)."""
        deadline = time.monotonic() + self.wait
        names = list(move.jobs)
        taken = self._each(names, lambda name: self._checkpoint_job(name, move.jobs[name], move.version, deadline))
        return dict(zip(names, taken, strict=True))

    def _checkpoint_job(self, name: str, parallelism: int, version: int, deadline: float) -> int:
        """One job's global checkpoint. One that fails because checkpoint storage is unavailable (its
        listing, trigger or upload) is taken again, under a new id, until ``deadline``: the step
        waits for storage as the others do, rather than spending the move."""
        old = self.replicas
        coordinator = CheckpointCoordinator(JobClient(old, name, parallelism), timeout=self.wait)
        reported = False
        while True:
            coordinator.timeout = max(1.0, deadline - time.monotonic())  # an upload's wait ends with the step's
            try:
                return coordinator.checkpoint(metadata={"rescale_version": version}).checkpoint_id
            except StatehouseError as exc:
                if not _storage_unavailable(exc) or time.monotonic() >= deadline:
                    raise
                if not reported:  # once per job: what the step waits for
                    reported = True
                    waiting = {"for": "storage_unavailable", "step": "checkpoint", "url": ", ".join(old.urls)}
                    self.progress("waiting", {**waiting, "job": name, "detail": exc.detail})
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def _load_all(self, move: _Move, checkpoints: dict[str, int]) -> dict[str, dict[str, int]]:
        answers = self._each(move.urls, lambda url: self._load(url, move, checkpoints))
        return dict(zip(move.urls, answers, strict=True))

    def _load(self, url: str, move: _Move, checkpoints: dict[str, int]) -> dict[str, int]:
        return _load_totals(self._call(url, "load", {"version": move.version, "checkpoints": checkpoints}))

    def _commit(self, move: _Move, from_count: int, started: float, checkpoints: dict[str, int]) -> RescaleReport:
        """Commit everywhere (decided: forward only). A replica that restarted mid-load is loaded
        again; one that does not answer is waited for until ``wait``, then the move is left for
        :meth:`resume`."""
        loaded: dict[str, dict[str, int]] = {}

        def commit(url: str) -> None:
            for _again in range(3):
                try:
                    self._call(url, "commit", {"version": move.version})
                    return
                except StatehouseError as exc:
                    if exc.code != "rescale_not_loaded":  # a replica restarted mid-load: load it again
                        raise RescaleFailed(
                            f"commit of the rescale to {move.count} replicas was decided, but {url} did not commit "
                            f"({exc}); once it answers, run statehouse rescale --resume"
                        ) from exc
                    loaded[url] = self._load(url, move, checkpoints)
            raise RescaleFailed(f"{url} answered rescale_not_loaded after three loads: see its log")

        self._each(move.everyone, commit)
        self.progress("committed", {"version": move.version, "urls": move.urls})
        ranges = self._verify(move)
        self.replicas.learn()  # the caller's client routes under the new layout from now on
        self.progress("verified", {"ranges": ranges})
        return RescaleReport(
            "committed",
            from_count,
            move.count,
            move.version,
            move.urls,
            checkpoints,
            loaded,
            ranges,
            time.monotonic() - started,
        )

    def _abort(
        self, move: _Move, from_count: int, started: float, failed: StatehouseError | None = None
    ) -> RescaleReport:
        """Abort everywhere. The move is aborted once its decision says so (a replica that did not
        answer undoes it when it does, or at its next start); a decision that cannot be written (its
        storage down) leaves the move pending: :class:`RescaleLeftPending`. ``failed``: the step
        error that made the driver abort, for the message."""
        results = self._each(
            move.everyone, lambda url: self._call(url, "abort", {"version": move.version}), tolerate=True
        )
        if any(result is None for result in results):
            try:
                outcome = self._decision(move)
            except StatehouseError as exc:
                outcome = f"unknown: {exc.detail}"
            if outcome != "abort":
                why = f" after {failed.detail}" if failed is not None else ""
                then = (
                    "it was decided commit: run statehouse rescale --resume"
                    if outcome == "commit"
                    else "once the replicas and the checkpoint storage answer, run statehouse rescale --abort (or "
                    "--resume)"
                )
                raise RescaleLeftPending(
                    f"the rescale to {move.count} replicas (topology version {move.version}) could not be aborted"
                    f"{why} (decision: {outcome or 'none'}); it stays pending, the moving key groups frozen (their "
                    f"writes wait): {then}"
                ) from failed
        self.progress("aborted", {"version": move.version})
        return RescaleReport(
            "aborted", from_count, move.count, move.version, move.old_urls, seconds=time.monotonic() - started
        )

    def _verify(self, move: _Move) -> dict[str, list[list[int]]]:
        """Each replica of the new layout holds each job's range under it, serving; the removed are retired.
        Not key counts: during a live move none is exact (writers run; TTL cleanup still runs in frozen
        key groups, and snapshots leave expired entries out; loaded groups are unserved until the
        commit). docs/operations.md, Rescaling, step 6."""
        shown = {url: self._connection(url).json("GET", routes.TOPOLOGY) for url in move.everyone}
        ranges: dict[str, list[list[int]]] = {name: [] for name in move.jobs}
        for index, url in enumerate(move.urls):
            info = shown[url]
            if (info["replica_index"], info["replica_count"], info["version"]) != (index, move.count, move.version):
                raise RescaleFailed(
                    f"{url} is replica {info['replica_index']} of {info['replica_count']} at version {info['version']} "
                    f"after the commit, not {index} of {move.count} at {move.version}"
                )
            held = {job["job"]: job for job in info["jobs"]}
            for name, parallelism in move.jobs.items():
                owned = KeyGroupRange.for_operator(parallelism, move.count, index)
                job = held.get(name)
                if job is None or job["key_group_range"] != [owned.start, owned.end] or not job["serving"]:
                    raise RescaleFailed(
                        f"job {name!r} on {url} holds {job and job['key_group_range']} (serving: "
                        f"{job and job['serving']}), not [{owned.start}, {owned.end}]"
                    )
                ranges[name].append([owned.start, owned.end])
        for url in move.everyone:
            if url not in move.urls and not shown[url].get("retired"):
                raise RescaleFailed(f"{url} was removed by the rescale but does not report itself retired")
        return ranges

    # -- where a move stands ---------------------------------------------------------------

    def _survey(self) -> dict[str, dict[str, Any]]:
        """``GET /v1/topology`` of every replica the client knows of (its URLs, what they advertise,
        the new URLs given); those that do not answer are left out."""
        asked: dict[str, dict[str, Any]] = {}
        todo = [*self.replicas.urls, *self.replicas.config.urls, *self.new_urls]
        while todo:
            url = todo.pop().rstrip("/")
            if url in asked:
                continue
            try:
                shown = self._connection(url).json("GET", routes.TOPOLOGY)
            except StatehouseError:
                continue
            asked[url] = shown
            todo += shown.get("replica_urls") or []
            todo += (shown.get("move") or {}).get("replica_urls") or []
        return asked

    def _pending_move(self) -> tuple[_Move, int]:
        """The move pending on the replicas, and the replica count it started from."""
        surveyed = self._survey()
        pending = _pending(surveyed)
        if pending is None:
            raise RescaleFailed("no rescale is pending on the replicas (statehouse status shows the layout)")
        version, count = pending
        moves = {url: s for url, s in surveyed.items() if (s.get("move") or {}).get("version") == version}
        set_id = next(iter(moves.values()))["set_id"]
        # The old replicas: those of the set not joining; before their commit they still report the old
        # count (``from_count`` where the replicas record it). Once every one of them committed, only the
        # decision (written before any commit) still says it.
        staying = [s for s in moves.values() if not s["move"].get("joining")]
        from_count = max((s["move"].get("from_count") or s["replica_count"] for s in staying), default=0)
        seed = next(iter(moves))
        if not from_count:
            from_count = int((self._decision_record(seed, version) or {}).get("from_count") or 0)
        old: dict[int, str] = {}
        joining: dict[int, str] = {}
        for url, shown in surveyed.items():
            if shown["set_id"] != set_id:
                continue
            if (shown.get("move") or {}).get("joining"):
                joining[shown["replica_index"]] = url
            elif shown["replica_index"] < from_count:
                old.setdefault(shown["replica_index"], url)
        missing = [i for i in range(from_count) if i not in old]
        old_urls = [old[i] for i in range(from_count) if i in old]
        urls = next((s["move"]["replica_urls"] for s in moves.values() if s["move"].get("replica_urls")), None)
        urls = urls or (self._decision_record(seed, version) or {}).get("replica_urls")
        if not urls:  # neither recorded: the old ones kept, then the new ones given or found joining
            added = self.new_urls or [joining[i] for i in sorted(joining)]
            urls = (old_urls + [u for u in added if u not in old_urls])[:count]
        if len(urls) != count or missing or not from_count:
            raise RescaleFailed(
                f"the pending rescale to {count} replicas (version {version}) from {from_count} knows {len(urls)} "
                f"replica URLs, and old replicas {missing} did not answer: start them, or give every replica's URL "
                "(--urls, --urls-new)"
            )
        jobs: dict[str, int] = {}
        for shown in surveyed.values():
            jobs.update({job["job"]: job["max_parallelism"] for job in shown["jobs"]})
        self._align_client(old_urls)
        initiator = next(iter(moves.values()))["move"].get("initiator", "operator")
        return _Move(old_urls, count, version, [u.rstrip("/") for u in urls], jobs, initiator), from_count

    def _align_client(self, old_urls: list[str]) -> None:
        """The caller's client reaches the old replicas in index order (checkpoints go through it)."""
        if self.replicas.urls != old_urls:
            self.replicas.route_to(old_urls)

    def _decision(self, move: _Move) -> str | None:
        record = self._decision_record(move.everyone[0], move.version)
        return record["outcome"] if record else None

    def _decision_record(self, url: str, version: int) -> dict[str, Any] | None:
        return decision_record(self._connection(url), version)

    def _recorded_checkpoints(self, move: _Move) -> dict[str, int]:
        record = self._decision_record(move.everyone[0], move.version) or {}
        return {name: int(checkpoint) for name, checkpoint in (record.get("checkpoints") or {}).items()}

    def _free_version(self, version: int) -> int:
        """The first version from ``version`` no earlier attempt decided (an aborted v+1 is spent:
        the decision is written once, so the next attempt targets v+2)."""
        seed = self.replicas.urls[0]
        while (record := self._decision_record(seed, version)) is not None:
            if record["outcome"] != "abort":
                raise RescaleFailed(
                    f"topology version {version} was decided {record['outcome']} but the replicas are not at it: "
                    "run statehouse rescale --resume"
                )
            version += 1
        return version

    def _check_new(self, move: _Move, set_id: str) -> None:
        """Each new replica answers, empty, as replica i of M of this set, at a version the move may take."""
        for index in range(len(move.old_urls), move.count):
            url = move.urls[index]
            start = (
                f"start it empty with STATEHOUSE_REPLICA_INDEX={index} STATEHOUSE_REPLICA_COUNT={move.count} "
                f"STATEHOUSE_TOPOLOGY_VERSION={move.version} and the set's checkpoint storage"
            )
            try:
                shown = self._connection(url).json("GET", routes.TOPOLOGY)
            except StatehouseError as exc:
                raise NewReplicasMissing(
                    f"new replica {index} ({url}) does not answer ({exc.detail}): {start}"
                ) from exc
            got = (shown["set_id"], shown["replica_index"], shown["replica_count"])
            if got != (set_id, index, move.count) or shown["jobs"] or shown["version"] > move.version:
                raise NewReplicasMissing(
                    f"{url} is replica {shown['replica_index']} of {shown['replica_count']} of set "
                    f"{shown['set_id']!r} at version {shown['version']} with {len(shown['jobs'])} jobs, not a new "
                    f"empty replica {index} of {move.count} of set {set_id!r}: {start}"
                )

    # -- calls ----------------------------------------------------------------------------

    def _connection(self, url: str) -> ReplicaConnection:
        """An admin connection: loads and commits run long (a read timeout of ``wait``)."""
        url = url.rstrip("/")
        connection = self._connections.get(url)
        if connection is None:
            config = self.replicas.config
            timeout = max(config.timeout, self.wait)
            connection = ReplicaConnection(
                url, token=config.token, timeout=timeout, retries=config.retries, backoff=config.backoff
            )
            self._connections[url] = connection
        return connection

    def _call(self, url: str, step: str, body: dict[str, Any]) -> Any:
        """One step on one replica. A replica that does not answer (restarting: every step is
        idempotent, and a restarted one reports where its move stood) is asked again until ``wait``."""
        deadline = time.monotonic() + self.wait
        reported = False
        while True:
            try:
                return self._connection(url).json("POST", routes.path(routes.TOPOLOGY_STEP, step=step), body)
            except StatehouseError as exc:
                if isinstance(exc, Unavailable) and time.monotonic() < deadline:
                    if not reported:  # once per step and replica: what it waits for (a restart, its storage)
                        reported = True
                        why = exc.code or "unreachable"
                        self.progress("waiting", {"for": why, "step": step, "url": url, "detail": exc.detail})
                    time.sleep(0.5)
                    continue
                raise type(exc)(
                    f"{step} on {url}: {exc.detail}", status=exc.status, code=exc.code, problem=exc.problem
                ) from exc

    def _each(self, items: list[str], call: Callable[[str], Any], *, tolerate: bool = False) -> list[Any]:
        """``call(item)`` for every item (replica URLs, job names) in parallel; the first error
        raised once all ended (none with ``tolerate``)."""
        futures = [self._pool.submit(call, item) for item in items]
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None and not tolerate:
            raise first
        return [None if e is not None else f.result() for f, e in zip(futures, errors, strict=True)]

    def __enter__(self) -> LiveRescale:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _load_totals(answer: dict[str, Any] | None) -> dict[str, int]:
    """What one replica's load answered, summed over its jobs."""
    jobs = (answer or {}).get("jobs", {}).values()
    return {field: sum(j.get(field, 0) for j in jobs) for field in ("bytes_read", "entries", "delta_keys")}


def _storage_unavailable(exc: BaseException) -> bool:
    """Whether a failed checkpoint failed because checkpoint storage did not answer: a replica's
    503 ``storage_unavailable`` (a listing, a trigger), or a part whose upload failed so (its error
    names the server's ``StorageUnavailable``), anywhere in the chain of causes."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, StatehouseError) and seen.code == "storage_unavailable":
            return True
        if "StorageUnavailable:" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def decision_record(connection: ReplicaConnection, version: int) -> dict[str, Any] | None:
    """The durable decision of the move to topology ``version`` (``GET /v1/topology/decision``), or
    None while undecided."""
    try:
        return connection.json("GET", f"{routes.TOPOLOGY_DECISION}?version={version}")
    except NotFound:
        return None


def _pending(surveyed: dict[str, dict[str, Any]]) -> tuple[int, int] | None:
    """(version, replica count) of the move some replica records as pending, if any."""
    for shown in surveyed.values():
        move = shown.get("move")
        if move:
            return move["version"], move["replica_count"]
    return None


def _jobs(shown: list[dict[str, Any]]) -> dict[str, int]:
    return {job["job"]: job["max_parallelism"] for info in shown for job in info["jobs"]}
