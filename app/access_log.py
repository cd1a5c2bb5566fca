"""What uvicorn's access log writes (``STATEHOUSE_ACCESS_LOG``).

A Spark job's executors call the data plane (the batch, columnar and timer-columnar endpoints)
thousands of times a second; a line for each successful call costs ~6% of a small request's
server CPU and says less than ``/metrics``, which counts them per route and status (and
``app/serve.py`` does not even make the record a filter would drop). By default
(``control``) those lines are left out; every other request, and every refused or failed data
plane request, is still logged. ``all`` logs every request.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Literal

AccessLog = Literal["all", "control"]
ACCESS_LOGGER = "uvicorn.access"
# The data plane's paths as uvicorn logs them (the app's root path, the path, the query string),
# from the routes flagged ``routing.data_plane`` (:func:`data_plane_routes`); none until then.
_DATA_PLANE = re.compile(r"(?!)")


def data_plane_routes(path_formats: Iterable[str]) -> None:
    """The data plane's routes by path template (``/v1/jobs/{job}/batch``): the app gives the ones
    it flags (``routing.data_plane_paths``)."""
    global _DATA_PLANE
    # A parameter matches one segment; the path ends, or its query string starts.
    alternatives = [re.sub(r"\\\{[^}]*\\\}", "[^/?]+", re.escape(path)) for path in path_formats]
    _DATA_PLANE = re.compile(f"(?:{'|'.join(alternatives) or '(?!)'})(?:\\?|$)")


_quiet = False  # the mode is "control" (set by :func:`configure`)


def left_out(method: object, path: object, status: object) -> bool:
    """Whether ``control`` leaves out the line of this request: a successful data-plane POST."""
    succeeded = isinstance(status, int) and _succeeded(status)
    return method == "POST" and succeeded and isinstance(path, str) and _DATA_PLANE.search(path) is not None


def _succeeded(status: int) -> bool:
    return 200 <= status < 300


def quiet(method: str, path: str, status: int) -> bool:
    """Whether the line of this request is left out now (the mode is ``control``): the server
    (``app/serve.py``) asks before uvicorn builds the record the filter would drop."""
    return _quiet and left_out(method, path, status)


def quiet_data_plane(status: int) -> bool:
    """:func:`quiet` for a request known to be the data plane's POST (``app/data_plane.py``'s)."""
    return _quiet and _succeeded(status)


class QuietDataPlane(logging.Filter):
    """Drops uvicorn's access line of a successful data-plane POST (under ``uvicorn
    statehouse.app.main:app``; ``python -m statehouse.app.serve`` does not make those records)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args  # uvicorn's: client address, method, path with query, HTTP version, status
        if not (isinstance(args, tuple) and len(args) == 5):
            return True
        return not left_out(args[1], args[2], args[4])


def configure(mode: AccessLog) -> None:
    """Install (``control``) or remove (``all``) the filter on uvicorn's access logger."""
    global _quiet
    logger = logging.getLogger(ACCESS_LOGGER)
    for installed in [f for f in logger.filters if isinstance(f, QuietDataPlane)]:
        logger.removeFilter(installed)
    _quiet = mode == "control"
    if _quiet:
        logger.addFilter(QuietDataPlane())
