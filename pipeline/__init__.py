"""The PySpark job that turns the proxy's audit events into a policy-impact
report. It grows with the audit sink; the proxy core ships without it."""
