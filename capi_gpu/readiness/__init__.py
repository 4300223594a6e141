"""The three readiness layers: node taint + condition, Machine readinessGate, DRA binding conditions."""
