"""What the proxy tells operators: every non-admit decision recorded once (metric, audit event,
log line), the audit sinks (files and a Kafka topic), observation windows, Prometheus metrics
and structured logs."""
