"""The proxy's I/O shell, laid out by layer, each folder importing only those below it:

- ``config/``: the YAML config, read strictly and checked (files, certificates, key passwords);
- ``protocol/``: sans-I/O Kafka wire handling (framing, header peeks, count guard, address
  rewriting, error responses, a connection's request/response bookkeeping);
- ``evidence/``: what the proxy tells operators (decision recorder, audit sinks, observation
  windows, metrics, logs);
- ``links/``: connections to brokers and TLS (transports, upstream links, client identities);
- ``hooks/``: the per-API policy hooks and the config generation that assembles them;
- ``serve/``: listeners, client connections, the gates, the server and admin HTTP;
- ``cli``: the ``kafka-admission-proxy`` command.

The demo and its embedded broker live in the ``demo`` package, outside the runtime."""
