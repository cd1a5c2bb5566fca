"""The API's paths and the wire constants the server and the client both use: the server routes
these templates (FastAPI path parameters in braces), the client, the ``statehouse`` command and
the Spark data source fill them in (:func:`path`). One table, so a route renamed on one side
cannot leave the other asking for a path nobody serves (``tests/http/test_routes.py`` checks
every template against the app's routes, ``tests/http/test_route_table_served.py`` every route
against the table)."""

from __future__ import annotations

import re
import string

API = "/v1"

TOPOLOGY = f"{API}/topology"
# The steps of a live rescale (``step``: prepare, catch-up, load, decide, commit, abort) and the
# decision's read.
TOPOLOGY_STEP = f"{TOPOLOGY}/{{step}}"
TOPOLOGY_DECISION = f"{TOPOLOGY}/decision"
TOPOLOGY_STEPS = ("prepare", "catch-up", "load", "decide", "commit", "abort")

JOBS = f"{API}/jobs"
JOB = f"{JOBS}/{{job}}"
FENCE = f"{JOB}/fence"
BATCH = f"{JOB}/batch"
RESTORE = f"{JOB}/restore"
EPOCH = f"{JOB}/epochs/{{epoch}}"
EPOCH_PREPARE = f"{EPOCH}/prepare"
EPOCH_COMMIT = f"{EPOCH}/commit"
EPOCH_ABORT = f"{EPOCH}/abort"
CHECKPOINTS = f"{JOB}/checkpoints"
CHECKPOINT = f"{CHECKPOINTS}/{{checkpoint_id}}"
CHECKPOINT_COMPLETE = f"{CHECKPOINT}/complete"
CHECKPOINT_ABORT = f"{CHECKPOINT}/abort"

STATES = f"{JOB}/states"
STATE = f"{STATES}/{{state}}"
STATE_KEYS = f"{STATE}/keys"
# One key of a state, and one user key of a map state's key.
KEY = f"{STATE_KEYS}/{{key}}"
KEY_ADD = f"{KEY}/add"
KEY_ADD_GET = f"{KEY}/add_get"
ENTRIES = f"{KEY}/entries"
ENTRY = f"{ENTRIES}/{{user_key}}"
ENTRY_ADD = f"{ENTRY}/add"
STATE_SCAN = f"{STATE}/scan"
STATE_SIZES = f"{STATE}/sizes"
# The columnar endpoint: one state, or several over the same rows (``?states=a,b``).
STATE_COLUMNS = f"{STATE}/columns/{{op}}"
JOB_COLUMNS = f"{JOB}/columns/{{op}}"

TIMERS = f"{JOB}/timers/{{domain}}"
TIMER = f"{TIMERS}/keys/{{key}}/{{timestamp}}"
TIMER_COUNTS = f"{TIMERS}/counts"
TIMER_ADVANCE = f"{TIMERS}/advance"
TIMER_COLUMNS = f"{TIMERS}/columns/{{op}}"

OPERATOR = f"{JOB}/operators/{{operator}}"
OPERATOR_LIST = f"{OPERATOR}/subtasks/{{index}}/lists/{{name}}"
OPERATOR_RAW = f"{OPERATOR}/subtasks/{{index}}/raw"
OPERATOR_RAW_PARTITIONS = f"{OPERATOR_RAW}/partitions"
BROADCAST_ENTRIES = f"{OPERATOR}/broadcast/{{name}}/entries"
BROADCAST_ENTRY = f"{BROADCAST_ENTRIES}/{{key}}"

RAW_KEY_GROUP = f"{JOB}/raw/key-groups/{{key_group}}"
RAW_KEY_GROUP_APPEND = f"{RAW_KEY_GROUP}/append"

# A replica's probes and metrics, outside the API's prefix (no token asked).
HEALTHZ = "/healthz"
READYZ = "/readyz"
METRICS = "/metrics"

# Media types of request and answer bodies.
JSON = "application/json"
MSGPACK = "application/msgpack"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
# Raw state's bodies: the bytes as they are.
OCTET_STREAM = "application/octet-stream"

# A scan page's Arrow schema metadata: the cursor of the next page (absent: the range is read).
NEXT_CURSOR = b"statehouse.next_cursor"
# Keys of one scan point read: they travel as query parameters, so the request head stays small.
MAX_SCAN_KEYS = 1_000
# The page a client asks a listing for: the largest a replica answers by default (STATEHOUSE_MAX_PAGE_SIZE).
LISTING_PAGE = 1_000


def path(template: str, **params: object) -> str:
    """``template`` with its parameters filled in; a parameter it names and ``params`` lacks, or
    one ``params`` gives and it does not name, is a ``KeyError`` (a typo would build another path)."""
    names = {name for _text, name, _spec, _conv in string.Formatter().parse(template) if name}
    if names != set(params):
        raise KeyError(f"{template} takes {sorted(names)}; got {sorted(params)}")
    return template.format(**params)


def pattern(template: str) -> re.Pattern[str]:
    """What matches a request's path to ``template`` (``fullmatch``), each parameter a named group
    of one path segment, as the server's router matches it."""
    parts = re.split(r"\{(\w+)\}", template)
    text = "".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts))
    return re.compile(text)
