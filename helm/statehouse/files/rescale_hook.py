"""The chart's rescale hook: `helm upgrade --set replicaCount=M` rescales the replica set live.

Two hook Jobs of the chart (templates/rescale-hooks.yaml) run this from the Statehouse image, with
``python -c``. ``pre`` runs before Helm changes the StatefulSet: a shrink moves the state off the
replicas it removes while they still run. ``post`` runs after it: a grow moves state onto the new
pods, which start empty (they join the set at the move's topology version). Each asks the set
where it stands (``statehouse status``) and runs ``statehouse rescale --to M`` when its phase has a
move to make, or a move to M is pending (it is resumed). When the set already has M replicas it
changes nothing and exits 0, so a re-run, or an upgrade that keeps ``replicaCount``, is a no-op.
A failed move exits non-zero with the CLI's own one-line message last in the log (the Job's
``helm.sh/hook-output-log-policy`` has Helm print it).

The environment, rendered by the chart:

- ``STATEHOUSE_URLS``: the seed, replica 0 through the headless Service (the replicas advertise
  the others: ``STATEHOUSE_REPLICA_URLS``);
- ``RESCALE_PHASE``: ``pre`` or ``post``; ``RESCALE_TO``: M, the release's ``replicaCount``;
- ``RESCALE_URLS``: the M replicas' URLs in index order (a grow's whole new set);
- ``RESCALE_WAIT``: seconds, ``statehouse rescale --wait`` and how long a grow waits for its new pods;
- ``RESCALE_SHARED_STORAGE``: ``true`` when every replica reads the same checkpoint storage (S3);
- ``RESCALE_STATEFULSET_REPLICAS``: the StatefulSet's replicas when the chart was rendered (Helm's
  ``lookup``; empty offline): with no replica answering, the same count as M means nothing to move;
- ``RESCALE_TOKENS_FILE`` (auth on): the chart's token Secret as a file; its first ``@admin`` token
  is the CLI's ``STATEHOUSE_TOKEN`` (every step of a live rescale needs one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, NoReturn

PROGRAM = "statehouse rescale hook"


def say(line: str) -> None:
    print(f"{PROGRAM}: {line}", file=sys.stderr, flush=True)


def fail(line: str) -> NoReturn:
    say(line)
    sys.exit(1)


def admin_token(path: str) -> str:
    """The first ``@admin`` token of a token file, read with the server's own parser (the image has it)."""
    from statehouse.app.tokens import TokenError, parse_tokens

    try:
        with open(path, encoding="utf-8") as f:
            grants = parse_tokens("", (path, f.read().splitlines()))
    except (OSError, TokenError) as exc:
        fail(f"the chart's token Secret cannot be read: {exc}")
    for token, grant in grants.items():
        if grant.admin:
            return token
    fail(
        "auth is on, but the chart's token Secret holds no @admin token, which every step of a live rescale "
        "needs: add an entry TOKEN:@admin (auth.tokens or auth.existingSecret) and upgrade again"
    )


def status(env: dict[str, str]) -> dict[str, Any] | None:
    """``statehouse status --json``, or None when the set is not one layout (a commit reaching the
    replicas one by one, a replica down): ``statehouse rescale`` then says what stands, or resumes."""
    done = subprocess.run(["statehouse", "status", "--json"], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        say(f"statehouse status exited {done.returncode}: {done.stderr.strip()}")
        return None
    shown: dict[str, Any] = json.loads(done.stdout)
    return shown


def survey(seeds: list[str], token: str | None) -> tuple[list[dict[str, Any]], list[str]]:
    """``GET /v1/topology`` of the seeds and of every replica they advertise: the answers, and the
    URLs that did not answer. Used when ``statehouse status`` cannot see one whole set."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answers: dict[str, dict[str, Any]] = {}
    silent: list[str] = []
    todo = list(reversed(seeds))
    while todo:
        url = todo.pop().rstrip("/")
        if url in answers or url in silent:
            continue
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{url}/v1/topology", headers=headers), timeout=10) as r:
                shown: dict[str, Any] = json.load(r)
        except (OSError, ValueError):
            silent.append(url)
            continue
        answers[url] = shown
        todo += shown.get("replica_urls") or []
        todo += (shown.get("move") or {}).get("replica_urls") or []
    return list(answers.values()), silent


def settled_at(to: int, urls: list[str], env: dict[str, str]) -> str | None:
    """Why there is nothing to move although ``statehouse status`` failed, or None. The replicas that
    answer record no pending move and serve ``to`` replicas (the others are down, not moving); or none
    answers and the StatefulSet already ran ``to`` pods when the chart was rendered (nothing can move
    now, and the upgrade may be what brings them back: a new image for crash-looping pods)."""
    answers, silent = survey([env["STATEHOUSE_URLS"], *urls], env.get("STATEHOUSE_TOKEN"))
    if any(shown.get("move") for shown in answers):
        return None
    serving = [s for s in answers if not s.get("retired") and not s.get("unassigned")]
    if serving and {s["replica_count"] for s in serving} == {to}:
        down = f"; not answering: {', '.join(silent)}" if silent else ""
        return f"the replicas that answer serve {to} replicas with no move pending{down}: nothing to move"
    if not answers and os.environ.get("RESCALE_STATEFULSET_REPLICAS") == str(to):
        return (
            f"no replica answers, and the StatefulSet already runs {to} pods: nothing to move (a move could not "
            "run anyway)"
        )
    return None


def wait_for(urls: list[str], first: int, seconds: float) -> None:
    """Until each new replica (index ``first`` on) answers ``GET /healthz``: Helm runs the post
    hook as soon as the StatefulSet is updated, before its new pods are scheduled and started."""
    deadline = time.monotonic() + seconds
    for index, url in enumerate(urls[first:], first):
        said = False
        while True:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                fail(
                    f"new replica {index} ({url}) did not start within {seconds:.0f}s; nothing was moved. "
                    f"`kubectl logs` of its pod says why (a volume left by an earlier layout: delete its "
                    f"PersistentVolumeClaim and the pod), then upgrade again"
                )
            if not said:
                say(f"waiting for new replica {index} ({url}) to start")
                said = True
            time.sleep(2)


def main() -> None:
    phase = os.environ["RESCALE_PHASE"]
    to = int(os.environ["RESCALE_TO"])
    urls = [u.strip() for u in os.environ["RESCALE_URLS"].split(",") if u.strip()]
    wait = float(os.environ.get("RESCALE_WAIT", "300"))
    shared = os.environ.get("RESCALE_SHARED_STORAGE") == "true"
    assert phase in ("pre", "post") and len(urls) == to, (phase, to, urls)
    env = dict(os.environ)
    tokens = os.environ.get("RESCALE_TOKENS_FILE")
    if tokens:
        env["STATEHOUSE_TOKEN"] = admin_token(tokens)

    shown = status(env)
    if shown is None and (why := settled_at(to, urls, env)) is not None:
        say(why)
        return
    grow = False
    if shown is not None and shown["move"] is None:
        count, version = shown["replica_count"], shown["version"]
        if count == to:
            say(f"the replica set has {to} replicas (topology version {version}): nothing to move")
            return
        if not shared:
            fail(
                f"the replica set has {count} replicas and replicaCount is {to}, but its checkpoints are on "
                "per-replica volumes (s3.enabled=false): state can only move through storage every replica "
                f"reads; enable S3 first, or keep replicaCount={count}"
            )
        grow = to > count
        if phase == "pre" and grow:
            say(f"growing {count} -> {to} replicas after the upgrade starts the new pods (post-upgrade hook)")
            return
        if phase == "post" and not grow:
            fail(
                f"the replica set still has {count} replicas, but the upgrade scaled the StatefulSet to {to}: the "
                "pre-upgrade hook did not move their state off the removed replicas (hooks disabled?). Their volumes "
                f"are kept: scale back with replicaCount={count}, then upgrade to {to} with the hooks on"
            )
        if grow:
            wait_for(urls, count, wait)
    # A move to make, or one pending (the CLI resumes a pending move to the same count, and refuses
    # any other with a line saying what to do).
    command = ["statehouse", "rescale", "--to", str(to), "--wait", f"{wait:g}"]
    if grow:
        command += ["--urls-new", ",".join(urls)]
    say(" ".join(command))
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    main()
