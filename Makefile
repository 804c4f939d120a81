# histlog: the two commands a new user needs.
#   make demo   install, then run the scripted demo on the embedded default (no services)
#   make test   install, lint, type-check, start a real Kafka broker (Maven Central jars), run every test
PY ?= python3

.PHONY: install demo test lint bench kafka-start kafka-stop

install:
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'

demo: install
	histlog demo

lint:
	ruff check engine projections schemas tests bench examples
	mypy

test: install lint
	scripts/test

bench: install
	histlog bench
