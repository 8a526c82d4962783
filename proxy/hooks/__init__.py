"""The per-API policy hooks (identifier limits, group size, response size) and the config
generation that assembles them, with the request view they read."""
