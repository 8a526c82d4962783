"""Serving clients: listeners and their accept loops, client connections (terminating and
``tls: passthrough``), the connection and memory-pool gates, the server that ties them
together with hot reload, and the admin HTTP endpoint."""
