"""The config file: its model (Kafka's property names, validated with pydantic), the strict
YAML reader, key passwords and the certificate inspection done at load and at reload."""
