"""Operating the system: the exporter's metrics, the live progress bar, retention, demo data and the demo."""
