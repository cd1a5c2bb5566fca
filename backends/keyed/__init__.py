"""The five keyed state kinds, with namespaces and TTL, over a partition transaction.

This is Flink's ``InternalKvState`` family plus its TTL decorators (``AbstractTtlDecorator``,
``TtlListState``, ``TtlMapState``), written once for every backend: the backends store
bytes (see ``codec``), the state kinds decide what the bytes mean. Every kind has one-key
methods (the per-operation API) and ``*_many`` methods over located ``Rows`` (the columnar
path): the same rules, one read and one write of the transaction per request.
"""

from statehouse.backends.keyed.base import Key, KeyedContext, KeyedState, Rows
from statehouse.backends.keyed.cleaner import ttl_cleaner
from statehouse.backends.keyed.list_state import ListState
from statehouse.backends.keyed.map_state import MapState
from statehouse.backends.keyed.reducing_state import AggregatingState, ReducingState
from statehouse.backends.keyed.value_state import ValueState

STATE_CLASSES: dict[str, type[KeyedState]] = {
    "value": ValueState,
    "list": ListState,
    "map": MapState,
    "reducing": ReducingState,
    "aggregating": AggregatingState,
}

__all__ = [
    "STATE_CLASSES",
    "AggregatingState",
    "Key",
    "KeyedContext",
    "KeyedState",
    "ListState",
    "MapState",
    "ReducingState",
    "Rows",
    "ValueState",
    "ttl_cleaner",
]
