"""What every command shares: the connection options, output, one-line errors and exit codes, and
the progress display of long waits."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from statehouse.client.client import StatehouseClient
from statehouse.client.job import JobClient

T = TypeVar("T")

# Exit codes (docs/operations.md, "The statehouse command").
EXIT_OK = 0
EXIT_FAILED = 1  # the operation failed: a replica refused it, a checkpoint failed, a check did not hold
EXIT_USAGE = 2  # bad arguments (argparse's own code), or no replica URLs
EXIT_LAYOUT = 3  # the replicas are unreachable, or not one complete replica set at one topology version
EXIT_OPERATOR = 4  # waiting on the operator: the output says what to do, then run the command again
EXIT_INTERRUPTED = 130  # Ctrl-C

EXIT_CODES = f"""exit codes:
  {EXIT_OK}    done
  {EXIT_FAILED}    the operation failed (a replica refused it, a checkpoint failed, a check did not hold)
  {EXIT_USAGE}    bad arguments, or no replica URLs (--urls or STATEHOUSE_URLS)
  {EXIT_LAYOUT}    the replicas are unreachable, or not one complete replica set at one topology version
  {EXIT_OPERATOR}    waiting on the operator: the output says what to do, then run the command again
  {EXIT_INTERRUPTED}  interrupted"""


class CommandError(Exception):
    """A one-line error for stderr, with the exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--urls",
        default=os.environ.get("STATEHOUSE_URLS", ""),
        help="the replicas' URLs, comma-separated, in any order (one is enough when the replicas set "
        "STATEHOUSE_REPLICA_URLS); default: $STATEHOUSE_URLS",
    )
    parser.add_argument(
        "--token", default=os.environ.get("STATEHOUSE_TOKEN"), help="bearer token; default: $STATEHOUSE_TOKEN"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP request (default 30)")
    output_option(parser)


def output_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout (no progress display)")


@contextlib.contextmanager
def open_client(args: argparse.Namespace) -> Iterator[StatehouseClient]:
    """The client of ``--urls``, closed at the end of the ``with`` block."""
    urls = [url.strip() for url in args.urls.split(",") if url.strip()]
    if not urls:
        raise CommandError("give the replicas' URLs with --urls or STATEHOUSE_URLS", EXIT_USAGE)
    try:
        client = StatehouseClient(urls, token=args.token, timeout=args.timeout)
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    with client:
        yield client


def job_client(sh: StatehouseClient, name: str, shown: list[dict[str, Any]]) -> JobClient:
    """The job as the replicas' topologies record it: also a job not served under the current
    layout (after an adopted rescale, before its restore), which ``sh.job`` refuses."""
    for info in shown:
        for job in info["jobs"]:
            if job["job"] == name:
                return JobClient(sh.replicas, name, job["max_parallelism"])
    raise CommandError(f"no job {name!r} on the replicas (statehouse status lists the jobs)")


def job_names(shown: list[dict[str, Any]]) -> list[str]:
    return sorted({job["job"] for info in shown for job in info["jobs"]})


def emit(args: argparse.Namespace, document: Any, lines: list[str]) -> None:
    """The command's result: ``document`` as JSON with ``--json``, else ``lines`` for people."""
    if args.json:
        print(json.dumps(document, indent=1, sort_keys=True))
    else:
        for line in lines:
            print(line)


def note(args: argparse.Namespace, message: str) -> None:
    """A line of progress on stderr (none with ``--json``, whose caller reads stdout only)."""
    if not args.json:
        print(message, file=sys.stderr, flush=True)


def waiting(args: argparse.Namespace, label: str, call: Callable[[], T], *, every: float = 5.0) -> T:
    """``call()``'s result, with the time waited shown on stderr while it runs: a live counter on
    a terminal, a line every ``every`` seconds otherwise; nothing with ``--json``."""
    if args.json:
        return call()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    worker.start()
    live = sys.stderr.isatty()
    shown = 0.0
    while worker.is_alive():
        worker.join(0.2)
        waited = time.monotonic() - started
        if live and worker.is_alive():
            print(f"\r{label} ... {waited:.0f}s", end="", file=sys.stderr, flush=True)
        elif waited - shown >= every and worker.is_alive():
            shown = waited
            print(f"{label} ... {waited:.0f}s", file=sys.stderr, flush=True)
    if live:
        print(f"\r{label} ... done ({time.monotonic() - started:.1f}s)", file=sys.stderr, flush=True)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
