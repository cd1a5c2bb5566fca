"""The move's checkpoint waits for checkpoint storage, as every step of a live rescale does (up to
``wait``; docs/operations.md, Rescaling): S3 down once the replicas prepared, the global checkpoint
fails with storage unavailable, the driver reports that it waits and takes it again; S3 comes back
and the same move (the same topology version: none is spent) commits. Real SeaweedFS, killed and
started on the same port and data directory, plain writers through the three doors; afterwards every
acknowledged write is present exactly once and every key is stored only on its owner."""

from __future__ import annotations

from typing import Any

import pytest

from statehouse.client import StatehouseClient
from statehouse.client.rescale import LiveRescale
from tests.support.replica_set import misplaced
from tests.support.rescale_s3 import JOB, KEYS, STATE, P, ended, start_set
from tests.support.writers import Writers

pytestmark = [pytest.mark.http, pytest.mark.slow]


def test_s3_down_at_the_moves_checkpoint_is_waited_for(tmp_path, s3, s3_location):
    replicas, seeds, new = start_set(tmp_path, s3, s3_location, "rocksdb")
    waited: list[dict[str, Any]] = []
    steps: list[str] = []

    def progress(step: str, info: dict[str, Any]) -> None:
        steps.append(step)
        if step == "prepared":
            s3.kill()
        elif step == "waiting" and info.get("step") == "checkpoint" and not waited:
            waited.append(info)
            s3.start()  # the storage comes back while the driver waits for it

    try:
        with Writers(seeds, [*seeds, new], JOB, STATE, KEYS) as writers:
            writers.progress()
            with (
                StatehouseClient(seeds) as client,
                LiveRescale(client, 3, [new], wait=120, progress=progress) as move,
            ):
                report = move.run()
            writers.progress()
        assert report.outcome == "committed", report
        assert waited and waited[0]["for"] == "storage_unavailable", waited
        assert "S3" in waited[0]["detail"], waited
        assert steps.index("waiting") < steps.index("checkpointed") < steps.index("committed"), steps
        serving = ended(seeds, new, "committed")  # version 2: the move's own, no version spent
        writers.check(serving)
        assert misplaced(serving, JOB, [STATE], P, count=3) == {STATE: []}
    finally:
        replicas.stop()
