"""controller/live/secure_metrics.py (authn/authz decisions) and the bounded team label of
controller/live/metrics.py, offline. The HTTPS server itself is proven against the real API
server in tests/plane/test_redteam.py (S8)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import generate_latest

from controller.live.api import ApiError
from controller.live.metrics import MAX_TEAM_SERIES, OTHER_TEAM, Metrics, bound_teams
from controller.live.secure_metrics import (
    SUBJECT_ACCESS_REVIEWS,
    TOKEN_REVIEWS,
    TokenAuthorizer,
)


class FakeApi:
    """Answers TokenReviews from `tokens` (token -> user) and SARs from `allowed` users."""

    def __init__(self, tokens: Mapping[str, str], allowed: set[str]) -> None:
        self.tokens, self.allowed = dict(tokens), allowed
        self.calls: list[tuple[str, Any]] = []
        self.fail = False

    def request(self, method: str, path: str, *, query: Mapping[str, str] | None = None,
                body: Any = None, content_type: str | None = None,
                timeout: float | None = None) -> Any:
        self.calls.append((path, body))
        if self.fail:
            raise ApiError(0, "connection refused")
        if path == TOKEN_REVIEWS:
            user = self.tokens.get(body["spec"]["token"])
            return {"status": {"authenticated": user is not None,
                               "user": {"username": user, "groups": ["g"]} if user else {}}}
        assert path == SUBJECT_ACCESS_REVIEWS
        spec = body["spec"]
        assert spec["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
        assert spec["groups"] == ["g"]
        return {"status": {"allowed": spec["user"] in self.allowed}}

    def stream(self, path: str, *, query: Mapping[str, str] | None = None,
               timeout: float | None = None) -> Any:
        raise NotImplementedError


def test_no_token_bad_token_forbidden_and_allowed() -> None:
    api = FakeApi({"t-prom": "prom", "t-eve": "eve"}, {"prom"})
    auth = TokenAuthorizer(api)
    assert auth.decide(None).code == 401
    assert auth.decide("Basic abc").code == 401
    assert auth.decide("Bearer nope").code == 401
    d = auth.decide("Bearer t-eve")
    assert (d.code, d.user) == (403, "eve") and "may not get /metrics" in d.why
    assert auth.decide("bearer t-prom").code == 200


def test_answers_are_cached_per_token_for_the_ttl_and_failures_are_not() -> None:
    now = [0.0]
    api = FakeApi({"t": "prom"}, {"prom"})
    auth = TokenAuthorizer(api, cache_ttl=60, clock=lambda: now[0])
    assert auth.decide("Bearer t").code == 200
    assert auth.decide("Bearer t").code == 200
    assert len(api.calls) == 2  # one TokenReview + one SAR
    now[0] = 61
    api.allowed.clear()  # the binding was removed: seen after the TTL
    assert auth.decide("Bearer t").code == 403
    api.fail = True
    now[0] = 200
    assert auth.decide("Bearer t").code == 503
    api.fail = False
    api.allowed.add("prom")
    assert auth.decide("Bearer t").code == 200


def test_team_series_are_bounded_with_an_other_bucket() -> None:
    shares = {f"t{i:03d}": i / 1000 for i in range(250)}
    out = bound_teams(shares, limit=10, known=frozenset({"t000"}))
    assert len(out) == 10 and "t000" in out and out[OTHER_TEAM] == max(
        v for k, v in shares.items() if k not in out)
    assert {k for k in out if k not in (OTHER_TEAM, "t000")} == {
        f"t{i:03d}" for i in range(242, 250)}
    assert bound_teams({"a": 1.0}, limit=10) == {"a": 1.0}


def test_metrics_bound_the_team_gauge() -> None:
    m = Metrics()
    m.set_labelled(m.dominant_share, {f"team-{i}": 0.001 * i for i in range(1000)})
    text = generate_latest(m.registry).decode()
    series = [ln for ln in text.splitlines() if ln.startswith("wdrf_team_dominant_share{")]
    assert len(series) == MAX_TEAM_SERIES
    assert any(f'team="{OTHER_TEAM}"' in ln for ln in series)
    m.set_labelled(m.pending, {f"c{i}": 1 for i in range(200)})  # other gauges: unchanged
    assert generate_latest(m.registry).decode().count("wdrf_pending_workloads{") == 200
