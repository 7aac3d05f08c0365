"""The fidelity harness: physical DDP re-runs that check dsim's what-if answers (issue #11)."""
