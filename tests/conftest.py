"""Shared pytest wiring. The Kafka broker fixture lives in tests/kafka_broker.py.

Property tests explore new random examples on a developer's machine (and keep the ones that fail
in ``.hypothesis/``); under ``CI=true`` they run derandomized, so a CI run is reproducible and a
red CI is never a coin toss. Set ``HYPOTHESIS_PROFILE=explore`` to explore under CI too.
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "explore"))

pytest_plugins = ["tests.kafka_broker"]
