"""The fast YAML path gives what PyYAML's safe loader gives, objects and errors, and keeps the
alias and nesting protections."""

from __future__ import annotations

import math
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from controller import yamlload
from controller.parse import SnapshotFileError, load_documents
from controller.yamlload import MAX_DEPTH, SafeNoAliasLoader, load_all


def typed(obj: Any) -> Any:
    """A value that compares types too (True != 1, 1.0 != 1) and NaN equal to itself."""
    if isinstance(obj, dict):
        return ("map", [(typed(k), typed(v)) for k, v in obj.items()])
    if isinstance(obj, list):
        return ("seq", [typed(v) for v in obj])
    if isinstance(obj, float) and math.isnan(obj):
        return ("float", "nan")
    return (type(obj).__name__, obj)


def safe(text: str) -> list[Any]:
    return list(yaml.load_all(text, Loader=SafeNoAliasLoader))


def outcome(load: Any, text: str) -> Any:
    try:
        return typed(load(text))
    except Exception as exc:  # a YAMLError, or a constructor's ValueError (a bad date)
        return ("error", type(exc).__name__, str(exc))


def same(text: str) -> None:
    assert outcome(load_all, text) == outcome(safe, text), text


# Plain scalars the YAML 1.1 resolvers turn into something else than a string, and their
# neighbours that stay strings.
TRICKY = [
    "yes", "No", "on", "OFF", "y", "n", "true", "False", "~", "null", "Null", "NULL", "",
    "0", "-1", "+7", "0x1F", "0o17", "0777", "0b101", "1_000", "1:30", "190:20:30", "1.5",
    "1e5", "1.0e+5", ".5", ".inf", "-.Inf", ".NaN", "2026-01-05", "2026-01-05T10:20:30Z",
    "2026-01-05 10:20:30.5 +02:00", "2026-1-5", "100Gi", "500m", "1.5Ti", "v1", "-", "--x",
    "=x", "!x", "&x", "*x", "<<x", "nvidia.com/gpu", "a: b", "#", "'", '"',
]


def test_tricky_plain_and_quoted_scalars() -> None:
    for word in TRICKY:
        for text in (f"k: {word}\n", f"- {word}\n", f"{word}: v\n", f"k: '{word}'\n",
                     f'k: "{word}"\n', f"k: [{word}, x]\n", f"{word}\n"):
            same(text)  # some are not YAML at all ("k: #"): then the errors must match


@pytest.mark.parametrize("text", [
    "a: !!str 12\nb: !!int '3'\nc: !!float '1'\nd: !!bool 'yes'\ne: !!null ''\n",
    "a: !!binary aGVsbG8=\nb: !!timestamp 2026-01-05\n",
    "a: !!set {x, y}\nb: !!omap [{a: 1}]\nc: !!pairs [{a: 1}]\n",
    "a: !custom 1\n",
    "a: ! 12\nb: ! [1]\n",
    "base: {x: 1}\nmerged:\n  <<: {x: 2, y: 3}\n  z: 4\n",
    "a: =\n",
    "? [a, b]\n: 1\n",
    "? {a: 1}\n: 1\n",
    "a: &anchor 1\nb: &other {c: 2}\n",
    "a: 1\na: 2\n",
    "---\n---\na: 1\n---\n...\n",
    "a: |\n  line\n   kept\nb: >\n  folded\n  text\n\nc: |-\n  x\n",
    "{a: [1, {b: [2, 3]}], c: {}}\n",
    "- - - 1\n  - 2\n- []\n",
    "just a string\n",
    "a: [1, 2\nb: 3\n",
    "a:\n\tb: 1\n",
    "a: 1\n b: 2\n",
    "%YAML 1.1\n---\na: 1\n",
    "a: '2026-01-05T00:00:00Z'\nb: 2026-01-05T00:00:00Z\nc: 2026-13-45\n",
])
def test_unusual_documents_load_or_fail_as_the_safe_loader_does(text: str) -> None:
    same(text)


def test_timestamps_and_numbers_are_constructed() -> None:
    (doc,) = load_all("a: 2026-01-05\nb: 2026-01-05T10:00:00Z\nc: 0777\nd: 1_000\ne: .inf\n")
    assert isinstance(doc, dict)
    assert doc["a"] == date(2026, 1, 5) and isinstance(doc["b"], datetime)
    assert doc["c"] == 511 and doc["d"] == 1000 and doc["e"] == math.inf


scalars = st.one_of(
    st.sampled_from(TRICKY), st.text(max_size=12), st.integers(), st.booleans(), st.none(),
    st.floats(allow_nan=False), st.dates(), st.datetimes(),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(max_size=8) | st.sampled_from(TRICKY) | st.integers(), inner, max_size=4),
    max_leaves=25,
)


@given(st.lists(values, min_size=1, max_size=3), st.sampled_from([None, True, False]),
       st.sampled_from([None, "'", '"', "|", ">"]))
def test_dumped_documents_load_as_the_safe_loader_loads_them(
    docs: list[Any], flow: bool | None, style: str | None
) -> None:
    text = yaml.dump_all(docs, default_flow_style=flow, default_style=style,
                         allow_unicode=True)
    same(text)


def test_aliases_are_refused_with_where_the_anchor_is(tmp_path: Path) -> None:
    path = tmp_path / "alias.yaml"
    path.write_text("a: &x {b: 1}\nc: *x\n")
    with pytest.raises(SnapshotFileError, match=r"alias\.yaml:1:4: not valid YAML: YAML "
                                                r"aliases \(\*name\) are not accepted"):
        load_documents([path])


def test_billion_laughs_is_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    path = tmp_path / "laughs.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SnapshotFileError, match="aliases"):
        load_documents([path])


def test_self_reference_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cycle.yaml"
    path.write_text("a: &x [1, *x]\n")
    with pytest.raises(SnapshotFileError, match="aliases"):
        load_documents([path])


@pytest.mark.parametrize("alias", ["", "a: &x 1\nb: *x\n"])
def test_deep_nesting_is_an_error_not_a_crash(tmp_path: Path, alias: str) -> None:
    """A hundred thousand levels: libyaml's composer recurses in C (the safe loader alone
    crashed the process); with an alias the file takes the safe loader's path."""
    depth = 100_000
    path = tmp_path / "deep.yaml"
    path.write_text(alias + "items: " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(SnapshotFileError, match=f"nested deeper than {MAX_DEPTH} levels"):
        load_documents([path])
    inner = MAX_DEPTH - 1  # the mapping is a level too
    path.write_text("items: " + "[" * inner + "]" * inner + "\n")
    (doc,) = load_documents([path])
    assert isinstance(doc, dict)


def test_a_value_no_constructor_accepts_is_an_error_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "date.yaml"
    path.write_text("a: 2026-13-45\n")
    with pytest.raises(SnapshotFileError, match=r"date\.yaml: not valid YAML: month must be"):
        load_documents([path])


def test_deep_json_is_an_error_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"items": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(SnapshotFileError, match="nested too deeply"):
        load_documents([path])


def test_without_libyaml_the_same_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "a: [yes, '1', 2, 2026-01-05, ~]\nb: {c: 1.5}\n"
    fast = load_all(text)
    monkeypatch.setattr(yamlload, "_BaseLoader", yaml.SafeLoader)
    assert typed(load_all(text)) == typed(fast) == typed(safe(text))
