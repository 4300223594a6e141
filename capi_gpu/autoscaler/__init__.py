"""Scale-ups cluster-autoscaler cannot make for MIG claims, and the annotations that let it make the rest.

cluster-autoscaler builds a scale-from-zero template node from annotations whose synthetic ResourceSlice
only knows ``type: gpu`` (kubernetes/autoscaler#10199), so a claim for a MIG profile never triggers a
scale-up. This package writes the annotations CA can use (``annotations``, ``sync``) and runs an optional
claim-aware scaler for the MachineDeployments CA does not own (``demand`` -> ``decide`` -> ``scaler``).
"""
