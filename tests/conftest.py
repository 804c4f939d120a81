"""Shared pytest wiring. The Kafka broker fixture lives in tests/kafka_broker.py."""

pytest_plugins = ["tests.kafka_broker"]
