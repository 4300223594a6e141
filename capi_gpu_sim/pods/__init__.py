"""A kubelet for the pods we ship: processes built from their manifests (pod_runner.py)."""
