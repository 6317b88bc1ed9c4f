"""Developer entry point: start the test control plane in the foreground until Ctrl-C.

    make cluster                         # or: .venv/bin/python -m tests.support.cluster
    python -m tests.support.cluster --e2e --gpu-nodes 2 --no-priority-boost
    make cluster CLUSTER_ARGS="--hami --hami-nodes 2"   # HAMi's scheduler, webhook, GPU nodes
    make cluster CLUSTER_ARGS="--kueue-config examples/recommended/kueue-config.yaml"
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType

import yaml

from tests.support import hami, kube
from tests.support.plane import KueueSettings, Plane
from tests.support.procs import PlaneError


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tests.support.cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--e2e", action="store_true",
                    help="also run kube-controller-manager, kube-scheduler and kwok")
    ap.add_argument("--gpu-nodes", type=int, default=0,
                    help="fake kwok GPU nodes to create (implies --e2e)")
    ap.add_argument("--hami", action="store_true",
                    help="also run HAMi's scheduler (extender + webhook) as its chart does "
                         "(implies --e2e); label namespaces wdrf-test/hami=true to use it")
    ap.add_argument("--hami-nodes", type=int, default=0,
                    help="kwok nodes registered as HAMi's device plugin does, 8 H100 each "
                         "(implies --hami)")
    ap.add_argument("--no-priority-boost", action="store_true",
                    help="start Kueue with the PriorityBoost feature gate off")
    ap.add_argument("--kueue-config", metavar="FILE", default=None,
                    help="merge the keys of this Kueue Configuration into Kueue's manager "
                         "config (e.g. examples/recommended/kueue-config.yaml: Fair Sharing)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir after exit")
    return ap.parse_args(argv)


def kueue_settings_from(settings: KueueSettings, path: Path) -> KueueSettings:
    """`settings` with the keys of a Kueue `Configuration` file merged in (its featureGates
    added to the gates)."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(doc, dict) or doc.get("kind") != "Configuration":
        raise SystemExit(f"{path}: not a Kueue Configuration (kind: Configuration)")
    extra = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "featureGates")}
    gates = {**settings.feature_gates, **(doc.get("featureGates") or {})}
    return replace(settings, extra={**settings.extra, **extra}, feature_gates=gates)


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Start the plane, print how to use it, wait for Ctrl-C, stop everything."""
    args = _parse(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    with_hami = args.hami or args.hami_nodes > 0
    e2e = args.e2e or args.gpu_nodes > 0 or with_hami
    settings = KueueSettings(priority_boost=not args.no_priority_boost)
    if args.kueue_config:
        settings = kueue_settings_from(settings, Path(args.kueue_config))
    t0 = time.monotonic()
    try:
        with Plane.temporary(settings, e2e=e2e, keep=args.keep) as plane:
            api = plane.api_client()
            for i in range(args.gpu_nodes):
                kube.create_gpu_node(api, f"gpu-node-{i}", gpus=8)
            if with_hami:
                plane.start_hami()
                for i in range(args.hami_nodes):
                    hami.create_node(plane, f"hami-node-{i}", hami.cards(f"hami-node-{i}", 8))
            print(f"\ncontrol plane up in {time.monotonic() - t0:.1f}s "
                  f"(Kueue PriorityBoost={'on' if settings.priority_boost else 'off'}"
                  f"{', e2e' if e2e else ''}{', HAMi' if with_hami else ''})")
            print(f"  export KUBECONFIG={plane.kubeconfig}")
            print(f"  kubectl --kubeconfig {plane.kubeconfig} get clusterqueues,workloads -A")
            print(f"  logs: {plane.logs}")
            print("Ctrl-C stops everything.", flush=True)
            while True:
                time.sleep(2)
                plane.check_alive()
    except KeyboardInterrupt:
        print("\nstopping ...")
        return 0
    except PlaneError as e:
        print(f"control plane failed: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
