"""Reading the apiserver's audit log as the witness of what controller replicas sent.

Each replica names itself in its User-Agent (`wdrf-controller/<identity>`, the identity it
also writes as the Lease holder), so the audit log tells the replicas apart even though they
share one credential.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

UA_PREFIX = "wdrf-controller/"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete"})


@dataclass(frozen=True)
class Write:
    at: datetime  # when the apiserver finished it (stageTimestamp of ResponseComplete)
    received: datetime
    identity: str
    verb: str
    resource: str
    namespace: str
    name: str
    code: int


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def controller_writes(events: list[dict[str, Any]], ok_only: bool = True) -> list[Write]:
    """The controllers' completed write requests (successful ones unless `ok_only=False`),
    in the order they completed."""
    out = []
    for e in events:
        ua = str(e.get("userAgent", ""))
        if not ua.startswith(UA_PREFIX) or e.get("verb") not in WRITE_VERBS:
            continue
        if e.get("stage") != "ResponseComplete":
            continue
        code = int((e.get("responseStatus") or {}).get("code") or 0)
        if ok_only and not 200 <= code < 300:
            continue
        ref = e.get("objectRef") or {}
        out.append(Write(ts(e["stageTimestamp"]), ts(e["requestReceivedTimestamp"]),
                         ua[len(UA_PREFIX):].split(" ")[0], str(e.get("verb")),
                         str(ref.get("resource", "")), str(ref.get("namespace", "")),
                         str(ref.get("name", "")), code))
    return sorted(out, key=lambda w: w.at)


def writer_epochs(writes: list[Write]) -> list[str]:
    """The replicas in the order they wrote; raises AssertionError if a replica wrote again
    after another one had started writing (two writers at once)."""
    epochs: list[str] = []
    for w in writes:
        if epochs and w.identity == epochs[-1]:
            continue
        assert w.identity not in epochs, (
            f"two writers: {w.identity} wrote {w.verb} {w.resource} {w.namespace}/{w.name} "
            f"at {w.at.isoformat()} after {epochs[-1]} had started writing; "
            f"epochs so far {epochs}")
        epochs.append(w.identity)
    return epochs


def watches(events: list[dict[str, Any]], identity: str, resource: str = "workloads"
            ) -> list[datetime]:
    """When the replica's watch requests for `resource` were received (one per request)."""
    seen: dict[str, datetime] = {}
    for e in events:
        if e.get("verb") != "watch" or not str(e.get("userAgent", "")).startswith(
                UA_PREFIX + identity):
            continue
        if (e.get("objectRef") or {}).get("resource") != resource:
            continue
        seen.setdefault(str(e.get("auditID")), ts(e["requestReceivedTimestamp"]))
    return sorted(seen.values())
