"""Exact Kubernetes resource quantities (`resource.Quantity`) as `Decimal`.

Grammar (k8s.io/apimachinery/pkg/api/resource):
    <quantity> ::= <signedNumber><suffix>
    <suffix>   ::= Ki | Mi | Gi | Ti | Pi | Ei | n | u | m | "" | k | M | G | T | P | E
                 | e<signedNumber> | E<signedNumber>
Values are kept exact: "100m" -> Decimal("0.1"), "1Gi" -> Decimal(1073741824).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_BINARY = {
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}

# Number part: optional sign, digits with optional fraction (".5" and "5." are legal in k8s).
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)

# Kubernetes rejects exponents this large; bounding them also keeps Decimal cheap.
_MAX_EXPONENT = 100


def parse_quantity(value: object) -> Decimal:
    """Parse a Kubernetes quantity (str, int or float) exactly; ValueError on anything else."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r} (a boolean)")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"not a quantity: {value!r}")
        # YAML may turn "0.5" into a float; repr round-trips the shortest decimal form.
        return Decimal(repr(value))
    if not isinstance(value, str):
        raise ValueError(f"not a quantity: {value!r} (type {type(value).__name__})")
    m = _QUANTITY.match(value)
    if m is None:
        raise ValueError(
            f"not a Kubernetes quantity: {value!r} (expected e.g. 500m, 2, 1.5Gi, 8Gi, 1e3)"
        )
    try:
        number = Decimal(m.group("num"))
    except InvalidOperation as exc:  # pragma: no cover - regex already guarantees digits
        raise ValueError(f"not a Kubernetes quantity: {value!r}") from exc
    suffix = m.group("suffix") or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    exponent = int(suffix[1:])
    if abs(exponent) > _MAX_EXPONENT:
        raise ValueError(f"quantity exponent out of range: {value!r}")
    return number.scaleb(exponent)


def is_plain_integer(value: object) -> bool:
    """True for a non-negative integer written without suffix (what HAMi's gpumem needs)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    return isinstance(value, str) and value.isascii() and value.isdigit()
