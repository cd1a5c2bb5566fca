"""The data source decides once, from its options, which of its six reads a read is, and every
question Spark asks (schema, reader) takes that answer; its writer takes each operation's columns
and kinds from the op table. No Spark session and no server: these are the data source's own
decisions, made before either is reached."""

from __future__ import annotations

import pytest

from statehouse.client.datasource.options import ReadMode, read_mode
from statehouse.client.datasource.source import LIVE_READERS, VIEW_SCHEMAS, StatehouseDataSource
from statehouse.client.datasource.writer import COLUMNS, KINDS

LIVE = {"urls": "http://127.0.0.1:1", "job": "j"}
CHECKPOINT = {"checkpoint": "latest", "checkpoint_storage": "/nowhere", "job": "j"}


@pytest.mark.parametrize(
    ("options", "mode"),
    [
        ({**LIVE, "state": "s"}, ReadMode.KEYED),
        ({**LIVE, "timers": "event"}, ReadMode.TIMERS),
        ({**LIVE, "what": "states"}, ReadMode.STATES),
        ({**LIVE, "operator": "o"}, ReadMode.OPERATOR),
        ({**LIVE, "operator": "o", "state": "s"}, ReadMode.OPERATOR),
        ({**CHECKPOINT, "state": "s"}, ReadMode.CHECKPOINT_KEYED),
        ({**CHECKPOINT, "operator": "o"}, ReadMode.CHECKPOINT_OPERATOR),
        # An empty operator on a checkpoint read is none (a keyed read, which then needs a state).
        ({**CHECKPOINT, "operator": "", "state": "s"}, ReadMode.CHECKPOINT_KEYED),
        # Spark hands options over lower-cased; given otherwise, they name the same read.
        ({"URLS": "http://127.0.0.1:1", "Job": "j", "Timers": "event"}, ReadMode.TIMERS),
        ({"Checkpoint": "3", "OPERATOR": "o"}, ReadMode.CHECKPOINT_OPERATOR),
        # Options that do not go together still name one read; its parser refuses the mix.
        ({**LIVE, "timers": "event", "what": "states"}, ReadMode.TIMERS),
        ({**CHECKPOINT, "timers": "event", "state": "s"}, ReadMode.CHECKPOINT_KEYED),
    ],
)
def test_the_options_name_one_read(options: dict[str, str], mode: ReadMode) -> None:
    assert read_mode(options) is mode
    assert StatehouseDataSource(options).mode is mode
    assert mode.from_checkpoint == ("checkpoint" in {name.lower() for name in options})


def test_every_live_read_has_its_reader_and_every_view_its_schema() -> None:
    live = {mode for mode in ReadMode if not mode.from_checkpoint}
    assert set(LIVE_READERS) == live
    assert set(VIEW_SCHEMAS) == live - {ReadMode.KEYED}  # a keyed state's schema is its values'


def test_a_mixed_read_is_refused_by_its_parser_naming_what_to_fix() -> None:
    from statehouse.client.datasource.options import SourceError

    source = StatehouseDataSource({**CHECKPOINT, "timers": "event", "state": "s"})
    with pytest.raises(SourceError, match="read the live replicas, not a checkpoint"):
        source.schema()
    source = StatehouseDataSource({**LIVE, "operator": "o", "timers": "event"})
    with pytest.raises(SourceError, match="goes without option"):
        source.schema()


def test_the_writer_takes_columns_and_kinds_from_the_op_table() -> None:
    assert COLUMNS == {
        "put": ("key", "value"),
        "add": ("key", "value"),
        "map_put": ("key", "user_key", "value"),
        "clear": ("key",),
    }
    assert KINDS == {
        "put": ("value", "list", "map"),
        "add": ("list", "reducing", "aggregating"),
        "map_put": ("map",),
        "clear": ("value", "list", "map", "reducing", "aggregating"),
    }
