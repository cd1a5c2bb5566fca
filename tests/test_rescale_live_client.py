"""The client side of the live rescale (docs/operations.md, Rescaling; issue 30) over real replicas:
the per-process layout cache every new client (each Spark task) routes from, and its refresh."""

from __future__ import annotations

import pytest

from statehouse.client import StatehouseClient

pytestmark = [pytest.mark.http]


def test_a_new_client_routes_from_the_layout_this_process_learned(two_replicas, job_name):
    urls = [two_replicas[1].url, two_replicas[0].url]  # any order: the cache holds the learned one
    with StatehouseClient(urls) as first:
        first.create_job(job_name, 16).register("s", "value").update("alice", 1)
        assert not first.replicas.cached
    with StatehouseClient(list(reversed(urls))) as second:
        job = second.job(job_name)  # no GET /v1/topology: the layout came from the cache
        assert second.replicas.cached and second.replicas.urls == [s.url for s in two_replicas]
        assert job.value_state("s").value("alice") == 1
