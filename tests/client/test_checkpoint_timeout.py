"""A coordinator's ``timeout`` bounds the whole checkpoint, its trigger's long poll included: the
trigger waits at most that long on the replicas, and what is left of it bounds the wait after."""

from __future__ import annotations

from statehouse.client import StatehouseClient
from statehouse.client.global_checkpoints import CheckpointCoordinator
from statehouse.client.transport import ReplicaConnection


def test_the_triggers_wait_is_within_the_timeout(two_replicas, job_name, monkeypatch):
    asked: list[int] = []
    send = ReplicaConnection.json

    def recording(self, method, path, body=None, *args, **kwargs):
        if isinstance(body, dict) and "wait_ms" in body:
            asked.append(body["wait_ms"])
        return send(self, method, path, body, *args, **kwargs)

    monkeypatch.setattr(ReplicaConnection, "json", recording)
    with StatehouseClient([r.url for r in two_replicas]) as client:
        job = client.create_job(job_name, 8)
        job.register("counts", "reducing", function="sum").add("k", 1)
        assert CheckpointCoordinator(job, timeout=0.3).checkpoint().checkpoint_id >= 1
        assert CheckpointCoordinator(job, timeout=60).checkpoint().checkpoint_id >= 2
    assert asked == [300, 300, 5000, 5000]  # one trigger per replica; a long poll is at most 5 s
