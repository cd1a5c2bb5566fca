"""Keyed state descriptors: what a state is, and whether a re-registration is compatible."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from statehouse.protocol.errors import IncompatibleState, InvalidArgument
from statehouse.protocol.keygroups import KEY_TYPES, KeyType
from statehouse.protocol.ops import STATE_KINDS, StateKind
from statehouse.snapshots.stored.codec import check_value
from statehouse.snapshots.stored.functions import AGGREGATE_FUNCTIONS, MAP_FUNCTIONS, REDUCE_FUNCTIONS, StateFunction
from statehouse.snapshots.stored.names import validate_name
from statehouse.snapshots.stored.ttl import TtlConfig
from statehouse.snapshots.stored.value_types import COERCE, ValueType, check_value_type


@dataclass(frozen=True, slots=True)
class StateDescriptor:
    """Flink's ``StateDescriptor``: name, kind, key type, optional default, function, TTL and
    value type (see ``value_types``)."""

    name: str
    kind: StateKind
    key_type: KeyType = "string"
    default: Any = None
    function: str | None = None
    ttl: TtlConfig | None = None
    value_type: ValueType | None = None

    def __post_init__(self) -> None:
        validate_name(self.name, "state")
        if self.kind not in STATE_KINDS:
            raise InvalidArgument(f"kind must be one of {', '.join(STATE_KINDS)}; got {self.kind!r}")
        if self.key_type not in KEY_TYPES:
            raise InvalidArgument(f"key_type must be one of {', '.join(KEY_TYPES)}; got {self.key_type!r}")
        if self.default is not None and self.kind != "value":
            raise InvalidArgument("only value states take a default (as in Flink's ValueStateDescriptor)")
        if self.default is not None:
            check_value(self.default)  # read back in every answer format, as stored values are
        functions = self.available_functions()
        if functions is None:
            if self.function is not None:
                raise InvalidArgument(
                    f"a {self.kind} state takes no function; remove 'function' "
                    "(only reducing, aggregating and map states take one)"
                )
        elif self.kind == "map":
            if self.function is not None and self.function not in functions:
                raise InvalidArgument(self._map_function_error(functions))
        elif self.function not in functions:
            raise InvalidArgument(
                f"a {self.kind} state needs 'function', one of: {', '.join(sorted(functions))}"
                + (f" (got {self.function!r})" if self.function is not None else "")
                + self._kind_hint()
            )
        check_value_type(self.value_type, self.kind, self.function)
        if self.default is not None and self.value_type is not None:
            object.__setattr__(self, "default", COERCE[self.value_type](self.default))

    def _kind_hint(self) -> str:
        """Which kind takes the function asked for, when another kind does: saves a round trip."""
        if self.kind == "reducing" and self.function in AGGREGATE_FUNCTIONS:
            return (
                f"; {self.function!r} keeps an accumulator other than its result: register an aggregating "
                f'state, {{"kind": "aggregating", "function": "{self.function}"}}'
            )
        return ""

    def _map_function_error(self, functions: dict[str, StateFunction]) -> str:
        detail = (
            f"a map state's optional 'function' (what map_add folds values with) must be one of: "
            f"{', '.join(sorted(functions))}; got {self.function!r}"
        )
        if self.function in AGGREGATE_FUNCTIONS:
            # e.g. avg: a map entry would hold [sum, count], which is what map_get would return.
            detail += (
                f" ({self.function!r} keeps an accumulator other than its result, and map_get returns what is "
                "stored; use an aggregating state)"
            )
        return detail

    def available_functions(self) -> dict[str, StateFunction] | None:
        """The functions this kind may name (a map's is optional), or ``None`` if it takes none."""
        if self.kind == "reducing":
            return REDUCE_FUNCTIONS
        if self.kind == "aggregating":
            return AGGREGATE_FUNCTIONS
        if self.kind == "map":
            return MAP_FUNCTIONS
        return None

    @property
    def state_function(self) -> StateFunction:
        functions = self.available_functions()
        assert functions is not None and self.function is not None
        return functions[self.function]

    def check_compatible(self, existing: StateDescriptor) -> None:
        """Refuse what would misread stored bytes, as Flink refuses incompatible state.

        The TTL duration, update type and visibility may change (stored timestamps stay
        valid); switching TTL on or off changes the stored layout and is refused. A map without
        function may gain one: its entries are stored alike either way.
        """
        for field in ("kind", "key_type", "function", "value_type"):
            old, new = getattr(existing, field), getattr(self, field)
            if field == "function" and self.kind == "map" and old is None:
                continue  # the kinds are equal here: checked first
            if old != new:
                raise IncompatibleState(
                    f"state {self.name!r} exists with {field}={old!r}; cannot re-register it with "
                    f"{field}={new!r}. Delete the state first or use another name."
                )
        if (existing.ttl is None) != (self.ttl is None):
            raise IncompatibleState(
                f"state {self.name!r} exists {'with' if existing.ttl else 'without'} TTL; "
                "switching TTL on or off for existing state is not supported: delete the state first or use "
                "another name"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "key_type": self.key_type,
            "default": self.default,
            "function": self.function,
            "ttl": self.ttl.to_dict() if self.ttl else None,
            "value_type": self.value_type,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StateDescriptor:
        ttl = data.get("ttl")
        return cls(
            name=data["name"],
            kind=data["kind"],
            key_type=data.get("key_type", "string"),
            default=data.get("default"),
            function=data.get("function"),
            ttl=TtlConfig(**ttl) if ttl else None,
            value_type=data.get("value_type"),
        )
