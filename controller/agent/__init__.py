"""The per-node GPU agent (``python -m controller agent``).

Reads every GPU through NVML (``nvml``), judges health (``health``), publishes a compact
inventory in the Node annotation ``wdrf.x-k8s.io/gpu-inventory`` plus Events on the Node
(``publish``, ``kube``) and serves ``wdrf_gpu_*`` Prometheus metrics (``metrics``).
Kept import-light: importing the package does not load NVML or the Kubernetes client.
"""
