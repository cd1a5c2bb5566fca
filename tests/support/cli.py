"""The ``statehouse`` command run as an operator runs it: a child process with the environment
given, its exit code checked; and ``statehouse serve``'s replica set."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.server import REPO

CLI = [sys.executable, "-m", "statehouse.client"]


def environment(**more: str) -> dict[str, str]:
    """The test's environment without its STATEHOUSE_* settings, plus ``more``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("STATEHOUSE_")}, **more}


def cli(*args: str, urls: str | list[str] = "", code: int = 0, cwd: Path = REPO) -> subprocess.CompletedProcess:
    joined = ",".join(urls) if isinstance(urls, list) else urls
    done = subprocess.run(
        [*CLI, *args], env=environment(STATEHOUSE_URLS=joined), cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    return done


def cli_json(*args: str, urls: str | list[str] = "", cwd: Path = REPO) -> Any:
    done = cli(*args, "--json", urls=urls, cwd=cwd)
    assert done.stderr == "", done.stderr  # no progress display with --json
    return json.loads(done.stdout)


def free_ports(count: int) -> int:
    """A port p with p .. p+count-1 all free (serve puts replica i on p+i), below the ephemeral
    ports (32768 on): an outgoing connection of another test could take p+i there before a grow
    starts replica i."""
    while True:
        base = random.randrange(20000, 32000 - count)
        sockets = []
        try:
            for offset in range(count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()


@dataclass
class Served:
    directory: Path
    process: subprocess.Popen
    urls: list[str]
