"""Controller memory by cluster size: peak RSS of `python -m controller --dry-run --once` (its
own process: informers listing everything, one plan, no writes) against the test control plane
with N pending Workloads, for each N of --workloads.

    .venv/bin/python bench/sizing_bench.py                      # 1000 and 5000 Workloads
    .venv/bin/python bench/sizing_bench.py --workloads 1000,5000,10000

Prints one line per size: Workloads, the controller's peak RSS (MiB, VmHWM of the child), its
wall time. Figures: docs/operations.md, "Sizing".
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.live_bench import create_workloads, wait_kueue_saw_all  # noqa: E402
from tests.support import kube  # noqa: E402
from tests.support.plane import Plane  # noqa: E402


def controller_once(kubeconfig: Path) -> tuple[float, float]:
    """(peak RSS MiB, seconds) of one `--dry-run --once` in a child process."""
    env = {**os.environ, "KUBECONFIG_PATH": str(kubeconfig), "METRICS_PORT": "0",
           "LEADER_ELECTION": "false", "CAPACITY_SOURCE": "quota", "ONCE_TIMEOUT": "600"}
    t0 = time.monotonic()
    with open(os.devnull, "w") as sink:
        child = subprocess.Popen([sys.executable, "-m", "controller", "--dry-run", "--once",
                                  "--config", str(REPO / "config.yaml"), "-o", "json"],
                                 cwd=REPO, env=env, stdout=sink, stderr=subprocess.PIPE)
        assert child.stderr is not None
        err = child.stderr.read()
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage
        child.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - t0
    if child.returncode != 0:
        raise SystemExit(f"controller failed: {err.decode()[-1000:]}")
    return usage.ru_maxrss / 1024, seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="1000,5000", help="comma-separated sizes, growing")
    ap.add_argument("--teams", type=int, default=20)
    args = ap.parse_args()
    sizes = [int(x) for x in args.workloads.split(",")]
    with Plane.temporary() as plane:
        api = plane.api_client()
        teams = [kube.create_namespace(api, f"team-{i:02d}") for i in range(args.teams)]
        kube.create_cluster_queue(api, "bench", {"cpu": 0, "memory": "0"},
                                  namespace_selector={})
        for ns in teams:
            kube.create_local_queue(api, ns, "lq", "bench")
        have = 0
        for n in sorted(sizes):
            create_workloads(plane, n - have, teams, start=have)
            have = n
            wait_kueue_saw_all(plane, n)
            rss, secs = controller_once(plane.kubeconfig)
            print(f"{n} pending Workloads: controller peak RSS {rss:.0f} MiB, "
                  f"dry-run --once {secs:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
