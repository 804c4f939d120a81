"""Placeholder: replaced by the Kafka broker fixture (issue 4)."""
