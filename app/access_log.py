"""What uvicorn's access log writes (``STATEHOUSE_ACCESS_LOG``).

A Spark job's executors call the data plane (the batch, columnar and timer-columnar endpoints)
thousands of times a second; a line for each successful call costs ~6% of a small request's
server CPU and says less than ``/metrics``, which counts them per route and status. By default
(``control``) those lines are left out; every other request, and every refused or failed data
plane request, is still logged. ``all`` logs every request.
"""

from __future__ import annotations

import logging
import re
from typing import Literal

AccessLog = Literal["all", "control"]
ACCESS_LOGGER = "uvicorn.access"
# The path as uvicorn logs it (the app's root path, the path, the query string).
_DATA_PLANE = re.compile(r"/v1/jobs/[^/?]+/(?:batch|states/[^/?]+/columns/[^/?]+|timers/[^/?]+/columns/[^/?]+)(?:\?|$)")


class QuietDataPlane(logging.Filter):
    """Drops uvicorn's access line of a successful data-plane POST."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args  # uvicorn's: client address, method, path with query, HTTP version, status
        if not (isinstance(args, tuple) and len(args) == 5 and args[1] == "POST"):
            return True
        path, status = args[2], args[4]
        succeeded = isinstance(status, int) and 200 <= status < 300
        return not (succeeded and isinstance(path, str) and _DATA_PLANE.search(path))


def configure(mode: AccessLog) -> None:
    """Install (``control``) or remove (``all``) the filter on uvicorn's access logger."""
    logger = logging.getLogger(ACCESS_LOGGER)
    for installed in [f for f in logger.filters if isinstance(f, QuietDataPlane)]:
        logger.removeFilter(installed)
    if mode == "control":
        logger.addFilter(QuietDataPlane())
