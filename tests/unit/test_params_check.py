"""INVALID_PARAMS: params that do not fit a command, as one line naming the parameter."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError, validate_call

from vox_mqtt.protocol._fields import IsoTimestamp
from vox_mqtt.protocol.validation import describe_params, type_words

EXPECTED = {"start_date": "a string", "end_date": "a string"}


def _errors(**params: Any) -> list[Any]:
    """Return pydantic's errors for a financial_summary-like call with these params."""

    @validate_call
    def financial_summary(start_date: IsoTimestamp, end_date: IsoTimestamp) -> None:
        pass

    with pytest.raises(ValidationError) as failed:
        financial_summary(**params)
    return list(failed.value.errors(include_url=False))


def test_a_date_without_timezone_says_so_and_names_the_parameter() -> None:
    errors = _errors(start_date="2026-01-01T00:00:00", end_date="2026-02-01T00:00:00Z")
    assert describe_params("financial_summary", errors, EXPECTED) == (
        "parameter 'start_date': '2026-01-01T00:00:00' has no timezone "
        "(write e.g. 2026-01-11T08:00:00-03:00)"
    )


def test_a_missing_parameter_says_what_it_expects() -> None:
    errors = _errors(start_date="2026-01-01T00:00:00Z")
    assert describe_params("financial_summary", errors, EXPECTED) == (
        "parameter 'end_date' is missing (expected a string)"
    )


def test_a_wrong_type_says_what_it_got() -> None:
    errors = _errors(start_date=20260101, end_date="2026-02-01T00:00:00Z")
    assert describe_params("financial_summary", errors, EXPECTED) == (
        "parameter 'start_date' should be a valid string, not 20260101"
    )


def test_an_unexpected_parameter_lists_what_the_command_takes() -> None:
    errors = [{"type": "unexpected_keyword_argument", "loc": ("taget",), "msg": "x", "input": 1}]
    assert describe_params("analyze", errors, {"target": "a string"}) == (
        "unexpected parameter 'taget': analyze takes target (a string)"
    )
    assert describe_params("ping", errors, {}).endswith("ping takes no parameters")


def test_a_place_inside_a_parameter_and_more_problems_are_counted() -> None:
    errors: list[dict[str, Any]] = [
        {
            "type": "string_type",
            "loc": ("tags", 0),
            "msg": "Input should be a valid string",
            "input": 1,
        },
        {"type": "missing_argument", "loc": ("a",), "msg": "Missing required argument"},
        {"type": "missing_argument", "loc": ("b",), "msg": "Missing required argument"},
        {"type": "missing_argument", "loc": ("c",), "msg": "Missing required argument"},
    ]
    line = describe_params("tag", errors, {"tags": "a list"})
    assert line == (
        "parameter 'tags[0]' should be a valid string, not 1; parameter 'a' is missing; "
        "parameter 'b' is missing (and 1 more)"
    )
    assert "\n" not in line


def test_a_long_value_is_cut() -> None:
    errors = [
        {
            "type": "int_type",
            "loc": ("n",),
            "msg": "Input should be a valid integer",
            "input": "x" * 500,
        }
    ]
    line = describe_params("count", errors, {"n": "an integer"})
    assert len(line) < 130
    assert line.endswith("...")


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "string"}, "a string"),
        ({"type": "integer"}, "an integer"),
        ({"anyOf": [{"type": "number"}, {"type": "null"}]}, "a number or null"),
        ({"enum": ["a", "b"]}, "one of 'a', 'b'"),
        ({}, "a value"),
    ],
)
def test_type_words(schema: dict[str, Any], words: str) -> None:
    assert type_words(schema) == words
