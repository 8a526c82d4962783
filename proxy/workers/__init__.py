"""Worker processes (``workers: N``): the supervisor, which owns the limits every worker
shares, the workers on the same ports, and the link between them (docs/workers.md)."""
