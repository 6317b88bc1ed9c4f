from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.quantity import is_plain_integer, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", "0"),
        ("1", "1"),
        ("100m", "0.1"),
        ("1500m", "1.5"),
        ("250u", "0.00025"),
        ("5n", "0.000000005"),
        ("1k", "1000"),
        ("2M", "2000000"),
        ("3G", "3000000000"),
        ("1T", "1000000000000"),
        ("1P", "1000000000000000"),
        ("1E", "1000000000000000000"),
        ("1Ki", "1024"),
        ("1Mi", "1048576"),
        ("8Gi", "8589934592"),
        ("1Ti", "1099511627776"),
        ("1Pi", str(2**50)),
        ("1Ei", str(2**60)),
        ("1.5Gi", str(3 * 2**29)),
        ("1e3", "1000"),
        ("1E3", "1000"),
        ("12e-3", "0.012"),
        ("+4", "4"),
        ("-4", "-4"),
        (".5", "0.5"),
        ("5.", "5"),
    ],
)
def test_parses_exactly(text: str, expected: str) -> None:
    assert parse_quantity(text) == Decimal(expected)


@pytest.mark.parametrize("value", [4, 0, 2**40])
def test_ints(value: int) -> None:
    assert parse_quantity(value) == Decimal(value)


def test_yaml_float_is_exact_decimal() -> None:
    assert parse_quantity(0.5) == Decimal("0.5")
    assert parse_quantity(0.1) == Decimal("0.1")


@pytest.mark.parametrize(
    "bad",
    ["", " ", "abc", "1 Gi", " 1", "1Gib", "1gi", "Gi", "1.2.3", "--1", "1e", "1e400", "0x10",
     "1K", "1_000", "∞", None, True, [], {}, float("nan"), float("inf")],
)
def test_garbage_raises_value_error(bad: object) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(bad)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=10**9), st.sampled_from(["", "k", "M", "Ki", "Mi", "Gi"]))
def test_roundtrip_integers_with_suffix(n: int, suffix: str) -> None:
    mult = {"": 1, "k": 1000, "M": 10**6, "Ki": 1024, "Mi": 2**20, "Gi": 2**30}[suffix]
    assert parse_quantity(f"{n}{suffix}") == Decimal(n * mult)


@pytest.mark.parametrize(("value", "ok"), [("8192", True), (8192, True), ("8Gi", False),
                                           ("1.5", False), (-1, False), (True, False)])
def test_plain_integer(value: object, ok: bool) -> None:
    assert is_plain_integer(value) is ok
