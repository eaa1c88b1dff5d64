"""The one harness every benchmark suite builds on: configuration, provenance,
timing, metrics, training, baselines, reports, records and pages, shared problems
and the published reference (a module each)."""
