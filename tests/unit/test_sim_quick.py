"""The quick window of the real Philly trace: every policy and the simulator's invariants.
Its run time (goal <= 60 s) is measured by `bench/trace_eval.py --quick`, not asserted here.
The trace lives beside the repository at ../shared/traces/philly.csv (CI always has it);
without it this test fails, it does not skip.

Trace: Jeon et al., USENIX ATC 2019 (Philly, CC BY 4.0).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.sim.experiment import ALL_POLICIES, Options, run

TRACE = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "philly.csv"


def _trace() -> Path:
    if not TRACE.is_file():
        pytest.fail(
            f"Philly trace not found at {TRACE}: the evaluation needs ../shared/traces/philly.csv "
            "beside the repository (see ../shared/traces/README.md)",
            pytrace=False,
        )
    return TRACE


@pytest.mark.slow
def test_quick_window_all_policies(tmp_path: Path) -> None:
    exp = run(Options(trace=_trace(), quick=True), out=tmp_path)
    assert [r.policy for r in exp.results][: len(ALL_POLICIES) - 1] == [
        "FIFO", "Static classes", "Kueue AFS (model)", "DRF (ideal)", "WDRF"
    ]
    assert 0.9 <= exp.info.load <= 1.1
    for r, m in zip(exp.results, exp.metrics, strict=True):
        assert r.admissions == [1] * len(exp.jobs), r.policy  # every job admitted exactly once
        assert m.gpu_time_error < 1e-9, r.policy  # GPU-time conserved
        assert m.never_admitted == 0
        assert 0.5 < m.utilisation <= 1.0
    wdrf = exp.results[4]
    assert wdrf.extra["plan_calls"] > 1000  # the controller's compute_plan drove the order
    assert wdrf.writes > 0
    assert any(j.fractional for j in exp.jobs) and max(r.max_tenants for r in exp.results) >= 2
    report = (tmp_path / "report.md").read_text()
    assert "USENIX ATC 2019" in report and "synthetic" in report
    for png in ("wait_cdf.png", "team_share.png", "utilisation.png"):
        assert (tmp_path / png).stat().st_size > 10_000


@pytest.mark.slow
def test_quick_window_no_gpu_ever_overcommitted() -> None:
    """Every GPU and every aggregate re-checked after every event, FIFO and WDRF."""
    exp = run(Options(trace=_trace(), quick=True, policies=("fifo", "wdrf"),
                      check_invariants=True))
    for r in exp.results:
        assert r.overcommit_checks > len(exp.jobs)
        assert r.admissions == [1] * len(exp.jobs)
