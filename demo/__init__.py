"""``kafka-admission-proxy demo``: an embedded Tansu broker, the proxy in front of it and a
sample workload. Installed with the ``demo`` extra; the runtime package never imports it."""
