"""A replica's Prometheus metrics as a test reads them."""

from __future__ import annotations

import httpx


def metric(url: str, sample: str) -> float:
    """The value of one sample of the replica's /metrics (a histogram's ``_count``, a counter's
    ``_total``, with its labels: ``name{method="GET",...}``); 0 when it has none yet (a counter's
    labels appear with their first count)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(sample + " ")), 0.0)
