"""The Dockerfile, checked by parsing it (no Docker engine runs here, so the image is never
built in this suite): pinned slim base, multi-stage, dependencies from requirements.lock,
numeric non-root USER matching the Deployment, nothing built or installed in the final stage,
`python -m controller` entrypoint, and a .dockerignore that keeps the build context small
without dropping anything the Dockerfile copies.
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE_RE = re.compile(r"^python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?$")
BUILD_TOOLS = ("gcc", "g++", "cc ", "clang", "make", "build-essential", "apt-get", "apk ", "dpkg")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.instructions if o == op]


def logical_lines(text: str) -> list[str]:
    """Join backslash continuations, drop comments and blank lines."""
    out: list[str] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append(buf + line)
        buf = ""
    assert not buf, "dangling line continuation"
    return out


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical_lines(text):
        op, _, rest = line.partition(" ")
        op = op.upper()
        rest = rest.strip()
        if op == "ARG" and not stages:
            k, _, v = rest.partition("=")
            args[k] = v
        elif op == "FROM":
            m = re.match(r"^(\S+)(?:\s+AS\s+(\S+))?$", rest, re.IGNORECASE)
            assert m, line
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda g: args[g.group(1) or g.group(2)], m[1])
            stages.append(Stage(base=base, name=m[2]))
        else:
            assert stages, f"{op} before FROM"
            stages[-1].instructions.append((op, rest))
    return args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse((ROOT / "Dockerfile").read_text(encoding="utf-8"))[1]


def test_parser_sees_through_args_and_continuations() -> None:
    _, st = parse("ARG B=python:3.11.2-slim-bookworm\nFROM ${B} AS x\nRUN a \\\n  b\nUSER 1\n")
    assert st[0].base == "python:3.11.2-slim-bookworm" and st[0].name == "x"
    assert st[0].all("RUN") == ["a  b"]


def test_multi_stage_on_a_pinned_slim_base(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    for s in stages:
        assert BASE_RE.match(s.base), f"base not pinned to python:3.11.N-slim-bookworm: {s.base}"
    assert BASE_RE.match("python:3.11-slim-bookworm") is None  # a floating tag is rejected
    assert BASE_RE.match("python:latest") is None


def test_dependencies_come_from_the_lock(stages: list[Stage]) -> None:
    build = stages[0]
    copies = " ".join(build.all("COPY"))
    assert "requirements.lock" in copies
    installs = [r for r in build.all("RUN") if "pip install" in r]
    assert any("-r requirements.lock" in r for r in installs), installs
    lock = (ROOT / "requirements.lock").read_text(encoding="utf-8").split()
    assert lock and all(re.match(r"^[A-Za-z0-9_.\-]+==[0-9][^=]*$", x) for x in lock), lock
    # The project itself goes in without pulling anything unpinned.
    assert all("--no-deps" in r for r in installs), installs


def test_final_stage_is_non_root_numeric_and_has_no_build_tools(stages: list[Stage]) -> None:
    final = stages[-1]
    users = final.all("USER")
    assert users, "final stage sets no USER"
    m = re.match(r"^(\d+)(?::(\d+))?$", users[-1])
    assert m, f"USER must be numeric (runAsNonRoot needs a numeric UID): {users[-1]}"
    uid = int(m[1])
    assert uid != 0 and (m[2] is None or int(m[2]) != 0)
    # Nothing is installed or compiled in the final stage: it only copies the built venv.
    assert final.all("RUN") == [], final.all("RUN")
    text = " ".join(a for _, a in final.instructions).lower()
    for tool in BUILD_TOOLS:
        assert tool not in text, tool
    copies = final.all("COPY")
    assert copies and all(c.startswith(f"--from={stages[0].name}") for c in copies), copies
    # The same UID as the Deployment's securityContext.
    dep = yaml.safe_load((ROOT / "manifests" / "deployment.yaml").read_text(encoding="utf-8"))
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == uid
    assert pod["containers"][0]["securityContext"]["runAsUser"] == uid


def test_entrypoint_is_python_m_controller(stages: list[Stage]) -> None:
    (entry,) = stages[-1].all("ENTRYPOINT")
    assert json.loads(entry) == ["python", "-m", "controller"]  # exec form, no shell
    assert not stages[-1].all("CMD") or json.loads(stages[-1].all("CMD")[0])


def test_the_planner_is_compiled_with_the_dev_locks_mypy(stages: list[Stage]) -> None:
    """By default the build stage compiles the planner (tools/compile.py) with mypy and what it
    needs at requirements-dev.lock's pins: each package it picks from that lock is pinned
    there. The image itself is built and checked by tests/plane/test_image.py."""
    build = stages[0]
    assert "COMPILED=true" in build.all("ARG")
    runs = " ".join(build.all("RUN"))
    assert "tools/compile.py" in runs
    (picked,) = re.findall(r"grep -E '\^\(([^)]*)\)=='\s+requirements-dev\.lock", runs)
    lock = (ROOT / "requirements-dev.lock").read_text(encoding="utf-8").split()
    pinned = {x.split("==")[0] for x in lock if "==" in x}
    names = picked.split("|")
    assert "mypy" in names and set(names) <= pinned, set(names) - pinned


def _ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore semantics, enough for this file: last matching pattern wins; a pattern
    matches a path or any of its parent folders."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for p in patterns:
        neg = p.startswith("!")
        pat = p[1:] if neg else p
        pat = pat.rstrip("/")
        if any(fnmatch.fnmatch(c, pat) for c in candidates):
            ignored = not neg
    return ignored


def test_dockerignore_keeps_what_is_copied_and_drops_the_rest(stages: list[Stage]) -> None:
    patterns = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if ln.strip() and not ln.strip().startswith("#")
    ]
    sources: list[str] = []
    for s in stages:
        for c in s.all("COPY"):
            if c.startswith("--from"):
                continue
            *src, _dest = c.split()
            sources += src
    assert sources
    for src in sources:
        path = ROOT / src
        assert path.exists(), src
        files = [path] if path.is_file() else [p for p in path.rglob("*.py")]
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            assert not _ignored(rel, patterns), f"{rel} is copied but .dockerignore drops it"
    # a compiled build in the tree (make compiled) too: the image compiles its own
    for never in (".venv/bin/python", ".git/config", "tools/bin/kube-apiserver", "tests/x.py",
                  "evaluation/kueue.py", "bench/trace_eval.py", "controller/.compiled-sources",
                  "controller/policy.cpython-311-x86_64-linux-gnu.so"):
        assert _ignored(never, patterns), never


def test_the_wheel_carries_the_controller_package_only() -> None:
    """The evaluation, the benchmarks and the test stand-ins (the fake NVML) stay out of the
    wheel: setuptools' package discovery with pyproject's own settings finds `controller*` only,
    and nothing under controller/ is a test stand-in or pulls in the evaluation's matplotlib."""
    from setuptools import find_namespace_packages

    found = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    include = found["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_namespace_packages(str(ROOT), include=include)  # pyproject: namespaces on
    assert "controller" in packages and "controller.agent" in packages
    assert all(p == "controller" or p.startswith("controller.") for p in packages), packages
    for f in (ROOT / "controller").rglob("*.py"):
        text = f.read_text(encoding="utf-8")
        assert "fake" not in f.name, f
        assert "import matplotlib" not in text and "from evaluation" not in text, f
