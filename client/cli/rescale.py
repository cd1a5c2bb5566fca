"""``statehouse rescale --to M``: rescale the replica set to M replicas live, while writers run
(docs/operations.md, Rescaling): prepare every replica (the key groups that move freeze; writes to
them wait), one checkpoint of every job, load on the new layout, the durable decision, commit
everywhere, verify. New replicas must be running first, empty, with STATEHOUSE_REPLICA_COUNT=M and
STATEHOUSE_TOPOLOGY_VERSION=v+1: give their URLs with --urls-new (or a STATEHOUSE_REPLICA_URLS
template with {index}); a set run by `statehouse serve` is grown (new replicas started before the
move) and shrunk (removed replicas stopped after it) by the command itself. Every job of the set
moves. M is checked first (1 <= M <= every job's max_parallelism); a refused command starts and
changes nothing. A move a dead coordinator left is finished with --resume (forward once commit was
decided) or rolled back with --abort (before that); a move left pending exits 4 with what to do
first. --resume with no move pending (one a restarted replica finished, say) says where the set
stands and exits 0.

With --offline, the earlier procedure: ``statehouse rescale JOB|--all --to M --offline``. For each
job: refuse while a micro-batch commit is under way, fence the writers (a
running Spark query's next write is refused), count its keys, take a savepoint; then the set
restarts with M replicas adopting the new layout — by itself when ``statehouse serve`` runs it,
otherwise the command prints what to do and exits 4, to be run again with ``--resume`` — and every
job is restored on the new set and verified: each replica's key-group range, and every state's key
count (default namespace) equal to the savepoint's. The plan (savepoint id, counts) is kept in the
--plan file until the rescale is verified, so a resumed or repeated run picks up where it stopped.
Restart the writers with the new URLs afterwards."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from statehouse.client.cli.common import (
    EXIT_OPERATOR,
    CommandError,
    connection_options,
    emit,
    job_client,
    job_names,
    note,
    open_client,
    waiting,
)
from statehouse.client.cli.serve import read_state, state_path
from statehouse.client.client import StatehouseClient
from statehouse.client.coordinator import CheckpointCoordinator
from statehouse.client.errors import StatehouseError, Unavailable
from statehouse.client.job import JobClient
from statehouse.client.paging import listing
from statehouse.client.replicas import serving
from statehouse.client.rescale import (
    LiveRescale,
    NewReplicasMissing,
    RescaleFailed,
    RescaleLeftPending,
    RescalePending,
    RescaleReport,
    decision_record,
)
from statehouse.protocol import routes
from statehouse.protocol.keygroups import KeyGroupRange

HELP = "rescale the replica set to another replica count, live (or --offline)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", nargs="?", help="--offline: the job to move (or --all); live, every job moves")
    parser.add_argument("--all", action="store_true", help="--offline: every job of the replica set")
    parser.add_argument("--to", type=int, metavar="M", help="the new replica count")
    parser.add_argument(
        "--urls-new",
        default="",
        help="the new replicas' URLs (indices N..M-1, or the whole new set's), comma-separated; default: "
        "$STATEHOUSE_REPLICA_URLS when it is a template with {index}",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="finish the pending live move (forward if commit was decided); --offline: continue the plan once "
        "the set runs with M replicas",
    )
    parser.add_argument("--abort", action="store_true", help="roll the pending live move back (before commit)")
    parser.add_argument("--offline", action="store_true", help="the offline procedure: fence, savepoint, restart")
    parser.add_argument(
        "--plan",
        default="statehouse-rescale.json",
        help="--offline: where the plan is kept (default ./statehouse-rescale.json)",
    )
    parser.add_argument(
        "--serve-dir",
        help="the --dir of the `statehouse serve` running the set: grown or restarted with M replicas, fitted to the "
        "layout that serves after the move (default: . when its statehouse-serve.json lists one of the --urls)",
    )
    parser.add_argument("--wait", type=float, default=300.0, help="seconds to wait for savepoints and restarts")
    parser.add_argument(
        "--no-precopy",
        dest="precopy",
        action="store_false",
        help="live: move everything at the cut (frozen from prepare to commit) instead of pre-copying the bulk while "
        "writes go on",
    )
    connection_options(parser)


def run(args: argparse.Namespace) -> int:
    if args.resume and args.abort:
        raise CommandError("give --resume or --abort, not both", 2)
    if args.offline or (args.resume and Path(args.plan).exists()):  # a plan file: an offline rescale's
        return _offline(args)
    return _live(args)


def _live(args: argparse.Namespace) -> int:
    """The live rescale (client/rescale.py), its progress a line per step on stderr. A new move's
    target is checked before anything starts (a `statehouse serve` set is grown only for a move
    that will run); whatever the outcome, such a set is then fitted to the layout that serves."""
    if not (args.resume or args.abort):
        _check_count(args.to)
    with open_client(args) as sh:
        new_urls = [u.strip() for u in args.urls_new.split(",") if u.strip()]
        if args.resume or args.abort:
            serve_dir = _managed(args, sh.replicas.urls)
            pending = pending_target(sh)
            if pending is None:
                return _nothing_pending(args, sh, serve_dir)
            since = pending[0]
        else:
            serve_dir, new_urls, since = _before_move(args, sh, new_urls)
        try:
            report = _drive(args, sh, new_urls, since)
        except Exception:
            if serve_dir is not None:
                with contextlib.suppress(Exception):  # the move's own error is the one line to show
                    _fit_serve(args, serve_dir)
            raise
    if serve_dir is not None:
        _fit_serve(args, serve_dir)
    document = {"status": "done" if report.outcome == "committed" else "aborted", **report.to_json()}
    if report.outcome == "committed":
        lines = [
            f"rescaled {report.from_count} -> {report.to_count} replicas live (topology version {report.version}) "
            f"in {report.seconds:.1f}s, verified:"
        ]
        lines += [f"  {name}: ranges {ranges}" for name, ranges in report.ranges.items()]
        lines += [
            f"  {url}: loaded {b['bytes_read']} bytes, {b['entries']} entries" for url, b in report.loaded.items()
        ]
        lines.append(f"STATEHOUSE_URLS={','.join(report.urls)}")
    else:
        lines = [
            f"the rescale to {report.to_count} replicas (version {report.version}) was aborted: the old layout serves"
        ]
    emit(args, document, lines)
    return 0


def pending_target(sh: StatehouseClient) -> tuple[int, int] | None:
    """(topology version, replica count) of the move some replica of the set records as pending,
    or None: asked before anything starts (:meth:`LiveRescale.run` resumes a pending move of the
    same count and refuses another) and after a move, to tell a finished one from one left."""
    with LiveRescale(sh) as driver:
        move = driver.pending_move_info()
    return None if move is None else (move["version"], move["replica_count"])


def _check_count(to: int | None) -> None:
    """The target replica count as given: present and at least 1."""
    if to is None:
        raise CommandError("give the new replica count with --to M", 2)
    if to < 1:
        raise CommandError(f"--to {to}: M must be >= 1 (the replica count after the rescale)", 2)


def _check_parallelism(to: int, jobs: dict[str, int]) -> None:
    """Every job's key groups can spread over ``to`` replicas: ``to`` <= its max_parallelism."""
    for name, parallelism in sorted(jobs.items(), key=lambda item: (item[1], item[0])):
        if parallelism < to:
            raise CommandError(
                f"--to {to}: job {name!r} has max_parallelism {parallelism}, so it cannot be spread over more than "
                f"{parallelism} replicas (M must be <= every job's max_parallelism)",
                2,
            )


def _before_move(
    args: argparse.Namespace, sh: StatehouseClient, new_urls: list[str]
) -> tuple[Path | None, list[str], int]:
    """What a new move needs before it starts: its target checked against the set, and the replicas
    it adds (a `statehouse serve` set starts them). Nothing is started for a move that will not run:
    a move pending on the replicas is left to :meth:`LiveRescale.run` (the same target resumed,
    another refused: exit 4). The serve directory (if a serve runs the set), the new URLs, and the
    first topology version the move may take."""
    pending = pending_target(sh)
    if pending is not None:
        return _managed(args, sh.replicas.urls), new_urls, pending[0]
    shown = sh.topology()
    count, version = shown[0]["replica_count"], shown[0]["version"]
    if args.to == count:
        raise CommandError(f"the replica set already has {count} replicas")
    _check_parallelism(args.to, {job["job"]: job["max_parallelism"] for info in shown for job in info["jobs"]})
    serve_dir = _managed(args, sh.replicas.urls)
    if args.to > count and not new_urls:
        if serve_dir is not None:
            directory = serve_dir
            new_urls = waiting(
                args,
                f"starting {args.to - count} new replicas",
                lambda: _change(args, directory, "grow", args.to, version + 1, committed=version),
            )[count:]
        else:
            new_urls = _templated(count, args.to)
    return serve_dir, new_urls, version + 1


def _drive(args: argparse.Namespace, sh: StatehouseClient, new_urls: list[str], since: int) -> RescaleReport:
    """Run, resume or abort the move (at topology version ``since`` or above); a move left
    unfinished exits 4 with what to do next."""

    def progress(step: str, info: dict[str, Any]) -> None:
        if step == "waiting" and info["for"] == "batch_in_flight":
            note(args, f"waiting for a micro-batch to end: {info['detail']}")
        elif step == "waiting":
            note(args, f"waiting ({info['for']}) for {info['step']} on {info['url']}: {info['detail']}")
        else:
            note(args, f"{step}: {_summary(step, info)}")

    with LiveRescale(sh, args.to, new_urls, wait=args.wait, progress=progress, precopy=args.precopy) as move:
        try:
            if args.abort:
                return move.abort()
            if args.resume:
                return move.resume()
            return move.run()
        except (RescalePending, NewReplicasMissing, RescaleLeftPending) as exc:
            raise CommandError(exc.detail, EXIT_OPERATOR) from None
        except Unavailable as exc:
            if exc.code != "storage_unavailable":
                raise
            # Reading where the move stands (its decision) needs the storage: nothing was changed.
            raise CommandError(
                f"{exc.detail}: the rescale is where it was; run the command again once checkpoint storage answers",
                EXIT_OPERATOR,
            ) from None
        except RescaleFailed as exc:
            # Unfinished: still pending on a replica that answers, or decided commit with a replica
            # that did not commit (it commits itself when it restarts, or --resume does). The
            # message says what to do first, then --resume.
            if pending_target(sh) is not None or _decided_commit(sh, since):
                raise CommandError(exc.detail, EXIT_OPERATOR) from None
            raise


def _nothing_pending(args: argparse.Namespace, sh: StatehouseClient, serve_dir: Path | None) -> int:
    """--resume or --abort with no move pending on the replicas: say where the set stands. A move
    can end without the command (a replica restarted after a decided commit commits itself, one
    after an abort aborts itself), so --resume of a move that finished, or --abort of one that was
    aborted, says so and exits 0; --abort with nothing to abort exits 1."""
    shown = sh.topology()
    count, version = shown[0]["replica_count"], shown[0]["version"]
    if serve_dir is not None:
        _fit_serve(args, serve_dir)
    made, aborted = _last_moves(sh, version)
    layout = f"the set serves topology version {version} with {count} replicas"
    document: dict[str, Any] = {"version": version, "replicas": count, "urls": sh.replicas.urls}
    if aborted is not None:
        document |= {"status": "aborted", "aborted": aborted}
        count_to = aborted["replica_count"]
        to = (
            f"{count_to} replicas (topology version {aborted['version']})"
            if count_to
            else f"topology version {aborted['version']}"
        )
        line = f"the rescale to {to} was aborted: {layout}"
    elif args.abort:
        raise CommandError(f"no rescale is pending, nothing to abort: {layout}")
    elif made is not None:
        document |= {"status": "done", "from": made.get("from_count"), "to": count}
        moved = f"{made.get('from_count') or '?'} -> {count} replicas (topology version {version})"
        line = f"the rescale {moved} is done: nothing to resume, the set serves it"
    else:
        document["status"] = "nothing_pending"
        line = f"no rescale is pending: {layout}"
    emit(args, document, [line, f"STATEHOUSE_URLS={','.join(sh.replicas.urls)}"])
    return 0


def _last_moves(sh: StatehouseClient, version: int) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The decision of the live move that made topology ``version``, if one did, and the last
    attempt decided abort after it, if any. None for either when the decisions cannot be read."""
    try:
        made = decision_record(sh.replicas[0], version)
        later = _decisions(sh, version + 1)
    except StatehouseError:
        return None, None
    aborted = [record for record in later if record["outcome"] == "abort"]
    return (made if made is not None and made["outcome"] == "commit" else None), (aborted[-1] if aborted else None)


def _decisions(sh: StatehouseClient, since: int) -> list[dict[str, Any]]:
    """The decisions of the moves to topology ``since``, ``since + 1``, ... up to the first version
    none was decided for (an aborted attempt spends its version: the next one takes the next)."""
    records: list[dict[str, Any]] = []
    while (record := decision_record(sh.replicas[0], since + len(records))) is not None:
        records.append(record)
    return records


def _decided_commit(sh: StatehouseClient, since: int) -> bool:
    """Whether the last move decided at topology ``since`` or above was decided commit."""
    try:
        decided = _decisions(sh, since)
    except StatehouseError:
        return False
    return bool(decided) and decided[-1]["outcome"] == "commit"


def _fit_serve(args: argparse.Namespace, directory: Path) -> None:
    """Fit the ``serve`` in ``directory`` to the layout that serves: stop (and move the data aside
    of) its replicas from the serving count on — those a committed shrink retired, those an
    aborted grow left unassigned — so that its processes and statehouse-serve.json name the
    serving replicas only. Left as it is while a move is pending: a resume needs every replica."""
    state = read_state(directory)
    if state is None or state.get("status") != "ready":
        return
    urls: list[str] = list(state["urls"])
    with StatehouseClient(urls, token=args.token, timeout=args.timeout) as sh:
        if pending_target(sh) is not None:
            return
        shown = [sh.replicas.connection(url).json("GET", routes.TOPOLOGY) for url in urls]
    serving_ones = [info for info in shown if serving(info)]
    if not serving_ones:
        return
    version = max(info["version"] for info in serving_ones)
    count = next(info["replica_count"] for info in serving_ones if info["version"] == version)
    # serve runs replica i on its i-th URL: the serving layout is the first ``count`` of them
    if count < len(urls) and all(serving(info) for info in shown[:count]):
        waiting(
            args,
            f"stopping replicas {count}..{len(urls) - 1} (not in the layout that serves)",
            lambda: _change(args, directory, "shrink", count, version),
        )


def _summary(step: str, info: dict[str, Any]) -> str:
    if step == "checkpointed":
        return ", ".join(f"{job} checkpoint {c}" for job, c in info["checkpoints"].items()) or "no jobs"
    if step in ("loaded", "copied"):
        return ", ".join(f"{url} {b['bytes_read']} bytes" for url, b in info["loaded"].items())
    if step == "caught up":
        return f"round {info['round']}: {info['keys']} keys changed meanwhile, applied on the new layout"
    if step == "copying":
        return f"topology version {info['version']}, nothing frozen: the bulk moves while writes go on"
    if step == "verified":
        return ", ".join(f"{job} {ranges}" for job, ranges in info["ranges"].items()) or "no jobs"
    return f"topology version {info.get('version', '?')}"


def _templated(count: int, to: int) -> list[str]:
    """The new replicas' URLs from a STATEHOUSE_REPLICA_URLS template (``{index}``), else none."""
    template = os.environ.get("STATEHOUSE_REPLICA_URLS", "")
    if "{index}" not in template:
        return []
    return [template.replace("{index}", str(i)) for i in range(count, to)]


def _change(
    args: argparse.Namespace, directory: Path, action: str, count: int, version: int, *, committed: int | None = None
) -> list[str]:
    """Ask the ``serve`` in ``directory`` to grow its set to ``count`` replicas (new ones at topology
    ``version``; ``committed``: the version that serves, which names the data of replicas it has to
    stop again) or shrink it (``version``: the version that serves); wait until it has."""
    request = {"request": action, "requested_replicas": count, "requested_version": version}
    return _ask_serve(args, directory, {**request, "committed_version": committed or version})


def _offline(args: argparse.Namespace) -> int:
    plan_path = Path(args.plan)
    if args.resume:
        resumed = _read_plan(plan_path)
        return _finish(args, resumed, plan_path, resumed["urls_hint"])
    _check_count(args.to)
    if bool(args.job) == bool(args.all):
        raise CommandError("name one job, or give --all", 2)
    with open_client(args) as sh:
        shown = sh.topology()
        count, version = shown[0]["replica_count"], shown[0]["version"]
        if args.to == count:
            raise CommandError(f"the replica set already has {count} replicas")
        names = job_names(shown) if args.all else [args.job]
        jobs = {name: job_client(sh, name, shown) for name in names}
        _check_parallelism(args.to, {name: job.max_parallelism for name, job in jobs.items()})
        checkpoint_id = max(CheckpointCoordinator(job).next_id() for job in jobs.values()) if jobs else 1
        plan: dict[str, Any] = {
            "set_id": shown[0]["set_id"],
            "from": count,
            "to": args.to,
            "version": version,
            "savepoint": checkpoint_id,
            "jobs": {},
            "urls_hint": sh.replicas.urls,
        }
        for name, job in jobs.items():
            plan["jobs"][name] = _savepoint(args, job, checkpoint_id)
    _write_plan(plan_path, plan)
    serve_dir = _managed(args, plan["urls_hint"])
    if serve_dir is None:
        version = plan["version"] + 1
        steps = (
            f"restart the replica set with STATEHOUSE_REPLICA_COUNT={args.to} STATEHOUSE_ADOPT_TOPOLOGY=1 "
            f"STATEHOUSE_TOPOLOGY_VERSION={version} (Helm: helm upgrade ... --reuse-values "
            f"--set replicaCount={args.to} "
            f"--set adoptTopology=true --set topologyVersion={version} --wait), then run: statehouse rescale --resume "
            f"--plan {plan_path} --urls <the new replicas' URLs>"
        )
        emit(
            args, {"status": "restart_needed", "plan": plan, "next": steps}, [f"savepoint {checkpoint_id} taken", steps]
        )
        return EXIT_OPERATOR
    urls = waiting(
        args, f"restarting the set with {args.to} replicas", lambda: _restart(args, serve_dir, plan["version"] + 1)
    )
    args.urls = ",".join(urls)
    return _finish(args, plan, plan_path, urls)


def _savepoint(args: argparse.Namespace, job: JobClient, checkpoint_id: int) -> dict[str, Any]:
    """Fence the job's writers and take its savepoint; what the restore is checked against."""
    committed = job.committed_epochs()
    if len(set(committed)) > 1:
        raise CommandError(
            f"job {job.name!r}: a micro-batch commit is under way (committed epochs per replica: {committed}); "
            f"let it finish (or stop the query), then run again"
        )
    epoch = job.fence(job.epoch() + 1)
    after = job.committed_epochs()
    if after != committed:  # a commit landed between the check and the fence on some replicas
        raise CommandError(f"job {job.name!r}: a micro-batch committed while fencing ({after}); run again")
    keys = _key_counts(job)
    note(args, f"job {job.name}: writers fenced at epoch {epoch}; {sum(keys.values())} keys in {len(keys)} states")
    coordinator = CheckpointCoordinator(job, timeout=args.wait)
    metadata = {"rescale_to": args.to, "epoch": max(after)}  # what the micro-batch coordinator anchors on
    waiting(
        args,
        f"savepoint {checkpoint_id} of job {job.name}",
        lambda: coordinator.savepoint(checkpoint_id, metadata=metadata),
    )
    return {"max_parallelism": job.max_parallelism, "keys": keys}


def _key_counts(job: JobClient) -> dict[str, int]:
    """Per keyed state, its keys in the default namespace over every replica."""
    states = sorted({state for info in job.infos() for state in info["states"]})
    counts = dict.fromkeys(states, 0)
    for state in states:
        for replica in job.replicas:
            for page in listing(replica, routes.path(routes.STATE_KEYS, job=job.name, state=state)):
                counts[state] += len(page["items"])
    return counts


def _managed(args: argparse.Namespace, urls: list[str]) -> Path | None:
    """The directory of the ``statehouse serve`` running this set, if one does."""
    directory = Path(args.serve_dir or ".")
    state = read_state(directory)
    if state is None or state.get("status") != "ready":
        if args.serve_dir:
            raise CommandError(f"no running `statehouse serve` in {directory} ({state_path(directory)} is missing)")
        return None
    if not args.serve_dir and not {u.rstrip("/") for u in state["urls"]} & {u.rstrip("/") for u in urls}:
        return None
    return directory


def _restart(args: argparse.Namespace, directory: Path, version: int) -> list[str]:
    """Ask the ``serve`` in ``directory`` to restart the set with ``args.to`` replicas at topology
    ``version`` (SIGHUP), and wait until it reports them ready."""
    return _ask_serve(
        args, directory, {"request": "restart", "requested_replicas": args.to, "requested_version": version}
    )


def _ask_serve(args: argparse.Namespace, directory: Path, request: dict[str, Any]) -> list[str]:
    """Hand the ``serve`` in ``directory`` a request in its state file (SIGHUP), and wait until it
    reports the set ready with the requested replica count; the set's URLs."""
    state = {k: v for k, v in (read_state(directory) or {}).items() if k != "failed"}
    path = state_path(directory)
    temporary = path.with_suffix(".request")
    temporary.write_text(json.dumps({**state, **request, "status": "requested"}))
    os.replace(temporary, path)
    os.kill(int(state["pid"]), signal.SIGHUP)
    count = request["requested_replicas"]
    # serve ends every change itself, ready or failed, within its own start timeout per replica it
    # starts and a drain per one it stops: waited for in full, so the set is never left mid-change.
    bound = float(state.get("start_timeout") or 60) * (count + 1) + 35 * int(state.get("replicas") or 0)
    wait = max(args.wait, bound)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        now = read_state(directory)
        if now is None:
            raise CommandError(f"`statehouse serve` in {directory} stopped while changing the set")
        if now.get("status") == "ready" and now.get("failed"):  # back as it was: nothing changed
            raise CommandError(now["failed"])
        if now.get("status") == "ready" and now.get("replicas") == count:
            return list(now["urls"])
        time.sleep(0.2)
    raise CommandError(f"the set did not come up with {count} replicas within {wait:.0f}s: see the replicas' logs")


def _finish(args: argparse.Namespace, plan: dict[str, Any], plan_path: Path, urls: list[str]) -> int:
    """Restore every job of the plan on the new set, verify it, and drop the plan."""
    if not args.urls:
        args.urls = ",".join(urls)
    with open_client(args) as sh:
        shown = sh.topology()
        first = shown[0]
        if (
            first["set_id"] != plan["set_id"]
            or first["replica_count"] != plan["to"]
            or first["version"] <= plan["version"]
        ):
            raise CommandError(
                f"the replicas are {first['replica_count']} of set {first['set_id']!r} at topology version "
                f"{first['version']}; the plan needs {plan['to']} of {plan['set_id']!r} above version "
                f"{plan['version']}: "
                f"restart them with STATEHOUSE_REPLICA_COUNT={plan['to']} STATEHOUSE_ADOPT_TOPOLOGY=1 "
                f"STATEHOUSE_TOPOLOGY_VERSION={plan['version'] + 1}",
                EXIT_OPERATOR,
            )
        results = {}
        for name, expected in plan["jobs"].items():
            job = JobClient(sh.replicas, name, expected["max_parallelism"])
            restore = functools.partial(CheckpointCoordinator(job, timeout=args.wait).restore, plan["savepoint"])
            waiting(args, f"restore of job {name}", restore)
            results[name] = _verify(sh, job, expected)
    plan_path.unlink(missing_ok=True)
    document = {
        "status": "done",
        "from": plan["from"],
        "to": plan["to"],
        "savepoint": plan["savepoint"],
        "jobs": results,
    }
    document["urls"] = sh.replicas.urls
    lines = [f"rescaled {plan['from']} -> {plan['to']} replicas from savepoint {plan['savepoint']}, verified:"]
    lines += [f"  {name}: ranges {r['key_group_ranges']}, keys {r['keys']}" for name, r in results.items()]
    lines.append(f"restart the writers with STATEHOUSE_URLS={','.join(sh.replicas.urls)}")
    emit(args, document, lines)
    return 0


def _verify(sh: StatehouseClient, job: JobClient, expected: dict[str, Any]) -> dict[str, Any]:
    """Each replica holds exactly its range of the new layout, and the key counts are the savepoint's."""
    count = len(sh.replicas)
    ranges = []
    for index, info in enumerate(job.infos()):
        owned = KeyGroupRange.for_operator(job.max_parallelism, count, index)
        got = info["key_group_range"]
        if (info["replica_index"], info["replica_count"], got) != (index, count, [owned.start, owned.end]):
            raise CommandError(
                f"job {job.name!r} on {sh.replicas[index].url} is replica {info['replica_index']} of "
                f"{info['replica_count']} with key groups {got}, not {index} of {count} with {[owned.start, owned.end]}"
            )
        ranges.append(got)
    keys = _key_counts(job)
    if keys != expected["keys"]:
        raise CommandError(
            f"job {job.name!r}: key counts {keys} after the restore, {expected['keys']} in the savepoint"
        )
    return {"key_group_ranges": ranges, "keys": keys}


def _write_plan(path: Path, plan: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(plan, indent=1))
    os.replace(temporary, path)


def _read_plan(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CommandError(f"no rescale plan at {path}: start the rescale without --resume", 2) from None
    except (OSError, ValueError) as exc:
        raise CommandError(f"the rescale plan {path} cannot be read: {exc}") from None
