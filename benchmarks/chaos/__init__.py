"""The chaos suite: faults, restarts and kills against a real SeaweedFS, every message
counted by id (``python -m benchmarks.chaos [--quick]``; docs/guarantees.md, "Chaos
suite")."""
