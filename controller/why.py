"""`python -m controller why NAMESPACE/NAME` (and `kubectl wdrf why NAME`): why is my job waiting?

For ordinary users: it needs only namespace-scoped reads (get/list Workloads, get LocalQueues
in the user's namespace) and never lists anything cluster-wide. It

* resolves NAME to its Workload: a Workload of that name, else the Workload whose owner
  reference names it (a Job, JobSet, RayJob, PyTorchJob, LeaderWorkerSet... any owner kind);
* shows Kueue's own state and pending reason (the Workload's conditions, requeue backoff);
* shows the queue position from Kueue's visibility API (`visibility.kueue.x-k8s.io`
  pendingworkloads of the LocalQueue) when it is served, else the position among the
  namespace's own pending Workloads in that LocalQueue (said so);
* shows the class, team, fairness level, wait, base, override and priority the controller
  published on the Workload (annotation `wdrf.x-k8s.io/priority-terms`, written with the
  priority), and what would move it.

Read-only: only GET requests.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import click

from controller.domain import (
    KUEUE_GROUP,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    PRIORITY_TERMS_ANNOTATION,
    pool_label,
)
from controller.render import machine, output_option
from controller.workload import (
    ADMITTED,
    FINISHED,
    QUOTA_RESERVED,
    Terms,
    annotations_of,
    condition,
    condition_true,
    controller_owner,
    effective_priority,
    is_active,
    is_finished,
    is_pending,
    meta,
    parse_int32,
)

TERMS_ANNOTATION = PRIORITY_TERMS_ANNOTATION
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
KUEUE_VERSIONS = ("v1beta2", "v1beta1")

JSON = dict[str, Any]

# Everything `why` reads, as (API group, resource, verb), all in the user's namespace: the
# ClusterRole manifests/why-reader.yaml grants exactly these (tests/unit/test_manifests.py).
READER_PERMISSIONS = (
    (KUEUE_GROUP, "workloads", "get"), (KUEUE_GROUP, "workloads", "list"),
    (KUEUE_GROUP, "localqueues", "get"),
    (VISIBILITY_GROUP, "localqueues/pendingworkloads", "get"),
)


class Api(Protocol):
    """`controller.live.kube.KubeTransport` (or the tests' fake apiserver)."""

    def request(self, method: str, path: str, *, query: Mapping[str, str] | None = None,
                body: Any = None, content_type: str | None = None,
                timeout: float | None = None) -> Any: ...


class WhyError(Exception):
    """A one-line answer for the user (exit code 1)."""


def status_of(exc: Exception) -> int:
    return int(getattr(exc, "status", -1))


# ---------------------------------------------------------------------------------------------
# The priority terms, for people


def usage_over_entitlement(level: int, levels: int) -> tuple[float, float] | None:
    """The range of U/S (usage over entitlement) a fairness level stands for: the level is
    floor(2^(-U/S) x levels), so U/S lies in [-log2((level+1)/levels), -log2(level/levels))."""
    if levels <= 0 or not 0 <= level <= levels:
        return None
    low = max(0.0, -math.log2(min(level + 1, levels) / levels))
    high = math.inf if level == 0 else -math.log2(level / levels)
    return low, high


# ---------------------------------------------------------------------------------------------
# Reading


def kueue_version(api: Api) -> str:
    """The Kueue API version to read: v1beta2 unless only v1beta1 is served (group discovery,
    which every authenticated user may read)."""
    try:
        group = api.request("GET", f"/apis/{KUEUE_GROUP}")
    except Exception as exc:
        if status_of(exc) == 404:
            raise WhyError("Kueue is not installed on this cluster (no kueue.x-k8s.io API)"
                           ) from None
        raise
    served = [v.get("version") for v in (group or {}).get("versions", [])]
    for v in KUEUE_VERSIONS:
        if v in served:
            return v
    raise WhyError(f"this cluster serves kueue.x-k8s.io {served}, none of {KUEUE_VERSIONS}")


def _forbidden(what: str, ns: str) -> WhyError:
    return WhyError(f"not allowed to {what} in namespace {ns}: ask for read access to "
                    f"workloads.kueue.x-k8s.io there (e.g. Kueue's kueue-batch-user-role)")


def _get(api: Api, path: str) -> JSON | None:
    try:
        obj = api.request("GET", path)
    except Exception as exc:
        if status_of(exc) == 404:
            return None
        raise
    return obj if isinstance(obj, dict) else None


def _ts(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        ts = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def _created(wl: JSON) -> datetime:
    return _ts((wl.get("metadata") or {}).get("creationTimestamp")) or datetime.min.replace(
        tzinfo=UTC)


def _owner_matches(ref: JSON, name: str, kind: str | None) -> bool:
    if ref.get("name") != name:
        return False
    if not kind:
        return True
    k = kind.lower()
    ref_kind = str(ref.get("kind", "")).lower()
    group = str(ref.get("apiVersion", "")).split("/")[0].lower()
    return k in (ref_kind, f"{ref_kind}.{group}")


def resolve(api: Api, version: str, ns: str, name: str,
            kind: str | None = None) -> tuple[JSON, list[JSON] | None]:
    """The Workload for NAME in NS -> (workload, the namespace's Workloads when listed)."""
    base = f"/apis/{KUEUE_GROUP}/{version}/namespaces/{ns}/workloads"
    if not kind or kind.lower() in ("workload", "workloads", "wl"):
        try:
            wl = _get(api, f"{base}/{name}")
        except Exception as exc:
            if status_of(exc) == 403:
                raise _forbidden("get workloads", ns) from None
            raise
        if wl is not None:
            return wl, None
        if kind:
            raise WhyError(f"no Workload {name} in namespace {ns}")
    try:
        items = list((api.request("GET", base) or {}).get("items") or [])
    except Exception as exc:
        if status_of(exc) == 403:
            raise _forbidden("list workloads", ns) from None
        raise
    owned = [w for w in items
             if any(_owner_matches(r, name, kind)
                    for r in (w.get("metadata") or {}).get("ownerReferences") or [])]
    if not owned:
        what = f"{kind} {name}" if kind else name
        raise WhyError(
            f"no Workload for {what} in namespace {ns}: neither a Workload of that name nor one "
            f"owned by it (is it submitted to Kueue, with label kueue.x-k8s.io/queue-name?)")
    kinds = {str(r.get("kind")) for w in owned
             for r in (w.get("metadata") or {}).get("ownerReferences") or []
             if r.get("name") == name}
    if len(kinds) > 1:
        raise WhyError(f"{name} names several owners in {ns} ({', '.join(sorted(kinds))}): "
                       "say which with --kind")
    # A re-created job may leave an old finished Workload behind: the live one, newest first.
    owned.sort(key=lambda w: (not is_finished(w), _created(w)), reverse=True)
    return owned[0], items


@dataclass
class Position:
    local: int | None = None  # 1-based position in the LocalQueue
    cluster: int | None = None  # 1-based position in the ClusterQueue
    of: int | None = None  # pending Workloads counted (local)
    source: str = ""  # "visibility" | "namespace" | ""
    note: str = ""


VISIBILITY_NOT_SERVED = "Kueue's visibility API (ClusterQueue-wide position) is not served"
VISIBILITY_FORBIDDEN = ("not allowed to read Kueue's visibility API (get "
                        "localqueues/pendingworkloads in visibility.kueue.x-k8s.io, e.g. the "
                        "wdrf-why-reader ClusterRole), so no ClusterQueue-wide position")


def visibility_position(api: Api, ns: str, queue: str, name: str,
                        why_not: list[str] | None = None) -> Position | None:
    """From Kueue's visibility API; None when it is not served or not allowed (then the
    reason, VISIBILITY_NOT_SERVED or VISIBILITY_FORBIDDEN, is appended to ``why_not``)."""
    forbidden = False
    for version in KUEUE_VERSIONS:
        path = (f"/apis/{VISIBILITY_GROUP}/{version}/namespaces/{ns}/localqueues/{queue}"
                "/pendingworkloads")
        try:
            doc = api.request("GET", path, query={"limit": "1000"})
        except Exception as exc:
            status = status_of(exc)
            if status in (404, 503, 403, 401, 0):
                forbidden = forbidden or status in (401, 403)
                continue
            raise
        items = list((doc or {}).get("items") or [])
        for item in items:
            if (item.get("metadata") or {}).get("name") == name:
                def pos(v: Any) -> int | None:
                    return int(v) + 1 if isinstance(v, int) else None
                return Position(local=pos(item.get("positionInLocalQueue")),
                                cluster=pos(item.get("positionInClusterQueue")),
                                of=len(items), source="visibility")
        return Position(of=len(items), source="visibility",
                        note="not (yet) in Kueue's pending list of this LocalQueue")
    if why_not is not None:
        why_not.append(VISIBILITY_FORBIDDEN if forbidden else VISIBILITY_NOT_SERVED)
    return None


def namespace_position(items: list[JSON], wl: JSON,
                       why_not: str = VISIBILITY_NOT_SERVED) -> Position:
    """Position among the namespace's own pending, active Workloads of the same LocalQueue,
    in Kueue's order (effective priority, then creation time); ``why_not`` says why Kueue's
    own position is not shown."""
    queue = (wl.get("spec") or {}).get("queueName")
    peers = [w for w in items
             if (w.get("spec") or {}).get("queueName") == queue and is_pending(w)
             and (w.get("spec") or {}).get("active", True) is not False]
    peers.sort(key=lambda w: (-effective_priority(w), _created(w),
                              (w.get("metadata") or {}).get("uid", "")))
    uid = (wl.get("metadata") or {}).get("uid")
    for i, w in enumerate(peers):
        if (w.get("metadata") or {}).get("uid") == uid:
            return Position(local=i + 1, of=len(peers), source="namespace",
                            note="among this namespace's pending Workloads in the LocalQueue; "
                                 + why_not)
    return Position(source="namespace", note="not pending")


# ---------------------------------------------------------------------------------------------
# The report


@dataclass
class Report:
    namespace: str
    name: str
    workload: str
    owner: str  # "Kind/name" or ""
    owner_kind: str
    queue: str
    cluster_queue: str
    state: str  # pending | held | admitted | quota-reserved | finished
    kueue_reason: str
    kueue_message: str
    evicted: str
    requeue_at: str
    priority: int
    boost: int | None
    terms: dict[str, str]
    created: str
    waited_seconds: float | None
    position: Position
    queue_pending: int | None
    advice: list[str] = field(default_factory=list)

    def as_dict(self) -> JSON:
        doc = dict(vars(self))
        doc["position"] = dict(vars(self.position))
        return doc


def _human(seconds: float) -> str:
    s = int(max(seconds, 0))
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    if d:
        return f"{d}d {h}h {m}m"
    if h:
        return f"{h}h {m}m"
    if m:
        return f"{m}m {s}s"
    return f"{s}s"


def _state(wl: JSON) -> tuple[str, str, str]:
    """-> (state, Kueue's reason, Kueue's message)."""
    for ctype, state in ((FINISHED, "finished"), (ADMITTED, "admitted"),
                         (QUOTA_RESERVED, "quota-reserved")):
        if condition_true(wl, ctype):
            c = condition(wl, ctype) or {}
            return state, str(c.get("reason", "")), str(c.get("message", ""))
    c = condition(wl, QUOTA_RESERVED) or {}
    state = "pending" if is_active(wl) else "held"
    return state, str(c.get("reason", "")), str(c.get("message", ""))


def _advice(r: Report) -> list[str]:
    out: list[str] = []
    target = f"{r.owner_kind.lower() or 'workload'} {r.owner.split('/', 1)[-1] or r.workload}"
    if r.state == "finished":
        return ["It has finished; nothing is waiting."]
    if r.state == "admitted":
        out = ["It is admitted: Kueue reserved its quota and its pods may run."]
        state, team, teams = r.terms.get("state"), r.terms.get("team", "?"), r.terms.get("for")
        if state == "reclaimable":
            out.append(f"Team {team} holds {r.terms.get('over', '?')}x its entitlement in "
                       f"{pool_label(r.terms.get('pool', ''))} and this Workload ran past "
                       f"MIN_RUNTIME: Kueue may preempt it for waiting work of team(s) {teams} "
                       "(same class, below their entitlement) - a reclaim.")
        elif state == "yielding":
            out.append(f"Team {team}'s lead approved other work of the team: Kueue may preempt "
                       "this normal Workload for it (and for nothing of another team).")
        return out
    if r.state == "quota-reserved":
        return ["Kueue reserved its quota; it waits for admission checks "
                f"({r.kueue_message or 'see the Workload status'})."]
    if r.state == "held":
        out.append("It is deactivated (spec.active: false), so Kueue will not admit it until it "
                   "is reactivated (by whoever deactivated it, or Kueue after a backoff limit).")
    msg = r.kueue_message.lower()
    if "unavailable in clusterqueue" in msg:
        out.append("Its ClusterQueue does not cover a resource it requests, so Kueue will never "
                   f"admit it as it is ({r.kueue_message}). Ask an admin to cover that resource "
                   f"in ClusterQueue {r.cluster_queue or '?'}, or change the request.")
    elif "insufficient" in msg or "quota" in msg or "couldn't assign flavors" in msg:
        out.append("Kueue has no free quota for it right now: it starts when running work in "
                   f"ClusterQueue {r.cluster_queue or '?'} frees enough, in queue order.")
    if r.requeue_at:
        out.append(f"Kueue requeues it after a backoff at {r.requeue_at}.")
    t = r.terms
    if t.get("reclaimed-for"):
        out.append(f"Kueue preempted it while its team was over its entitlement, for waiting "
                   f"work of team(s) {t['reclaimed-for']} (a reclaim); it waits again, its wait "
                   "counted from the eviction.")
    if t.get("behind"):
        out.append(f"Kueue is taking quota for {t['behind']} of the same team and class (it "
                   "preempted for it): this one is held at that Workload's priority until Kueue "
                   "admits it, so as not to preempt it right after.")
    if not t:
        out.append("The WDRF controller has not published a priority breakdown on this Workload "
                   f"(annotation {TERMS_ANNOTATION}): it is not running, or has not reached it "
                   "yet.")
        return out
    cls = t.get("class", "")
    override = t.get("override", "-")
    if override not in ("", "-"):
        out.append(f"An admin set its priority to {override} (wdrf.x-k8s.io/priority-override).")
    elif cls == "normal":
        out.append("Ask a team lead to approve it; approved work ranks above all normal work: "
                   f"kubectl annotate -n {r.namespace} {target} wdrf.x-k8s.io/approved=true "
                   "(only team leads and admins may set it).")
    elif cls == "approved":
        out.append("It is approved. Only an admin can make it urgent "
                   "(wdrf.x-k8s.io/urgent=true).")
    level, _, levels = t.get("level", "").partition("/")
    if level.isdigit() and levels.isdigit():
        band = usage_over_entitlement(int(level), int(levels))
        team = t.get("team", "your team")
        if band is not None:
            low, high = band
            if low >= 1.0:
                if math.isinf(high):
                    times = f"{low:.1f}x"
                elif f"{low:.1f}" == f"{high:.1f}":
                    times = f"about {low:.1f}x"
                else:
                    times = f"about {low:.1f}-{high:.1f}x"
                out.append(f"Team {team} uses {times} its share of "
                           f"{pool_label(t.get('pool', ''))}: its work ranks below teams that use "
                           "less, until its usage falls (finishing or fewer running jobs).")
            elif high <= 1.0:
                out.append(f"Team {team} uses less than its share; fairness ranks its work up.")
    if cls != "urgent":
        out.append("Waiting raises its priority (aging), so later work of its class cannot "
                   "overtake it for ever.")
    return out


def why(api: Api, ns: str, name: str, kind: str | None = None,
        now: datetime | None = None) -> Report:
    now = now or datetime.now(UTC)
    version = kueue_version(api)
    wl, items = resolve(api, version, ns, name, kind)
    m = meta(wl)
    spec = wl.get("spec") or {}
    ann = annotations_of(wl)
    owner_ref = controller_owner(wl) or next(iter(m.get("ownerReferences") or []), None)
    owner = f"{owner_ref.get('kind')}/{owner_ref.get('name')}" if owner_ref else ""
    queue = str(spec.get("queueName", ""))
    state, reason, message = _state(wl)
    terms = dict(Terms.parse(ann.get(TERMS_ANNOTATION)))
    admission = (wl.get("status") or {}).get("admission") or {}
    cluster_queue = str(admission.get("clusterQueue", ""))
    queue_pending: int | None = None
    if queue:
        try:
            lq = _get(api, f"/apis/{KUEUE_GROUP}/{version}/namespaces/{ns}/localqueues/{queue}")
        except Exception as exc:
            if status_of(exc) not in (403, 401):
                raise
            lq = None
        if lq:
            cluster_queue = cluster_queue or str((lq.get("spec") or {}).get("clusterQueue", ""))
            pending = (lq.get("status") or {}).get("pendingWorkloads")
            queue_pending = pending if isinstance(pending, int) else None
    position = Position()
    if state in ("pending", "held") and queue:
        why_not: list[str] = []
        found = visibility_position(api, ns, queue, str(m.get("name")), why_not)
        if found is None:
            if items is None:
                try:
                    items = list((api.request(
                        "GET", f"/apis/{KUEUE_GROUP}/{version}/namespaces/{ns}/workloads"
                    ) or {}).get("items") or [])
                except Exception as exc:
                    if status_of(exc) != 403:
                        raise
                    items = []
            found = namespace_position(items, wl, *why_not) if items else Position(
                note="not allowed to list the namespace's Workloads")
        position = found
    evicted = ""
    ev = condition(wl, "Evicted")
    if ev is not None and (ev.get("reason") or ev.get("message")):
        evicted = f"{ev.get('reason', '')}: {ev.get('message', '')}".strip(": ")
    requeue_at = str(((wl.get("status") or {}).get("requeueState") or {}).get("requeueAt") or "")
    since = _ts(terms.get("since")) or _created(wl)
    boost = parse_int32(ann.get(KUEUE_PRIORITY_BOOST_ANNOTATION))
    report = Report(
        namespace=ns, name=name, workload=str(m.get("name", "")), owner=owner,
        owner_kind=str(owner_ref.get("kind", "")) if owner_ref else "", queue=queue,
        cluster_queue=cluster_queue, state=state, kueue_reason=reason, kueue_message=message,
        evicted=evicted, requeue_at=requeue_at, priority=effective_priority(wl), boost=boost,
        terms=terms, created=str(m.get("creationTimestamp", "")),
        waited_seconds=(now - since).total_seconds() if state in ("pending", "held") else None,
        position=position, queue_pending=queue_pending,
    )
    report.advice = _advice(report)
    return report


_TERM_LABELS = (
    ("class", "class"), ("team", "team"), ("pool", "shares counted in"),
    ("level", "fairness level"), ("fair", "fairness points"), ("since", "queued since"),
    ("ref", "aging reference"),
    ("base", "base priority"), ("override", "override"), ("priority", "priority (published)"),
    ("state", "state"),
)


def render_text(r: Report) -> str:
    lines = [f"{r.namespace}/{r.workload}" + (f" (for {r.owner})" if r.owner else "")]
    lines.append(f"  state:          {r.state}" + (
        f" in LocalQueue {r.queue}" if r.queue else "") + (
        f" -> ClusterQueue {r.cluster_queue}" if r.cluster_queue else ""))
    if r.kueue_reason or r.kueue_message:
        lines.append(f"  Kueue says:     {r.kueue_reason}: {r.kueue_message}".rstrip(": "))
    if r.evicted:
        lines.append(f"  last eviction:  {r.evicted}")
    p = r.position
    if p.local is not None or p.cluster is not None:
        parts = []
        if p.local is not None:
            parts.append(f"{p.local}" + (f" of {p.of}" if p.of else "") + " in its LocalQueue")
        if p.cluster is not None:
            parts.append(f"{p.cluster} in ClusterQueue {r.cluster_queue or ''}".rstrip())
        lines.append("  position:       " + ", ".join(parts) + (f" ({p.note})" if p.note else ""))
    elif p.note:
        lines.append(f"  position:       unknown ({p.note})")
    if r.queue_pending is not None:
        lines.append(f"  LocalQueue:     {r.queue_pending} pending")
    if r.waited_seconds is not None:
        lines.append(f"  waiting:        {_human(r.waited_seconds)}")
    lines.append(f"  priority now:   {r.priority}" + (
        f" (spec.priority + boost {r.boost})" if r.boost is not None else ""))
    if r.terms:
        lines.append("  breakdown (published by the WDRF controller):")
        known = {k for k, _ in _TERM_LABELS} | {"version"}
        for key, label in _TERM_LABELS:
            if key in r.terms:
                lines.append(f"    {label + ':':24}{r.terms[key]}")
        for key in sorted(set(r.terms) - known):
            lines.append(f"    {key + ':':24}{r.terms[key]}")
    if r.advice:
        lines.append("  what would move it:")
        lines.extend(f"    - {a}" for a in r.advice)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Command line (`python -m controller why`, `python -m controller reset`, `kubectl wdrf ...`)


def _transport(kubeconfig: str | None, context: str | None) -> Api:
    try:
        from controller.live.kube import KubeTransport
    except ImportError as exc:  # the kubernetes client is a runtime dependency
        raise WhyError(f"the kubernetes client is not installed ({exc})") from None
    if kubeconfig and not os.path.exists(kubeconfig):
        raise WhyError(f"kubeconfig {kubeconfig}: no such file")
    try:
        return KubeTransport.from_config(kubeconfig, context, user_agent="wdrf-why")
    except Exception as exc:  # kubeconfig unreadable, no cluster
        raise WhyError(f"cannot load Kubernetes credentials: {exc}") from None


def default_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The kubeconfig context's namespace (kubectl's default), else the pod's, else default."""
    try:
        from controller.live.kube import kubeconfig_namespace

        path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser(
            "~/.kube/config")
        if os.path.exists(path.split(os.pathsep)[0]):
            return kubeconfig_namespace(kubeconfig, context) or "default"
    except Exception:  # fall through to the in-cluster file / default
        pass
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def _api_failure(exc: Exception) -> str:
    status = status_of(exc)
    if status == 0:
        return f"cannot reach the Kubernetes API ({getattr(exc, 'body', '') or exc})"
    msg = getattr(exc, "message", "") or str(exc)
    return f"the Kubernetes API answered {status}: {str(msg).splitlines()[0][:300]}"


_KUBE_OPTS = [
    click.option("--kubeconfig", "--kubeconfig-path", "kubeconfig", envvar="KUBECONFIG_PATH",
                 default=None, show_envvar=True,
                 help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster)."),
    click.option("--context", "--kubeconfig-context", "context", envvar="KUBECONFIG_CONTEXT",
                 default=None, show_envvar=True,
                 help="Kubeconfig context (default: its current context)."),
]


def _kube_opts(f: Any) -> Any:
    for opt in reversed(_KUBE_OPTS):
        f = opt(f)
    return f


@click.command("why")
@click.argument("target", metavar="[NAMESPACE/]NAME")
@click.option("-n", "--namespace", default=None,
              help="Namespace (default: NAMESPACE/ in the argument, else the kubeconfig's).")
@click.option("--kind", default=None,
              help="Owner kind when NAME is ambiguous (job, jobset, rayjob, ..., or workload).")
@output_option
@_kube_opts
def why_cmd(target: str, namespace: str | None, kind: str | None, output: str,
            kubeconfig: str | None, context: str | None) -> None:
    """Why is my job waiting? Kueue's reason, the queue position, the priority and its terms,
    and what would move it. Needs only read access to Workloads in the namespace."""
    ns, sep, name = target.partition("/")
    if not sep:
        ns, name = namespace or default_namespace(kubeconfig, context), target
    if not ns or not name:
        _fail(f"expected [NAMESPACE/]NAME, got {target!r}")
    try:
        report = why(_transport(kubeconfig, context), ns, name, kind)
    except WhyError as exc:
        _fail(str(exc))
        return
    except Exception as exc:  # one clear line, no traceback
        if hasattr(exc, "status"):
            _fail(_api_failure(exc))
        raise
    if output in ("json", "yaml"):
        click.echo(machine(json.loads(json.dumps(report.as_dict(), default=str)), output))
    else:
        click.echo(render_text(report))

