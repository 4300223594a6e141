"""GPU knowledge without I/O: MIG profile catalog, layout validation, nvidia-smi parsing."""
