"""Helios runtime: core loading, the KV page pool, the step driver and the scheduler loop."""
