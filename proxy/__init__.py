"""The trio I/O shell of kafka-admission-proxy: listeners, TLS, upstream links,
framing, address rewriting, admin HTTP, audit sink, config and CLI."""
