"""The simulated world: Robot API, GEX131 hosts, GPU shim, local control plane.

Used by tests and `capi-gpu dev up`. Product code never imports this package (an import-linter
contract enforces it).
"""
