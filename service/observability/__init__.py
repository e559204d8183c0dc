"""What the gateway tells operators: Prometheus metrics, stats, request and log lines."""
