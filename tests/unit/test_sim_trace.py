"""Trace handling: seeded labels, pod layout, windows with carry-in, load and sizing."""

from __future__ import annotations

import pytest

from controller.domain import PriorityClass
from evaluation import trace as tr


def test_generated_trace_is_seeded() -> None:
    a = tr.generate_trace(5, 200)
    b = tr.generate_trace(5, 200)
    c = tr.generate_trace(6, 200)
    assert a.jobs == b.jobs
    assert a.jobs != c.jobs
    assert list(a.jobs) == sorted(a.jobs, key=lambda j: j.submit)


def test_labels_are_seeded_and_roughly_the_asked_shares() -> None:
    jobs = tr.generate_trace(1, 5000).jobs
    spec = tr.LabelSpec(seed=3, urgent_share=0.05, approved_share=0.2, fractional_share=0.5)
    a = tr.label_jobs(jobs, spec)
    assert a == tr.label_jobs(jobs, spec)
    n = len(a)
    urgent = sum(j.cls is PriorityClass.URGENT for j in a) / n
    approved = sum(j.cls is PriorityClass.APPROVED for j in a) / n
    assert urgent == pytest.approx(0.05, abs=0.01)
    assert approved == pytest.approx(0.2, abs=0.02)
    singles = [j for j in a if j.pods == 1 and j.gpus_per_pod == 1]
    frac = [j for j in singles if j.fractional]
    assert len(frac) / len(singles) == pytest.approx(0.5, abs=0.03)
    assert {j.pct for j in frac} == {25, 50}
    assert all(not j.fractional for j in a if j.pods * j.gpus_per_pod > 1)


def test_pod_layout() -> None:
    assert tr.pod_layout(1, 8) == (1, 1)
    assert tr.pod_layout(8, 8) == (1, 8)
    assert tr.pod_layout(16, 8) == (2, 8)
    assert tr.pod_layout(12, 8) == (2, 6)
    assert tr.pod_layout(128, 8) == (16, 8)
    assert tr.pod_layout(17, 8) == (17, 1)


def _job(i: int, submit: float, duration: float, gpus: int = 1, pct: int = 100) -> tr.SimJob:
    return tr.SimJob(i, submit, duration, "t", PriorityClass.NORMAL, 1, gpus, pct)


def test_window_rebases_and_carries_running_jobs_in() -> None:
    jobs = [_job(0, 0, 50), _job(1, 90, 100), _job(2, 120, 10), _job(3, 300, 5)]
    w = tr.window(jobs, 100, 200)
    assert [(j.job_id, j.submit, j.duration, j.carried) for j in w] == [
        (0, 0.0, 90.0, True),  # job 1: started at 90, 90 s left at 100
        (1, 20.0, 10.0, False),
    ]
    assert [j.carried for j in tr.window(jobs, 100, 200, carry_in=False)] == [False]


def test_offered_load_and_sizing() -> None:
    # Two whole GPUs busy for the whole hour + a quarter GPU for half of it.
    jobs = [_job(0, 0, 3600, gpus=2), _job(1, 1800, 3600, pct=25)]
    assert tr.offered_load(jobs, 4, 0, 3600) == pytest.approx((2 + 0.125) / 4)
    assert tr.size_cluster(jobs, tr.Period(0, 3600), 1, 1.0) == 2


def test_missing_trace_file_says_where_it_should_be(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(FileNotFoundError, match=r"shared/traces/philly\.csv"):
        tr.load_philly(tmp_path / "nope.csv")


def test_load_philly_sorts_rows(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "t.csv"
    p.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-01 00:10:00,60.0,2,120.0,b\n"
        "2017-10-01 00:00:00,30.0,1,30.0,a\n"
    )
    t = tr.load_philly(p)
    assert [(j.submit, j.duration, j.gpus, j.team) for j in t.jobs] == [
        (0.0, 30.0, 1, "a"), (600.0, 60.0, 2, "b")
    ]
