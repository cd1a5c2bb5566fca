"""Fixtures of the HTTP contract's tests."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server import ServerProcess, start_server


@pytest.fixture
def fresh_server(server: ServerProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of the same backend to itself: memory measurements that earlier requests (whose
    freed memory the allocator may keep and reuse) cannot blur."""
    backend = server.settings["STATEHOUSE_BACKEND"]
    srv = start_server(tmp_path / "fresh", {"STATEHOUSE_BACKEND": backend})
    yield srv
    srv.stop(signal.SIGKILL)
