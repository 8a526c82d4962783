"""Links toward brokers and the TLS around them: plaintext and TLS transports, upstream
connections with the KIP-498 mismatch check and backoff, the broker directory, and the client
identities minted for brokers' ACLs."""
