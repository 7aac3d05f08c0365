"""The analysis of replays: summary statistics, verdicts, attribution, throughput,
comparison, --fail-if checks and sanity guards (pure functions of tables and rows)."""
