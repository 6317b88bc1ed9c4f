"""Build the planner's modules with mypyc (optional; `make compiled`).

Compiles a copy of the planner's per-Workload modules into C extensions and puts them beside
their sources (controller/*.so): Python imports an extension before the .py of the same name,
so the compiled build is used until `--clean` removes them. Pure Python stays the reference:
the sources are not changed, and the plans must be the same either way
(tests/unit/test_compiled.py).

One change is made to the copy that is compiled: a dataclass gets its `__init__` written
out in the class. The one `dataclasses` generates is Python code even in a compiled class
(and `fast_init`'s, which sets each slot through its descriptor, keeps the class from being
compiled at all), so constructing the objects a plan builds per Workload would stay
interpreted. The written `__init__` has the dataclass's signature (names, order, defaults)
and sets the fields directly; `frozen` still holds for every other assignment.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The modules a plan spends its time in (the per-Workload stages and the types they build).
MODULES = ["policy", "accounting", "encoding", "hami", "classify", "domain", "plan"]
GROUP = "controller._compiled"  # one shared library for the group: controller/_compiled__mypyc*.so
BUILD = ROOT / "build" / "mypyc"
# What the build was made from: each compiled module's source hash (tests/unit/test_compiled.py
# fails on a build older than its sources, which Python would import instead of them).
STAMP = ROOT / "controller" / ".compiled-sources"
_SIMPLE_DEFAULTS = (type(None), bool, int, float, str, tuple)


def _init_source(cls: type, frozen: bool) -> list[str] | None:
    """The lines of an `__init__` for dataclass `cls` (indented for its body), or None when
    it cannot be written out (a default factory, a default with no literal, __post_init__)."""
    if "__post_init__" in vars(cls):
        return None
    params, body = [], []
    for f in dataclasses.fields(cls):
        if not f.init or f.kw_only or f.default_factory is not dataclasses.MISSING:
            return None
        annotation = f.type if isinstance(f.type, str) else None
        if annotation is None:
            return None
        if f.default is dataclasses.MISSING:
            params.append(f"{f.name}: {annotation}")
        else:
            if type(f.default) not in _SIMPLE_DEFAULTS or f.default != ast.literal_eval(
                    repr(f.default)):
                return None
            params.append(f"{f.name}: {annotation} = {f.default!r}")
        ignore = "  # type: ignore[misc]" if frozen else ""
        body.append(f"        self.{f.name} = {f.name}{ignore}")
    return [f"    def __init__(self, {', '.join(params)}) -> None:", *body]


def _is_dataclass_decorator(d: ast.expr) -> bool:
    target = d.func if isinstance(d, ast.Call) else d
    return isinstance(target, ast.Name) and target.id == "dataclass"


def _frozen(d: ast.expr) -> bool:
    return isinstance(d, ast.Call) and any(
        k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in d.keywords)


def transform(name: str) -> tuple[str, list[str]]:
    """Module `controller.<name>`'s source with each dataclass's `__init__` written out (and
    `@fast_init` dropped from those), and the names of the classes changed."""
    path = ROOT / "controller" / f"{name}.py"
    source = path.read_text()
    lines = source.splitlines()
    module = importlib.import_module(f"controller.{name}")
    inserts: list[tuple[int, list[str]]] = []  # (after line, lines)
    drops: set[int] = set()
    changed = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        deco = next((d for d in node.decorator_list if _is_dataclass_decorator(d)), None)
        if deco is None or any(isinstance(s, ast.FunctionDef) and s.name == "__init__"
                               for s in node.body):
            continue
        init = _init_source(getattr(module, node.name), _frozen(deco))
        if init is None:
            continue
        for d in node.decorator_list:
            if isinstance(d, ast.Name) and d.id == "fast_init":
                drops.add(d.lineno - 1)
        assert node.end_lineno is not None
        inserts.append((node.end_lineno, ["", *init]))
        changed.append(node.name)
    out: list[str] = []
    pending = dict(inserts)
    for i, line in enumerate(lines, start=1):
        if i - 1 not in drops:
            out.append(line)
        if i in pending:
            out.extend(pending[i])
    return "\n".join(out) + "\n", changed


def build() -> None:
    sys.path.insert(0, str(ROOT))
    clean()
    src = BUILD / "src"
    shutil.rmtree(BUILD, ignore_errors=True)
    # The whole package (mypy follows its imports), the compiled modules transformed.
    shutil.copytree(ROOT / "controller", src / "controller",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for name in MODULES:
        text, changed = transform(name)
        (src / "controller" / f"{name}.py").write_text(text)
        print(f"controller/{name}.py: __init__ written out for {', '.join(changed) or 'none'}")
    sources = [f"controller/{m}.py" for m in MODULES]
    setup = BUILD / "setup.py"
    setup.write_text(
        "from setuptools import setup\n"
        "from mypyc.build import mypycify\n"
        f"setup(name='wdrf-compiled', ext_modules=mypycify({sources!r}, group_name={GROUP!r},"
        " opt_level='3'))\n")
    subprocess.run([sys.executable, str(setup), "build_ext", "--inplace"], cwd=src, check=True)
    try:  # all of the group or none of it (a failed build leaves pure Python in place)
        for built in (src / "controller").glob("*.so"):
            shutil.copy2(built, ROOT / "controller" / built.name)
            print(f"controller/{built.name}")
        STAMP.write_text(source_hashes())
    except BaseException:
        clean()
        raise


def source_hashes() -> str:
    """One line per compiled module: its name and its source's SHA-256."""
    return "".join(
        f"{name} {hashlib.sha256((ROOT / 'controller' / f'{name}.py').read_bytes()).hexdigest()}\n"
        for name in MODULES)


def clean() -> None:
    for built in (ROOT / "controller").glob("*.so"):
        built.unlink()
    STAMP.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules")
    args = parser.parse_args()
    if args.clean:
        clean()
    else:
        build()


if __name__ == "__main__":
    main()
