"""Sans-I/O Kafka protocol handling: framing, header peeks and body decoding through kio, the
count guard, broker address rewriting, error responses and one connection's request/response
bookkeeping. No sockets, no tasks, no clocks of their own."""
