"""``statehouse rescale --to M``: rescale the replica set to M replicas live, while writers run
(docs/operations.md, Rescaling): prepare every replica (the key groups that move freeze; writes to
them wait), one checkpoint of every job, load on the new layout, the durable decision, commit
everywhere, verify. New replicas must be running first, empty, with STATEHOUSE_REPLICA_COUNT=M and
STATEHOUSE_TOPOLOGY_VERSION=v+1: give their URLs with --urls-new (or a STATEHOUSE_REPLICA_URLS
template with {index}); a set run by `statehouse serve` is grown (new replicas started before the
move) and shrunk (removed replicas stopped after it) by the command itself. Every job of the set
moves. A move a dead coordinator left is finished with --resume (forward once commit was decided)
or rolled back with --abort (before that).

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
from statehouse.client.errors import Unavailable
from statehouse.client.job import JobClient
from statehouse.client.rescale import (
    LiveRescale,
    NewReplicasMissing,
    RescaleFailed,
    RescaleLeftPending,
    RescalePending,
)
from statehouse.keygroups import KeyGroupRange

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
        help="the --dir of the `statehouse serve` running the set: restart it with M replicas (default: . when "
        "its statehouse-serve.json lists the same URLs)",
    )
    parser.add_argument("--wait", type=float, default=300.0, help="seconds to wait for savepoints and restarts")
    connection_options(parser)


def run(args: argparse.Namespace) -> int:
    if args.resume and args.abort:
        raise CommandError("give --resume or --abort, not both", 2)
    if args.offline or (args.resume and Path(args.plan).exists()):  # a plan file: an offline rescale's
        return _offline(args)
    return _live(args)


def _live(args: argparse.Namespace) -> int:
    """The live rescale (client/rescale.py), its progress a line per step on stderr."""
    if not (args.resume or args.abort) and (args.to is None or args.to < 1):
        raise CommandError("give the new replica count with --to M", 2)

    def progress(step: str, info: dict[str, Any]) -> None:
        if step == "waiting" and info["for"] == "batch_in_flight":
            note(args, f"waiting for a micro-batch to end: {info['detail']}")
        elif step == "waiting":
            note(args, f"waiting ({info['for']}) for {info['step']} on {info['url']}: {info['detail']}")
        else:
            note(args, f"{step}: {_summary(step, info)}")

    with open_client(args) as sh:
        new_urls = [u.strip() for u in args.urls_new.split(",") if u.strip()]
        serve_dir = None
        if not (args.resume or args.abort):
            shown = sh.topology()
            count, version = shown[0]["replica_count"], shown[0]["version"]
            serve_dir = _managed(args, sh.replicas.urls)
            if args.to > count and not new_urls:
                if serve_dir is not None:
                    new_urls = waiting(
                        args,
                        f"starting {args.to - count} new replicas",
                        lambda: _change(args, serve_dir, "grow", args.to, version + 1),
                    )[count:]
                else:
                    new_urls = _templated(count, args.to)
        with LiveRescale(sh, args.to, new_urls, wait=args.wait, progress=progress) as move:
            try:
                if args.abort:
                    report = move.abort()
                elif args.resume:
                    report = move.resume()
                else:
                    report = move.run()
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
            except RescaleFailed:
                if serve_dir is not None and args.to > count and move.pending() is None:
                    _change(args, serve_dir, "shrink", count, None)  # aborted: the added replicas go
                raise
    if serve_dir is not None and report.outcome == "committed" and report.to_count < report.from_count:
        _change(args, serve_dir, "shrink", report.to_count, report.version)
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


def _summary(step: str, info: dict[str, Any]) -> str:
    if step == "checkpointed":
        return ", ".join(f"{job} checkpoint {c}" for job, c in info["checkpoints"].items()) or "no jobs"
    if step == "loaded":
        return ", ".join(f"{url} {b['bytes_read']} bytes" for url, b in info["loaded"].items())
    if step == "verified":
        return ", ".join(f"{job} {ranges}" for job, ranges in info["ranges"].items()) or "no jobs"
    return f"topology version {info.get('version', '?')}"


def _templated(count: int, to: int) -> list[str]:
    """The new replicas' URLs from a STATEHOUSE_REPLICA_URLS template (``{index}``), else none."""
    template = os.environ.get("STATEHOUSE_REPLICA_URLS", "")
    if "{index}" not in template:
        return []
    return [template.replace("{index}", str(i)) for i in range(count, to)]


def _change(args: argparse.Namespace, directory: Path, action: str, count: int, version: int | None) -> list[str]:
    """Ask the ``serve`` in ``directory`` to grow or shrink its set (SIGHUP); wait until it has."""
    return _ask_serve(args, directory, {"request": action, "requested_replicas": count, "requested_version": version})


def _offline(args: argparse.Namespace) -> int:
    plan_path = Path(args.plan)
    if args.resume:
        resumed = _read_plan(plan_path)
        return _finish(args, resumed, plan_path, resumed["urls_hint"])
    if args.to is None or args.to < 1:
        raise CommandError("give the new replica count with --to M", 2)
    if bool(args.job) == bool(args.all):
        raise CommandError("name one job, or give --all", 2)
    with open_client(args) as sh:
        shown = sh.topology()
        count, version = shown[0]["replica_count"], shown[0]["version"]
        if args.to == count:
            raise CommandError(f"the replica set already has {count} replicas")
        names = job_names(shown) if args.all else [args.job]
        jobs = {name: job_client(sh, name, shown) for name in names}
        for name, job in jobs.items():
            if job.max_parallelism < args.to:
                raise CommandError(f"job {name!r} has max_parallelism {job.max_parallelism} < {args.to} replicas")
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
            cursor = None
            while True:
                params: dict[str, Any] = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
                page = json.loads(
                    replica.request(
                        "GET", f"/v1/jobs/{job.name}/states/{state}/keys", idempotent=True, params=params
                    ).content
                )
                counts[state] += len(page["items"])
                cursor = page["next_cursor"]
                if cursor is None:
                    break
    return counts


def _managed(args: argparse.Namespace, urls: list[str]) -> Path | None:
    """The directory of the ``statehouse serve`` running this set, if one does."""
    directory = Path(args.serve_dir or ".")
    state = read_state(directory)
    if state is None or state.get("status") != "ready":
        if args.serve_dir:
            raise CommandError(f"no running `statehouse serve` in {directory} ({state_path(directory)} is missing)")
        return None
    if not args.serve_dir and sorted(state["urls"]) != sorted(urls):
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
    state = read_state(directory) or {}
    path = state_path(directory)
    temporary = path.with_suffix(".request")
    temporary.write_text(json.dumps({**state, **request, "status": "requested"}))
    os.replace(temporary, path)
    os.kill(int(state["pid"]), signal.SIGHUP)
    count = request["requested_replicas"]
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        now = read_state(directory)
        if now is None:
            raise CommandError(f"`statehouse serve` in {directory} stopped while changing the set")
        if now.get("status") == "ready" and now.get("replicas") == count:
            return list(now["urls"])
        time.sleep(0.2)
    raise CommandError(f"the set did not come up with {count} replicas within {args.wait:.0f}s: see the replicas' logs")


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
