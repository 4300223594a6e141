"""The v1alpha1 API: pydantic models that are the single source of the CRD schemas."""
