"""Test support: a real control plane (``plane``), Kubernetes/Kueue helpers (``kube``), the
``make cluster`` entry point (``cluster``) and the snapshot capture script
(``capture_snapshot``)."""
