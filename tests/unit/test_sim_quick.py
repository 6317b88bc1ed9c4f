"""The quick evaluation on the real Philly trace (the tuning window, one seed): every policy
runs in the Kueue model and the simulator's invariants hold. Its run time is a benchmark figure
(`bench/trace_eval.py --quick`), not asserted here. The trace lives beside the repository at
../shared/traces/philly.csv (CI always has it); without it this test fails, it does not skip.

Trace: Jeon et al., USENIX ATC 2019 (Philly, CC BY 4.0).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.evaluate import check_goals, plot, render
from evaluation.experiment import ALL_POLICIES, Options, run_all
from evaluation.trace import DEFAULT_TRACE

TRACE = DEFAULT_TRACE


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
    opts = Options(trace=_trace(), quick=True)
    windows, records, epoch = run_all(opts, keep=lambda w, s: True)
    assert [w.role for w in windows] == ["tuning"]
    assert len(records) == len(ALL_POLICIES)
    for r in records:
        assert r.result is not None
        assert 0.95 <= r.load <= 1.05
        assert r.result.admissions == [1] * len(r.result.jobs), r.policy  # each job done once
        need = sum(j.need * j.duration for j in r.result.jobs)
        assert abs(sum(r.result.series.total) - need - r.result.lost) < 1e-6 * need, r.policy
        assert r.metrics["never_admitted"] == 0
    plots = plot(tmp_path, records)
    assert plots and all((tmp_path / p).is_file() for p in plots)
    text = render(opts, windows, records, epoch, 10.0, {}, plots, 1.0, "test")
    assert "Tuning window" in text
    # the goals are checked on held-out runs; here the machinery runs on the tuning run
    assert any(g.met is not None for g in check_goals(records, 10.0))
