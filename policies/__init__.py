"""Sans-I/O admission decisions: no sockets, no trio, no clocks of their own.

Each policy is fed facts by the proxy shell and answers with a decision value;
the shell carries the decision out, counts it and audits it.
"""
