"""Repo-wide pytest plugins: the control-plane fixtures serve tests/integration and e2e/ alike."""

pytest_plugins = ["capi_gpu_sim.fixtures"]
