"""The client's one cursor-paging helper against real replicas: a listing several pages long is read
whole, each item once, page after page, and the listing's other fields stay readable on each page
(the checkpoint coordinator takes the next checkpoint id from the last one)."""

from __future__ import annotations

from statehouse.client import StatehouseClient
from statehouse.client.global_checkpoints import CheckpointCoordinator
from statehouse.client.paging import follow, listed, listing
from statehouse.protocol import routes


def test_a_listing_of_several_pages_is_read_whole_each_item_once(two_replicas, job_name):
    urls = [r.url for r in two_replicas]
    with StatehouseClient(urls) as client:
        job = client.create_job(job_name, 8)
        counts = job.register("counts", "reducing", function="sum")
        keys = [f"k{i}" for i in range(23)]
        for key in keys:
            counts.add(key, 1)
        path = routes.path(routes.STATE_KEYS, job=job_name, state="counts")
        found: list[str] = []
        pages = 0
        for replica in client.replicas:
            paged = [[item["key"] for item in page["items"]] for page in listing(replica, path, limit=4)]
            assert all(len(page) <= 4 for page in paged)
            flat = [key for page in paged for key in page]
            assert [item["key"] for item in listed(replica, path, limit=4)] == flat
            found += flat
            pages += len(paged)
        assert sorted(found) == sorted(keys)
        assert pages >= 6  # 23 keys, 4 a page, however the two replicas share them: the cursor was followed


def test_the_last_page_carries_the_listings_other_fields(two_replicas, job_name):
    urls = [r.url for r in two_replicas]
    with StatehouseClient(urls) as client:
        job = client.create_job(job_name, 8)
        coordinator = CheckpointCoordinator(job)
        first = coordinator.checkpoint().checkpoint_id
        second = coordinator.checkpoint().checkpoint_id
        assert [c.checkpoint_id for c in coordinator.completed()] == [first, second]
        assert coordinator.next_id() > second


def test_follow_asks_with_each_page_s_cursor_until_one_names_none():
    asked: list[str | None] = []
    chain = {None: "a", "a": "b", "b": None}

    def fetch(cursor: str | None) -> str | None:
        asked.append(cursor)
        return chain[cursor]

    assert list(follow(fetch, lambda page: page)) == ["a", "b", None]
    assert asked == [None, "a", "b"]
