"""A period fanned out: its run, the coordinator's walk, the items it records, progress and reconcile."""
