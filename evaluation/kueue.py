"""A model of Kueue (v0.19) over a HAMi GPU cluster: ClusterQueues in a cohort, quota-only
admission with a scheduler placement model, waitForPodsReady, and preemption.

What is modelled, and from which documented behaviour (Kueue's "Preemption" and "Cluster
Queue" concept pages; docs/evaluation.md, "The Kueue model"):

- **Topology.** `single-cq`: one ClusterQueue whose nominal GPU quota is the cluster, one
  LocalQueue per team. `cohort`: one ClusterQueue per team in one cohort, nominal quota
  proportional to the team's weight (the quotas add up to the cluster), borrowing without limit
  (no `borrowingLimit`/`lendingLimit`). A workload fits when its ClusterQueue's usage stays within
  nominal quota plus what the cohort has unused (with no limits: cohort usage + need <= cohort
  quota); it *borrows* when its ClusterQueue's usage goes above nominal.
- **Queue order inside a ClusterQueue.** LocalQueue key first when the policy has one (Admission
  Fair Sharing: decayed LocalQueue usage; the DRF baseline: the team's share), then higher
  effective priority, then the queue-order timestamp (creation; the eviction time after a
  `PodsReadyTimeout` eviction when `requeuingStrategy.timestamp` is `Eviction`), then id. A
  policy that orders by class first (the class-aware DRF baseline) puts the LocalQueue key
  after the priority instead.
  BestEffortFIFO skips a head that does not fit (or cannot preempt) and tries the next;
  StrictFIFO blocks the ClusterQueue behind it.
- **Inadmissible Workloads wait for a requeue** (BestEffortFIFO). A workload Kueue's scheduler
  tried and could not admit is parked in the ClusterQueue's inadmissible list. Released quota
  (a workload finished, evicted or deactivated) does not reach the parked workloads at once:
  Kueue requeues the inadmissible workloads of the cohort tree `requeue_batch` after the first
  release (Kueue's `requeueBatchPeriod`, 1 s; 0, the default here, turns this off). Until then
  only workloads in the active queue can take it: new ones, and parked ones whose priority was
  written meanwhile (a changed `kueue.x-k8s.io/priority-boost` annotation or `spec.priority`
  moves a workload out of the inadmissible list at once) - so a controller cycle that rewrites
  some pending priorities within the batch period hands the released quota to those first.
- **Across ClusterQueues**, in scheduling cycles as Kueue's scheduler runs them: each cycle
  takes the head of every ClusterQueue (one each) and tries them in order - classical: the
  order at the start of the cycle, non-borrowing first, then priority, then time; with Fair
  Sharing: each time the lowest dominant resource share *with* the workload (usage above
  nominal / the cohort's lendable quota, divided by the ClusterQueue's weight), then priority,
  then time. A ClusterQueue whose head was admitted or did not fit offers its next workload
  only in the next cycle, so within one cycle the other ClusterQueues' heads go first (a
  borrowing head of another ClusterQueue can take quota that the failed head's non-borrowing
  successor would have had).
- **Admission.** `quota`: Kueue admits on quota alone; the pods then wait for the scheduler model
  (HAMi binpack/spread over whole cards and fractions, all pods of a workload or none, tried in
  order of priority then admission time whenever GPUs free). A workload whose pods are not all
  running `pods_ready_timeout` after admission is evicted (`PodsReadyTimeout`) and requeued after
  Kueue's backoff `backoff_base * 2^(n-1)` capped at `backoff_max` (n = its timeout evictions).
  `placement`: admitted only when quota fits *and* every pod can be placed now (topology-aware
  admission); pods start at once.
- **Preemption** (classical): when a head does not fit, candidates are admitted workloads of its
  own ClusterQueue allowed by `withinClusterQueue` (`LowerPriority`: strictly lower priority;
  `LowerOrNewerEqualPriority`: also equal priority and created later), and of other, *borrowing*
  ClusterQueues in the cohort allowed by `reclaimWithinCohort` (`Any` or `LowerPriority`) when the
  preemptor stays within its nominal quota, or by `borrowWithinCohort` (`LowerPriority`, with
  `maxPriorityThreshold`) when it would borrow. Candidates are ordered: other ClusterQueues first,
  lower priority first, most recently admitted first; they are taken greedily until the
  preemptor fits, then the set is minimised (walk the targets in reverse and put back each one
  whose quota is not needed). With Fair Sharing, candidates in other ClusterQueues are taken from
  the ClusterQueue with the highest share first and must satisfy the preemption strategies
  (`LessThanOrEqualToFinalShare`, then `LessThanInitialShare`). The victims are evicted at once
  and the preemptor is admitted in the same cycle; a victim is no candidate again in the same
  admission pass (Kueue requeues it only once its eviction is done, in a later cycle). A
  preempted job loses the work done since its last checkpoint (`checkpoint_interval`, measured
  from its last start) and is requeued with its creation timestamp (no backoff).
- Not modelled: kube-scheduler pod preemption, flavors (one GPU flavor), `lendingLimit`,
  admission checks, hierarchical cohorts, multi-podset workloads.

All amounts are integer GPU percent (100 = one GPU), so conservation checks are exact:
the GPU-time the cluster gave = sum of need x duration + the work lost to preemption.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from evaluation.engine import Eviction, Key, Series, SimConfig, SimResult, SortedQueue
from evaluation.packing import Cluster, Placement
from evaluation.trace import SimJob

NEVER = "Never"
LOWER_PRIORITY = "LowerPriority"
LOWER_OR_NEWER_EQUAL = "LowerOrNewerEqualPriority"
ANY = "Any"
WITHIN_POLICIES = (NEVER, LOWER_PRIORITY, LOWER_OR_NEWER_EQUAL)
RECLAIM_POLICIES = (NEVER, LOWER_PRIORITY, ANY)
BORROW_POLICIES = (NEVER, LOWER_PRIORITY)
FINAL_SHARE = "LessThanOrEqualToFinalShare"
INITIAL_SHARE = "LessThanInitialShare"
SINGLE_CQ = "single-cq"
COHORT = "cohort"
QUOTA = "quota"
PLACEMENT = "placement"

# Job states
PENDING, WAITING, RUNNING, DONE = 0, 1, 2, 3
PREEMPTED = "Preempted"
PODS_READY_TIMEOUT = "PodsReadyTimeout"


@dataclass(frozen=True, slots=True)
class KueueConfig:
    """Kueue settings of the model (Kueue's defaults where it has them)."""

    topology: str = SINGLE_CQ
    admission: str = QUOTA
    within_cluster_queue: str = NEVER
    reclaim_within_cohort: str = NEVER
    borrow_within_cohort: str = NEVER
    borrow_max_priority: int | None = None  # borrowWithinCohort.maxPriorityThreshold
    fair_sharing: bool = False
    fair_sharing_strategies: tuple[str, ...] = (FINAL_SHARE, INITIAL_SHARE)
    queueing_strategy: str = "BestEffortFIFO"  # or StrictFIFO
    pods_ready_timeout: float = 300.0  # waitForPodsReady.timeout (Kueue default 5 min)
    backoff_base: float = 60.0  # requeuingStrategy.backoffBaseSeconds (Kueue default)
    backoff_max: float = 3600.0  # requeuingStrategy.backoffMaxSeconds (Kueue default)
    requeue_timestamp: str = "Eviction"  # requeuingStrategy.timestamp (Kueue default)
    checkpoint_interval: float = 1800.0  # a preempted job resumes from its last checkpoint
    # Kueue's requeueBatchPeriod: parked (inadmissible) workloads see released quota this long
    # after the first release. Kueue v0.19 uses 1.0 (10.0 with its SchedulerLongRequeueInterval
    # gate); the default 0 keeps the earlier model (every pending workload sees it at once).
    requeue_batch: float = 0.0
    team_weights: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.topology not in (SINGLE_CQ, COHORT):
            raise ValueError(f"topology must be {SINGLE_CQ} or {COHORT}")
        if self.admission not in (QUOTA, PLACEMENT):
            raise ValueError(f"admission must be {QUOTA} or {PLACEMENT}")
        if self.within_cluster_queue not in WITHIN_POLICIES:
            raise ValueError(f"withinClusterQueue must be one of {WITHIN_POLICIES}")
        if self.reclaim_within_cohort not in RECLAIM_POLICIES:
            raise ValueError(f"reclaimWithinCohort must be one of {RECLAIM_POLICIES}")
        if self.borrow_within_cohort not in BORROW_POLICIES:
            raise ValueError(f"borrowWithinCohort must be one of {BORROW_POLICIES}")
        if self.queueing_strategy not in ("BestEffortFIFO", "StrictFIFO"):
            raise ValueError("queueingStrategy must be BestEffortFIFO or StrictFIFO")
        if self.checkpoint_interval <= 0 or self.pods_ready_timeout <= 0:
            raise ValueError("checkpoint interval and pods-ready timeout must be > 0")
        if self.requeue_batch < 0:
            raise ValueError("requeue batch period must be >= 0")
        for s in self.fair_sharing_strategies:
            if s not in (FINAL_SHARE, INITIAL_SHARE):
                raise ValueError(f"unknown fair-sharing preemption strategy {s!r}")

    @property
    def preempts(self) -> bool:
        return (self.within_cluster_queue != NEVER or self.reclaim_within_cohort != NEVER
                or self.borrow_within_cohort != NEVER)

    def weight(self, team: str) -> float:
        return float(self.team_weights.get(team, 1.0))


@dataclass(slots=True)
class CQ:
    name: str
    nominal: int  # GPU percent
    weight: float
    used: int = 0
    queue: SortedQueue = field(default_factory=SortedQueue)  # merged order (no LocalQueue key)
    lqs: dict[str, SortedQueue] = field(default_factory=dict)  # per team, with a LocalQueue key
    admitted: dict[int, float] = field(default_factory=dict)  # job id -> admission time


class Policy:
    """What the engine asks a policy. Subclasses override what they need."""

    name = "base"
    description = ""
    controller = False  # runs a controller loop every LOOP_INTERVAL
    per_team = False  # per-team queues picked by `team_key` (lowest first)
    class_first = False  # per-team queues picked by priority first, then `team_key`

    def __init__(self) -> None:
        self.writes = 0
        self.write_times: list[float] = []
        self.job_writes: list[int] = []
        # Per cause (a policy's own names), per job: what its writes were for.
        self.job_write_causes: dict[str, list[int]] = {}
        self._sim: KueueSim | None = None

    @property
    def sim(self) -> KueueSim:
        if self._sim is None:
            raise RuntimeError("policy used before reset()")
        return self._sim

    def reset(self, sim: KueueSim) -> None:
        self._sim = sim
        self.writes = 0
        self.write_times = []
        self.job_writes = [0] * len(sim.jobs)
        self.job_write_causes = {}

    def priority(self, job: SimJob) -> int:
        """The job's effective Kueue priority now (pending or admitted)."""
        return 0

    def job_key(self, job: SimJob) -> Key:
        return (job.submit, job.job_id)

    def team_key(self, team: str) -> float:
        return 0.0

    def packing(self, job: SimJob) -> tuple[str, str]:
        cfg = self.sim.cfg
        return cfg.node_policy, cfg.gpu_policy

    def advance(self, now: float) -> None:
        """Time moves to `now` (before anything changes at `now`)."""

    def on_arrival(self, job: SimJob, now: float) -> None:
        pass

    def on_admit(self, job: SimJob, now: float) -> None:
        pass

    def on_release(self, job: SimJob, now: float) -> None:
        pass

    def on_evict(self, job: SimJob, now: float, reason: str) -> None:
        """An admitted job was evicted (Kueue model): it is pending again."""

    def tick(self, now: float) -> bool:
        """One controller cycle; True when any pending job's order key changed."""
        return False

    def next_change(self, now: float) -> float:
        """Earliest time after `now` at which a cycle could decide differently with nothing
        else changing (math.inf: never)."""
        return math.inf

    def extra(self) -> Mapping[str, float]:
        return {}


class KueueSim:
    """One policy over one job list on one cluster under the Kueue model. `run()` -> SimResult.

    The policy gives each job's effective priority (`Policy.priority`, pending *and* admitted:
    Kueue compares the preemptor's with the admitted workloads'), an optional LocalQueue key
    (`Policy.team_key` when `Policy.per_team`), HAMi packing, and its controller loop (`tick`).
    """

    def __init__(self, jobs: Sequence[SimJob], config: SimConfig, kueue: KueueConfig,
                 policy: Policy) -> None:
        self.jobs = list(jobs)
        for i, j in enumerate(self.jobs):
            if j.job_id != i:
                raise ValueError("job ids must be 0..n-1 in list order")
        self.cfg = config
        self.k = kueue
        self.policy = policy
        self.cluster = Cluster(config.nodes, config.node_gpus)
        self.capacity = config.capacity
        self.teams = tuple(sorted({j.team for j in self.jobs}))
        self.team_idx = {t: i for i, t in enumerate(self.teams)}
        self.team_alloc = [0] * len(self.teams)  # GPUs in use (pods running), GPU percent
        self.team_pending = [0] * len(self.teams)  # pending + admitted-not-running demand
        self.team_carried = [0] * len(self.teams)  # part of team_alloc: carried-in jobs
        self.team_quota = [0] * len(self.teams)  # quota reserved (admitted, running or not)
        self.cqs: dict[str, CQ] = {}
        self.cq_of_team: dict[str, str] = {}
        self._build_queues()
        self.cohort_nominal = sum(c.nominal for c in self.cqs.values())
        self.total_used = 0
        self.now = 0.0
        n = len(self.jobs)
        self.state = [PENDING] * n
        self.qts = [j.submit for j in self.jobs]  # queue-order timestamp
        self.eligible = [0.0] * n  # backoff: not before
        self.remaining = [j.duration for j in self.jobs]
        self.run_start = [math.nan] * n
        self.run_seq = [0] * n
        self.timeouts_n = [0] * n
        self.admit = [math.nan] * n  # first time pods ran (time to start)
        self.first_quota = [math.nan] * n  # first quota reservation
        self.end = [math.nan] * n
        self.admissions = [0] * n  # quota reservations
        self.starts = [0] * n
        self.placements: dict[int, Placement] = {}
        self.waiting: dict[int, float] = {}  # admitted, pods not running: job id -> admitted at
        self.pending: dict[int, SimJob] = {}
        self.evictions: list[Eviction] = []
        self.completions: list[tuple[float, int, int]] = []
        self.timers: list[tuple[float, int, int]] = []  # pods-ready deadlines
        self.backoffs: list[tuple[float, int]] = []
        # Kueue's inadmissible lists (one cohort tree here: one batched requeue for all).
        self.parks = self.k.requeue_batch > 0 and self.k.queueing_strategy == "BestEffortFIFO"
        self.parked: set[int] = set()
        self.requeue_at = math.inf
        self.pass_victims: set[int] = set()  # preempted in the current admission pass
        self.series = Series(config.series_bin, len(self.teams))
        self.last_t = 0.0
        self.changed = True
        self.checks = 0
        self.lost = 0.0
        too_big = [j.job_id for j in self.jobs if j.need > self.capacity]
        if too_big:
            raise ValueError(f"{len(too_big)} job(s) need more than the cluster's capacity")

    # -- topology ------------------------------------------------------------------------------
    def _build_queues(self) -> None:
        if self.k.topology == SINGLE_CQ:
            self.cqs["gpu"] = CQ("gpu", self.capacity, 1.0)
            for t in self.teams:
                self.cq_of_team[t] = "gpu"
            return
        weights = [self.k.weight(t) for t in self.teams]
        total = sum(weights)
        # Largest remainder so the nominal quotas add up to the cluster exactly.
        raw = [self.capacity * w / total for w in weights]
        quota = [math.floor(x) for x in raw]
        rest = self.capacity - sum(quota)
        for i in sorted(range(len(raw)), key=lambda i: (quota[i] - raw[i], i))[:rest]:
            quota[i] += 1
        for t, q, w in zip(self.teams, quota, weights, strict=True):
            name = f"cq-{t}"
            self.cqs[name] = CQ(name, q, w)
            self.cq_of_team[t] = name

    def cq_of(self, job: SimJob) -> CQ:
        return self.cqs[self.cq_of_team[job.team]]

    @property
    def cohort_used(self) -> int:
        return self.total_used

    def share(self, cq: CQ, extra: int = 0) -> float:
        """Kueue Fair Sharing's weighted share: usage above nominal over the cohort's lendable
        quota, x1000, divided by the weight (0 while within nominal quota)."""
        above = cq.used + extra - cq.nominal
        if above <= 0 or self.cohort_nominal <= 0:
            return 0.0
        return above * 1000.0 / self.cohort_nominal / cq.weight

    # -- queues --------------------------------------------------------------------------------
    def priority(self, jid: int) -> int:
        return self.policy.priority(self.jobs[jid])

    def key(self, job: SimJob) -> tuple[float, ...]:
        return (-self.policy.priority(job), self.qts[job.job_id], job.job_id)

    def _queue_for(self, job: SimJob) -> SortedQueue:
        cq = self.cq_of(job)
        if self.policy.per_team:
            return cq.lqs.setdefault(job.team, SortedQueue())
        return cq.queue

    def _enqueue(self, job: SimJob) -> None:
        jid = job.job_id
        self.parked.discard(jid)  # new or requeued after an eviction: in the active queue
        self.state[jid] = PENDING
        self.pending[jid] = job
        self._queue_for(job).add(self.key(job), jid)
        self.team_pending[self.team_idx[job.team]] += job.need
        self.changed = True

    def resort(self) -> None:
        """Re-key every pending job (the policy changed priorities)."""
        for cq in self.cqs.values():
            for q in (cq.queue, *cq.lqs.values()):
                q.rebuild([(self.key(self.jobs[j]), j) for _, j in q.items if j in self.pending])

    # -- fitting -------------------------------------------------------------------------------
    def _quota_fits(self, cq: CQ, need: int) -> bool:
        return self.cohort_used + need <= self.cohort_nominal and (
            len(self.cqs) > 1 or cq.used + need <= cq.nominal
        )

    def _fits(self, job: SimJob, cq: CQ) -> bool:
        if not self._quota_fits(cq, job.need):
            return False
        if self.k.admission == PLACEMENT:
            return self.cluster.can_place(*job.shape)
        return True

    # -- admission, start, eviction ------------------------------------------------------------
    def _reserve(self, job: SimJob, cq: CQ) -> None:
        jid = job.job_id
        del self.pending[jid]
        self.parked.discard(jid)
        self.state[jid] = WAITING
        cq.used += job.need
        self.total_used += job.need
        self.team_quota[self.team_idx[job.team]] += job.need
        cq.admitted[jid] = self.now
        self.admissions[jid] += 1
        if math.isnan(self.first_quota[jid]):
            self.first_quota[jid] = self.now
        self.policy.on_admit(job, self.now)
        self.changed = True
        if self.k.admission == PLACEMENT:
            if not self._try_start(job):
                raise AssertionError(f"job {jid}: admitted on placement but does not place")
            return
        self.waiting[jid] = self.now
        self.run_seq[jid] += 1
        heapq.heappush(self.timers, (self.now + self.k.pods_ready_timeout, jid, self.run_seq[jid]))
        self._try_start(job)

    def _try_start(self, job: SimJob) -> bool:
        node_policy, gpu_policy = self.policy.packing(job)
        p = self.cluster.place(job.pods, job.gpus_per_pod, job.pct, node_policy, gpu_policy)
        if p is None:
            return False
        if p.total != job.need:
            raise AssertionError(f"job {job.job_id}: placed {p.total}, needs {job.need}")
        jid = job.job_id
        self.waiting.pop(jid, None)
        self.placements[jid] = p
        self.state[jid] = RUNNING
        self.starts[jid] += 1
        if math.isnan(self.admit[jid]):
            self.admit[jid] = self.now
        self.run_start[jid] = self.now
        self.run_seq[jid] += 1
        ti = self.team_idx[job.team]
        self.team_alloc[ti] += job.need
        self.team_pending[ti] -= job.need
        if job.carried:
            self.team_carried[ti] += job.need
        heapq.heappush(self.completions, (self.now + self.remaining[jid], jid, self.run_seq[jid]))
        self.changed = True
        return True

    def _start_waiting(self) -> None:
        """The scheduler model: pods of admitted workloads, by priority then admission time."""
        if not self.waiting:
            return
        order = sorted(self.waiting, key=lambda j: (-self.priority(j), self.waiting[j], j))
        for jid in order:
            self._try_start(self.jobs[jid])

    def _release(self, jid: int) -> CQ:
        job = self.jobs[jid]
        cq = self.cq_of(job)
        cq.used -= job.need
        self.total_used -= job.need
        self.team_quota[self.team_idx[job.team]] -= job.need
        del cq.admitted[jid]
        if self.state[jid] == RUNNING:
            self.cluster.release(self.placements.pop(jid))
            self.team_alloc[self.team_idx[job.team]] -= job.need
            if job.carried:
                self.team_carried[self.team_idx[job.team]] -= job.need
        else:
            self.waiting.pop(jid, None)
            self.team_pending[self.team_idx[job.team]] -= job.need
        self.run_seq[jid] += 1
        self.changed = True
        if self.parked:
            self.requeue_at = min(self.requeue_at, self.now + self.k.requeue_batch)
        return cq

    def _complete(self, jid: int) -> None:
        self._release(jid)
        self.state[jid] = DONE
        self.remaining[jid] = 0.0
        self.end[jid] = self.now
        self.policy.on_release(self.jobs[jid], self.now)

    def _evict(self, jid: int, reason: str, by: int = -1) -> None:
        job = self.jobs[jid]
        lost = 0.0
        if self.state[jid] == RUNNING:
            ran = self.now - self.run_start[jid]
            kept = math.floor(ran / self.k.checkpoint_interval + 1e-9) * self.k.checkpoint_interval
            kept = min(kept, ran)
            self.remaining[jid] -= kept
            lost = (ran - kept) * job.need
            self.lost += lost
        admitted_at = self.cq_of(job).admitted[jid]
        self._release(jid)
        self.evictions.append(Eviction(self.now, jid, reason, lost, by, admitted_at))
        self.policy.on_release(job, self.now)
        if reason == PODS_READY_TIMEOUT:
            self.timeouts_n[jid] += 1
            n = self.timeouts_n[jid]
            backoff = min(self.k.backoff_base * 2 ** (n - 1), self.k.backoff_max)
            if self.k.requeue_timestamp == "Eviction":
                self.qts[jid] = self.now
            self.eligible[jid] = self.now + backoff
            self.state[jid] = PENDING
            heapq.heappush(self.backoffs, (self.now + backoff, jid))
            self.policy.on_evict(job, self.now, reason)
            self.team_pending[self.team_idx[job.team]] += job.need
            return
        self.policy.on_evict(job, self.now, reason)
        self._enqueue(job)

    # -- preemption ----------------------------------------------------------------------------
    def _candidates(self, job: SimJob, cq: CQ, borrowing: bool,
                    only: set[str] | None = None) -> list[tuple[int, CQ]]:
        """Preemption candidates in Kueue's order. With Fair Sharing, other ClusterQueues'
        workloads are gated by `reclaimWithinCohort` only (the share strategies decide)."""
        p = self.policy.priority(job)
        if self.k.fair_sharing:
            borrowing = False
        out: list[tuple[tuple[float, ...], int, CQ]] = []
        within = self.k.within_cluster_queue
        if within != NEVER:
            for jid, at in cq.admitted.items():
                q = self.priority(jid)
                if q < p or (within == LOWER_OR_NEWER_EQUAL and q == p
                             and self.jobs[jid].submit > job.submit):
                    out.append(((1, q, -at, jid), jid, cq))
        reclaim, borrow = self.k.reclaim_within_cohort, self.k.borrow_within_cohort
        if len(self.cqs) > 1 and (reclaim != NEVER or borrow != NEVER):
            for other in self.cqs.values():
                if other is cq or other.used <= other.nominal:
                    continue  # only ClusterQueues that borrow can be reclaimed from
                if only is not None and other.name not in only:
                    continue
                for jid, at in other.admitted.items():
                    q = self.priority(jid)
                    if borrowing:
                        if borrow == NEVER or q >= p:
                            continue
                        cap = self.k.borrow_max_priority
                        if cap is not None and q > cap:
                            continue
                    elif reclaim == NEVER or (reclaim == LOWER_PRIORITY and q >= p):
                        continue
                    out.append(((0, q, -at, jid), jid, other))
        out.sort(key=lambda x: x[0])
        return [(jid, c) for _, jid, c in out]

    def _fits_without(self, job: SimJob, cq: CQ, victims: Sequence[tuple[int, CQ]],
                      allow_borrow: bool) -> bool:
        freed: dict[str, int] = {}
        for jid, c in victims:
            freed[c.name] = freed.get(c.name, 0) + self.jobs[jid].need
        total = sum(freed.values())
        own = cq.used - freed.get(cq.name, 0) + job.need
        if len(self.cqs) == 1:
            return own <= cq.nominal
        if not allow_borrow and own > cq.nominal:
            return False
        return self.cohort_used - total + job.need <= self.cohort_nominal

    def _place_after(self, job: SimJob, victims: Sequence[tuple[int, CQ]]) -> bool:
        """Placement mode: would the job's pods fit on the GPUs the victims free?"""
        released = [self.placements[j] for j, _ in victims if j in self.placements]
        for p in released:
            self.cluster.release(p)
        ok = self.cluster.can_place(*job.shape)
        for p in released:
            for n, g, amount in p.slots:
                self.cluster._take(n, g, amount)
        return ok

    def _minimise(self, job: SimJob, cq: CQ, targets: list[tuple[int, CQ]],
                  allow_borrow: bool) -> list[tuple[int, CQ]]:
        """Kueue: walk the targets in reverse; drop each one the preemptor fits without."""
        kept = list(targets)
        for i in range(len(targets) - 2, -1, -1):
            trial = kept[:i] + kept[i + 1:]
            if self._fits_without(job, cq, trial, allow_borrow):
                kept = trial
        return kept

    def _greedy(self, job: SimJob, cq: CQ, cands: Sequence[tuple[int, CQ]],
                allow_borrow: bool) -> list[tuple[int, CQ]] | None:
        targets: list[tuple[int, CQ]] = []
        freed: dict[str, int] = {}
        for c in cands:
            jid, other = c
            if other is not cq and other.used - freed.get(other.name, 0) <= other.nominal:
                continue  # that ClusterQueue no longer borrows: Kueue leaves it alone
            targets.append(c)
            freed[other.name] = freed.get(other.name, 0) + self.jobs[jid].need
            if self._fits_without(job, cq, targets, allow_borrow):
                return self._minimise(job, cq, targets, allow_borrow)
        return None

    def _classic_targets(self, job: SimJob, cq: CQ) -> list[tuple[int, CQ]] | None:
        borrowing = len(self.cqs) > 1 and cq.used + job.need > cq.nominal
        cands = self._candidates(job, cq, borrowing)
        if not cands:
            return None
        own = [c for c in cands if c[1] is cq]
        if len(own) == len(cands):  # 1. all candidates in the preemptor's queue: may borrow
            return self._greedy(job, cq, cands, True)
        if self.k.borrow_within_cohort != NEVER and borrowing:  # 2.
            t = self._greedy(job, cq, cands, True)
            if t is not None:
                return t
        if not borrowing:  # 3. within nominal quota: reclaim, no borrowing
            t = self._greedy(job, cq, cands, False)
            if t is not None:
                return t
        return self._greedy(job, cq, own, True) if own else None  # 4.

    def _fair_targets(self, job: SimJob, cq: CQ) -> list[tuple[int, CQ]] | None:
        borrowing = cq.used + job.need > cq.nominal
        mine = self.share(cq, job.need)
        # Both strategies need the target's share before preemption above the preemptor's
        # share with the workload, and shares only fall as victims are taken: no other
        # ClusterQueue at or below `mine` can ever give a victim.
        above = {c.name for c in self.cqs.values() if c is not cq and self.share(c) > mine}
        if not above and self.k.within_cluster_queue == NEVER:
            return None
        cands = self._candidates(job, cq, borrowing, above)
        own = [c for c in cands if c[1] is cq]
        others: dict[str, list[int]] = {}
        for jid, c in cands:
            if c is not cq:
                others.setdefault(c.name, []).append(jid)
        targets: list[tuple[int, CQ]] = []
        freed: dict[str, int] = {}

        def fits() -> bool:
            return self._fits_without(job, cq, targets, True)

        for strategy in self.k.fair_sharing_strategies:
            if fits():
                break
            progress = True
            while not fits() and progress:
                progress = False
                # ClusterQueue with the highest share first (shares after the targets so far).
                order = sorted(
                    (c for c in others if others[c]),
                    key=lambda n: (-self.share(self.cqs[n], -freed.get(n, 0)), n),
                )
                for name in order:
                    other = self.cqs[name]
                    for jid in list(others[name]):
                        before = self.share(other, -freed.get(name, 0))
                        after = self.share(other, -freed.get(name, 0) - self.jobs[jid].need)
                        ok = mine <= after if strategy == FINAL_SHARE else mine < before
                        if ok:
                            others[name].remove(jid)
                            targets.append((jid, other))
                            freed[name] = freed.get(name, 0) + self.jobs[jid].need
                            progress = True
                            break
                    if progress:
                        break
        if not fits():
            for cand in own:  # within the ClusterQueue: classical rules
                targets.append(cand)
                if fits():
                    break
        if not fits():
            return None
        return self._minimise(job, cq, targets, True)

    def _preempt_for(self, job: SimJob, cq: CQ) -> bool:
        if not self.k.preempts:
            return False
        targets = (self._fair_targets(job, cq) if self.k.fair_sharing and len(self.cqs) > 1
                   else self._classic_targets(job, cq))
        if not targets:
            return False
        if self.k.admission == PLACEMENT and not self._place_after(job, targets):
            return False
        for jid, _ in targets:
            self._evict(jid, PREEMPTED, by=job.job_id)
            self.pass_victims.add(jid)
        if not self._quota_fits(cq, job.need):
            raise AssertionError("preemption freed too little quota")
        return True

    # -- the scheduling cycle ------------------------------------------------------------------
    def _head(self, cq: CQ, cursors: dict[int, int], failed: dict[int, int]
              ) -> tuple[tuple[float, ...], int, SortedQueue] | None:
        """The ClusterQueue's next candidate: the best LocalQueue head (or the merged queue's),
        skipping what is not pending and what a failure earlier in this pass rules out."""
        queues = list(cq.lqs.values()) if self.policy.per_team else [cq.queue]
        best: tuple[tuple[float, ...], int, SortedQueue] | None = None
        for q in queues:
            pos = cursors.get(id(q), 0)
            items = q.items
            while pos < len(items):
                jid = items[pos][1]
                if jid in self.pending and self.eligible[jid] <= self.now \
                        and jid not in self.parked and jid not in self.pass_victims:
                    job = self.jobs[jid]
                    f = failed.get(job.need)
                    if f is None or self.policy.priority(job) > f:
                        break
                pos += 1
            cursors[id(q)] = pos
            if pos >= len(items):
                continue
            jid = items[pos][1]
            team = self.jobs[jid].team
            k = items[pos][0]
            if self.policy.class_first:  # priority, then the LocalQueue key, then time
                k = (k[0], self.policy.team_key(team), *k[1:])
            elif self.policy.per_team:
                k = (self.policy.team_key(team), *k)
            if best is None or k < best[0]:
                best = (k, jid, q)
        return best

    def admission_pass(self) -> int:
        """Kueue's scheduler: cycles over the heads of every ClusterQueue until nothing fits;
        what it tried and could not admit is parked (inadmissible) until the next requeue."""
        if not self.pending or len(self.parked) >= len(self.pending):
            return 0
        # A workload preempted in this pass is still being evicted (Kueue requeues it once its
        # quota is released, a later cycle): not a candidate again in this pass.
        self.pass_victims = set()
        admitted = 0
        cursors: dict[int, int] = {}
        # Per ClusterQueue: need -> highest priority that failed (quota and preemption) in this
        # pass; a later job with that need and no higher priority fails too.
        failed: dict[str, dict[int, int]] = {n: {} for n in self.cqs}
        blocked: set[str] = set()  # StrictFIFO: the ClusterQueue waits for its head
        strict = self.k.queueing_strategy == "StrictFIFO"
        fair = self.k.fair_sharing and len(self.cqs) > 1
        min_need = min(j.need for j in self.pending.values())
        while self.k.preempts or self.cohort_nominal - self.total_used >= min_need:
            # One scheduling cycle: the head of every ClusterQueue, each tried once.
            cycle: list[tuple[CQ, tuple[tuple[float, ...], int, SortedQueue]]] = []
            for name, cq in self.cqs.items():
                h = None if name in blocked else self._head(cq, cursors, failed[name])
                if h is not None:
                    cycle.append((cq, h))
            if not cycle:
                break
            if not fair:  # classical: ordered once, at the start of the cycle
                cycle.sort(key=lambda x: self._cross_key(x[0], x[1][1]), reverse=True)
            while cycle:
                if fair:  # the lowest share with the workload, after this cycle's admissions
                    i = min(range(len(cycle)),
                            key=lambda i: self._cross_key(cycle[i][0], cycle[i][1][1]))
                    cq, (_, jid, q) = cycle.pop(i)
                else:
                    cq, (_, jid, q) = cycle.pop()
                job = self.jobs[jid]
                fits = self._fits(job, cq)
                preempted = not fits and self._preempt_for(job, cq)
                if fits or preempted:
                    if not self._fits(job, cq):
                        raise AssertionError("admitting a workload that does not fit")
                    self._reserve(job, cq)
                    q.dead += 1
                    admitted += 1
                    if preempted:
                        for f in failed.values():
                            f.clear()  # a preemption frees quota, maybe in other ClusterQueues
                elif strict:
                    blocked.add(cq.name)
                else:
                    p = self.policy.priority(job)
                    failed[cq.name][job.need] = max(p, failed[cq.name].get(job.need, p))
                    cursors[id(q)] = cursors.get(id(q), 0) + 1
        for cq in self.cqs.values():
            for qq in (cq.queue, *cq.lqs.values()):
                if qq.dead * 2 > len(qq.items):
                    qq.items = [it for it in qq.items if it[1] in self.pending]
                    qq.dead = 0
        if self.parks:  # victims return to the active queue once their eviction is done
            self.parked.update(j for j in self.pending if j not in self.pass_victims)
        return admitted

    def _cross_key(self, cq: CQ, jid: int) -> tuple[float, ...]:
        job = self.jobs[jid]
        p = -self.policy.priority(job)
        if len(self.cqs) == 1:
            return (0.0,)
        if self.k.fair_sharing:
            return (self.share(cq, job.need), p, self.qts[jid], jid)
        borrowing = 1.0 if cq.used + job.need > cq.nominal else 0.0
        return (borrowing, p, self.qts[jid], jid)

    # -- time ----------------------------------------------------------------------------------
    def _advance(self, t: float) -> None:
        if t > self.last_t:
            hist = self.cluster.whole_hist  # nodes by fully free GPUs
            self.series.add(self.last_t, t, self.team_alloc, self.team_pending,
                            self.team_carried, sum(k * c for k, c in enumerate(hist)))
            self.last_t = t
        self.now = t
        self.policy.advance(t)

    def run(self) -> SimResult:
        order = sorted(self.jobs, key=lambda j: (j.submit, j.job_id))
        self.policy.reset(self)
        controller = self.policy.controller
        loop = self.cfg.loop_interval
        next_tick = 0.0 if controller else math.inf
        ticks = 0
        writes_before = self.policy.writes
        ai, n = 0, len(order)
        while True:
            done_q = self.completions
            while done_q and done_q[0][2] != self.run_seq[done_q[0][1]]:
                heapq.heappop(done_q)
            while self.timers and self.timers[0][2] != self.run_seq[self.timers[0][1]]:
                heapq.heappop(self.timers)
            t_arr = order[ai].submit if ai < n else math.inf
            t_done = self.completions[0][0] if self.completions else math.inf
            t_timer = self.timers[0][0] if self.timers else math.inf
            t_back = self.backoffs[0][0] if self.backoffs else math.inf
            t_ev = min(t_arr, t_done, t_timer, t_back, self.requeue_at)
            if math.isinf(t_ev) and (math.isinf(next_tick) or not self.pending):
                break
            t = min(t_ev, next_tick)
            self._advance(t)
            events = False
            while self.completions and self.completions[0][0] <= t:
                _, jid, seq = heapq.heappop(self.completions)
                if seq == self.run_seq[jid]:
                    self._complete(jid)
                    events = True
            if events:
                self._start_waiting()
            while self.timers and self.timers[0][0] <= t:
                _, jid, seq = heapq.heappop(self.timers)
                if seq == self.run_seq[jid] and self.state[jid] == WAITING:
                    self._evict(jid, PODS_READY_TIMEOUT)
                    events = True
            while self.backoffs and self.backoffs[0][0] <= t:
                _, jid = heapq.heappop(self.backoffs)
                if self.state[jid] == PENDING and jid not in self.pending:
                    self.team_pending[self.team_idx[self.jobs[jid].team]] -= self.jobs[jid].need
                    self._enqueue(self.jobs[jid])
                    events = True
            if self.requeue_at <= t:
                self.requeue_at = math.inf  # Kueue's batched requeue of inadmissible workloads
                self.parked.clear()
                events = True
            while ai < n and order[ai].submit <= t:
                job = order[ai]
                self.policy.on_arrival(job, t)
                self._enqueue(job)
                ai += 1
                events = True
            if events:
                self.admission_pass()
                self._start_waiting()
            if t >= next_tick:
                ticks += 1
                self.changed = False
                parked = {j: self.priority(j) for j in self.parked} if controller else {}
                if self.policy.tick(t):
                    # New priorities: a new queue order, and (with preemption) new preemptions.
                    # A parked workload whose priority was written is back in the active queue.
                    self.parked.difference_update(
                        [j for j, p in parked.items() if self.priority(j) != p])
                    self.resort()
                    self.admission_pass()
                    self._start_waiting()
                next_tick = self._next_tick(t, loop, order[ai].submit if ai < n else math.inf)
            if self.cfg.check_invariants:
                self.check()
        self._advance(self.now)
        ends = [e for e in self.end if not math.isnan(e)]
        makespan = max(ends) if ends else 0.0
        return SimResult(
            policy=self.policy.name,
            config=self.cfg,
            jobs=self.jobs,
            teams=self.teams,
            admit=self.admit,
            end=self.end,
            admissions=[1 if d == DONE else 0 for d in self.state],
            writes=self.policy.writes - writes_before,
            write_times=list(self.policy.write_times),
            ticks_evaluated=ticks,
            ticks_total=int(makespan // loop) + 1 if controller else 0,
            series=self.series,
            max_tenants=self.cluster.max_tenants,
            makespan=makespan,
            overcommit_checks=self.checks,
            extra=dict(self.policy.extra()),
            evictions=list(self.evictions),
            lost=self.lost,
            quota_admissions=list(self.admissions),
            first_quota=list(self.first_quota),
            job_writes=list(self.policy.job_writes),
            job_write_causes={k: list(v) for k, v in self.policy.job_write_causes.items()},
        )

    def _next_tick(self, t: float, loop: float, t_arr: float) -> float:
        if not self.pending and not self.waiting and math.isinf(t_arr) and not self.backoffs:
            return math.inf
        if self.cfg.exact_ticks:
            return t + loop
        ev = self.policy.next_change(t)
        if self.changed or ev <= t:
            return t + loop
        cands = [ev, t_arr]
        if self.completions:
            cands.append(self.completions[0][0])
        if self.timers:
            cands.append(self.timers[0][0])
        if self.backoffs:
            cands.append(self.backoffs[0][0])
        cands.append(self.requeue_at)
        nxt = min(cands)
        if math.isinf(nxt):
            return math.inf
        return max(t + loop, math.ceil(nxt / loop - 1e-9) * loop)

    # -- invariants ----------------------------------------------------------------------------
    def check(self) -> None:
        """GPUs never over-committed; quota usage agrees with the admitted jobs; a job is in
        exactly one state; running jobs' GPUs equal the cluster's allocation."""
        self.cluster.check()
        self.checks += 1
        for cq in self.cqs.values():
            if cq.used != sum(self.jobs[j].need for j in cq.admitted):
                raise AssertionError(f"{cq.name}: quota usage disagrees with admitted jobs")
        if self.cohort_used > self.cohort_nominal:
            raise AssertionError("cohort over its quota")
        if sum(self.team_quota) != self.cohort_used:
            raise AssertionError("per-team quota usage disagrees with the ClusterQueues'")
        if any(c > a for c, a in zip(self.team_carried, self.team_alloc, strict=True)):
            raise AssertionError("carried-in GPUs above a team's allocation")
        if len(self.cqs) == 1:
            cq = next(iter(self.cqs.values()))
            if cq.used > cq.nominal:
                raise AssertionError("ClusterQueue over its nominal quota")
        running = sum(self.jobs[j].need for j in self.placements)
        if running != self.cluster.allocated:
            raise AssertionError("running jobs and GPU allocation disagree")
        for jid in self.pending:
            if self.state[jid] != PENDING:
                raise AssertionError(f"job {jid} pending in state {self.state[jid]}")
        if any(self.state[j] != WAITING for j in self.waiting):
            raise AssertionError("a waiting job in another state")
        if not self.parked <= self.pending.keys():
            raise AssertionError("a parked (inadmissible) job that is not pending")
