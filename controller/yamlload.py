"""Loading YAML snapshots: fast, safe, and the same objects as PyYAML's safe loader.

PyYAML builds a node graph and then constructs Python objects from it in Python, which takes
most of the time on a big snapshot (a 15,000-object `kubectl get -o yaml` took about 20x as
long as the same as JSON) and memory. `load_all` instead builds the objects straight from the
parser's events (libyaml's when installed, PyYAML's own otherwise), resolving plain scalars
with the loader's own YAML 1.1 resolvers and constructors, so the result is what the safe
loader gives. Anything out of the ordinary for Kubernetes output (an alias, a merge key, an
explicit tag other than a standard scalar one, a collection as a key, any error) is handed
to the safe loader, which decides exactly as before, error messages included.

The safe loader here (`SafeNoAliasLoader`) refuses aliases: Kubernetes output never has them,
and an alias is how a hostile file explodes (a self-reference gives a cycle, "billion laughs"
expands 10^9-fold when walked). Nesting is bounded (`MAX_DEPTH`): Kubernetes objects nest a
few dozen levels, and libyaml's composer recurses in C, so a file nested a hundred thousand
levels deep would crash the process rather than fail.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.error import MarkedYAMLError
from yaml.events import (
    AliasEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from yaml.nodes import ScalarNode

__all__ = ["MAX_DEPTH", "SafeNoAliasLoader", "TooDeep", "load_all"]

MAX_DEPTH = 256

# libyaml's parser when installed: several times faster than PyYAML's own.
_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_STR = "tag:yaml.org,2002:str"
# Plain scalars the safe loader treats as structure, not values (merge keys, `=`).
_STRUCTURAL = frozenset({"tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"})
_CACHED_LENGTH = 40  # plain scalars shorter than this (keys, small values) are resolved once


class SafeNoAliasLoader(_BaseLoader):  # type: ignore[misc]
    """The safe loader without aliases. The node graph is built without expanding, so
    rejecting the second visit of a node is fast."""

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        if node in self.constructed_objects or node in self.recursive_objects:
            raise yaml.constructor.ConstructorError(
                None, None,
                "YAML aliases (*name) are not accepted in a snapshot; one refers to the node "
                "anchored here",
                node.start_mark,
            )
        return super().construct_object(node, deep)


class TooDeep(MarkedYAMLError):
    """A document nested deeper than MAX_DEPTH."""


class _Unusual(Exception):
    """Something the fast path leaves to the safe loader."""


def load_all(text: str) -> list[object]:
    """Every document in `text` (None for an empty one), as `yaml.load_all` with
    `SafeNoAliasLoader` gives them; raises what it raises (a `yaml.YAMLError`), or `TooDeep`."""
    try:
        return _fast(text)
    except TooDeep:
        raise
    except Exception:
        _check_depth(text)  # before the safe loader, whose composer recurses in C
        return list(yaml.load_all(text, Loader=SafeNoAliasLoader))


def _fast(text: str) -> list[object]:
    loader = _BaseLoader(text)
    resolvers = loader.yaml_implicit_resolvers
    constructors = loader.yaml_constructors
    get = loader.get_event

    def scalar(ev: Any) -> object:
        tag, value = ev.tag, ev.value
        if tag is None or tag == "!":
            tag = _STR
            if ev.implicit[0]:
                for candidate, regexp in resolvers.get(value[:1], ()):
                    if regexp.match(value):
                        tag = candidate
                        break
        if tag == _STR:
            return value
        construct = constructors.get(tag)
        if construct is None or tag in _STRUCTURAL:
            raise _Unusual(tag)
        return construct(loader, ScalarNode(tag, value, ev.start_mark, ev.end_mark, ev.style))

    docs: list[object] = []
    resolved: dict[str, object] = {}
    stack: list[tuple[Any, bool]] = []
    top: Any = None  # the collection being filled (None: at document level)
    in_list = False
    key: object = _NO_KEY
    try:
        while True:
            ev = get()
            kind = type(ev)
            if kind is ScalarEvent:
                if ev.tag is None and ev.implicit[0]:  # plain: resolved by its text alone
                    obj = resolved.get(ev.value, _NO_KEY)
                    if obj is _NO_KEY:
                        obj = scalar(ev)
                        if len(ev.value) < _CACHED_LENGTH:
                            resolved[ev.value] = obj
                elif ev.tag is None:  # quoted, block: a string
                    obj = ev.value
                else:
                    obj = scalar(ev)
                if in_list:
                    top.append(obj)
                elif top is None:
                    docs.append(obj)
                elif key is _NO_KEY:
                    key = obj
                else:
                    top[key] = obj
                    key = _NO_KEY
            elif kind is MappingStartEvent or kind is SequenceStartEvent:
                if ev.tag is not None and not ev.implicit:
                    raise _Unusual(ev.tag)
                if len(stack) >= MAX_DEPTH:
                    raise _too_deep(ev)
                new: Any = {} if kind is MappingStartEvent else []
                if in_list:
                    top.append(new)
                elif top is not None:
                    if key is _NO_KEY:
                        raise _Unusual("a collection as a key")
                    top[key] = new
                    key = _NO_KEY
                stack.append((top, in_list))
                top, in_list = new, kind is SequenceStartEvent
            elif kind is MappingEndEvent or kind is SequenceEndEvent:
                done = top
                top, in_list = stack.pop()
                if top is None:
                    docs.append(done)
            elif kind is StreamEndEvent:
                return docs
            elif kind is AliasEvent:
                raise _Unusual("alias")
    finally:
        loader.dispose()


_NO_KEY: Any = object()


def _too_deep(ev: Any) -> TooDeep:
    return TooDeep(problem=f"nested deeper than {MAX_DEPTH} levels", problem_mark=ev.start_mark)


def _check_depth(text: str) -> None:
    """Raise `TooDeep` when a document nests deeper than MAX_DEPTH (parse errors are left to
    the caller's loader)."""
    depth = 0
    try:
        for ev in yaml.parse(text, Loader=_BaseLoader):
            if isinstance(ev, MappingStartEvent | SequenceStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise _too_deep(ev)
            elif isinstance(ev, MappingEndEvent | SequenceEndEvent):
                depth -= 1
    except yaml.YAMLError as exc:
        if isinstance(exc, TooDeep):
            raise
