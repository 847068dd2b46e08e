"""The operator's side: the operator console client and the Prometheus exporter."""
