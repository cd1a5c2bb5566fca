"""The layout a client reads from the replicas' ``GET /v1/topology`` answers, at the moments of a
live rescale's commit: the commit reaches the replicas one after the other, so for a moment some
serve the new version while a joining one has not switched yet."""

from __future__ import annotations

from typing import Any

import pytest

from statehouse.client import LayoutError
from statehouse.client.replicas import _layout

OLD = ["http://a:1", "http://b:1"]
NEW = [*OLD, "http://c:1"]


def shown(index: int, version: int, count: int, urls: list[str], move: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "set_id": "s",
        "replica_index": index,
        "replica_count": count,
        "version": version,
        "replica_urls": urls,
        "move": move,
    }


JOINING = {"joining": True, "version": 2, "replica_count": 3}


def test_before_the_commit_the_old_layout_serves():
    answered = {
        OLD[0]: shown(0, 1, 2, OLD, JOINING | {"joining": False}),
        OLD[1]: shown(1, 1, 2, OLD),
        NEW[2]: shown(2, 1, 0, [], JOINING),
    }
    assert [url for url, _ in _layout(answered, {}, strict=True)] == OLD


@pytest.mark.parametrize("strict", [True, False])
def test_a_joining_replica_the_others_committed_is_a_commit_on_its_way(strict):
    """Not a broken set: the client asks again (``_Unsettled``) instead of failing the caller."""
    answered = {OLD[0]: shown(0, 2, 3, NEW), OLD[1]: shown(1, 2, 3, NEW), NEW[2]: shown(2, 1, 0, [], JOINING)}
    with pytest.raises(LayoutError, match="is committing") as caught:
        _layout(answered, {}, strict=strict)
    assert type(caught.value).__name__ == "_Unsettled"


def test_once_it_switched_the_new_layout_serves():
    answered = {url: shown(i, 2, 3, NEW) for i, url in enumerate(NEW)}
    assert [url for url, _ in _layout(answered, {}, strict=True)] == NEW


def test_a_replica_joining_no_move_of_that_version_is_not_serving():
    """A replica that is retired by the move the others committed is not a commit on its way."""
    answered = {
        OLD[0]: shown(0, 2, 3, NEW),
        OLD[1]: shown(1, 2, 3, NEW),
        NEW[2]: shown(2, 2, 3, NEW) | {"retired": True},
    }
    with pytest.raises(LayoutError, match="is not serving") as caught:
        _layout(answered, {}, strict=False)
    assert type(caught.value).__name__ == "LayoutError"
