"""Session fixtures for the real control plane (see tests/support/plane.py and kube.py).

- ``plane``: etcd + kube-apiserver + Kueue (PriorityBoost on), one per session.
- ``e2e_plane``: the same plane plus kube-controller-manager, kube-scheduler and kwok.
- ``api``: an admin ``kubernetes.client.ApiClient``; ``kubeconfig``: its file.
- ``namespace``: a fresh namespace per test.

When the binaries or Go are missing the plane fixtures FAIL with a message saying what is
missing; they never skip. Log tails of all plane processes are attached to failing tests.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tests.support import kube
from tests.support.plane import Plane
from tests.support.procs import PlaneError

_PLANE: Plane | None = None
_SUMMARY: dict[str, object] = {}
_PLANE_FIXTURES = {"plane", "e2e_plane", "api", "namespace", "kubeconfig"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests under tests/unit are the `unit` tier (`make unit`, no Go-built tool), except those
    marked `tools` (they need tools/bin, e.g. helm)."""
    unit_dir = Path(__file__).parent / "unit"
    for item in items:
        if item.path.is_relative_to(unit_dir) and item.get_closest_marker("tools") is None:
            item.add_marker(pytest.mark.unit)


@pytest.fixture(scope="session")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    """etcd + kube-apiserver + Kueue (PriorityBoost on), shared by the session."""
    global _PLANE
    p = Plane(tmp_path_factory.mktemp("plane"))
    try:
        p.start()
    except PlaneError as e:
        pytest.fail(f"test control plane did not start: {e}", pytrace=False)
    _PLANE = p
    try:
        yield p
    finally:
        rss = p.peak_rss_kb()
        p.stop()
        _SUMMARY.update({
            "start timings (s)": {k: round(v, 2) for k, v in p.timings.items()},
            "peak RSS (MiB)": {k: round(v / 1024) for k, v in rss.items()},
            "peak RSS total (MiB)": round(sum(rss.values()) / 1024),
            "logs": str(p.logs)})
        (p.workdir / "plane-summary.json").write_text(json.dumps(_SUMMARY, indent=2))
        _PLANE = None


@pytest.fixture(scope="session")
def e2e_plane(plane: Plane) -> Plane:
    """``plane`` plus kube-controller-manager, kube-scheduler and kwok (Jobs really run)."""
    try:
        plane.start_e2e()
    except PlaneError as e:
        pytest.fail(f"end-to-end plane did not start: {e}", pytrace=False)
    return plane


@pytest.fixture(scope="session")
def api(plane: Plane) -> k8s.ApiClient:
    """Admin (system:masters) ApiClient for the session plane."""
    return plane.api_client()


@pytest.fixture(scope="module")
def admin(plane: Plane) -> k8s.ApiClient:
    """An admin ApiClient of one module's own (the module impersonates its users from it)."""
    return plane.api_client()


@pytest.fixture(scope="module")
def suffix() -> str:
    """A random suffix for one module's names on the shared plane."""
    return uuid.uuid4().hex[:5]


@pytest.fixture(scope="session")
def kubeconfig(plane: Plane) -> Path:
    """Path of an admin kubeconfig for the session plane."""
    return plane.kubeconfig


@pytest.fixture
def namespace(api: k8s.ApiClient) -> str:
    """A fresh, uniquely named namespace for one test (left behind afterwards)."""
    return kube.create_namespace(api)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and _PLANE is not None and \
            _PLANE_FIXTURES & set(getattr(item, "fixturenames", ())):
        report.sections.append(("control plane logs (tails)", _PLANE.logs_tail(25)))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SUMMARY:
        terminalreporter.write_sep("-", "test control plane")
        for k, v in _SUMMARY.items():
            terminalreporter.write_line(f"{k}: {v}")
