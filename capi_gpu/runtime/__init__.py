"""The operator's runtime: what every loop shares, below the loops themselves.

The clients and settings a pass runs with (``deps``, ``settings``), Events (``events``), the per-object
loop driver (``loops``), the pause rule (``pause``), the workload-cluster supervisor the gate and the claim
scaler run under (``workload``), the operator's metrics and the diff base kopf keeps. ``controllers``,
``readiness`` and ``autoscaler`` import from here; nothing here imports them back (import-linter).
"""
