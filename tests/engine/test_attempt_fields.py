"""The task attempt a request names, read by one rule whatever door it came in by (a batch's body, a
columnar request's query, a timer advance's body): no attempt field is no attempt, any of them is
one, and each of the three is checked, a missing one refused by name."""

from __future__ import annotations

import re

import pytest

from statehouse.backends.staging import AttemptRef, Winner
from statehouse.protocol.attempts import ATTEMPT_FIELDS, ATTEMPT_PATTERN, UNIT_PATTERN, named_attempt
from statehouse.protocol.errors import InvalidArgument


def test_no_attempt_field_names_no_attempt() -> None:
    assert named_attempt({}) is None
    assert AttemptRef.named_in({"epoch": 3, "ops": []}) is None


def test_all_three_name_the_attempt() -> None:
    assert AttemptRef.named_in({"partition": 2, "attempt": "a.p2", "seq": 0, "epoch": 1}) == AttemptRef(2, "a.p2", 0)


@pytest.mark.parametrize("given", ATTEMPT_FIELDS)
def test_any_one_field_makes_it_an_attempt_and_the_others_are_then_required(given: str) -> None:
    fields = {"partition": 0, "attempt": "a", "seq": 0}
    only = {given: fields[given]}
    assert named_attempt(only) == tuple(only.get(name) for name in ATTEMPT_FIELDS)
    missing = next(name for name in ATTEMPT_FIELDS if name != given)
    with pytest.raises(InvalidArgument, match=f"'{missing}'"):
        AttemptRef.named_in(only)


@pytest.mark.parametrize(
    ("attempt", "taken"),
    [("a" * 128, True), ("a" * 129, False), ("", False), ("u.p0.t1:x-y_z", True), ("a/b", False), ("a\n", False)],
)
def test_the_id_rule_is_the_pattern_the_api_documents(attempt: str, taken: bool) -> None:
    if not attempt.endswith("\n"):  # Python's "$" matches before a final newline; the engine's check does not
        assert bool(re.match(ATTEMPT_PATTERN, attempt)) == taken
    if taken:
        assert AttemptRef(0, attempt, 0).attempt == attempt
    else:
        with pytest.raises(InvalidArgument, match="'attempt' must be 1-128 characters"):
            AttemptRef(0, attempt, 0)


def test_a_unit_may_be_empty_and_follows_its_pattern() -> None:
    assert re.match(UNIT_PATTERN, "")
    assert Winner(0, "a", 1, "").unit == ""
    with pytest.raises(InvalidArgument, match="'unit' must be 0-128 characters"):
        Winner(0, "a", 1, "x" * 129)
