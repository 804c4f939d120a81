# histlog: the two commands a new user needs.
#   make demo   install, then run the scripted demo on the embedded default (no services)
#   make test   install, lint, type-check, start a real Kafka broker (Maven Central jars), run every test
# and the ones that keep them repeatable:
#   make lock         regenerate requirements/lock.txt from pyproject.toml's ranges (newest versions)
#   make test-latest  the whole suite against the newest versions the ranges allow (no lock), in .venv-latest
PY ?= python3
LOCK := requirements/lock.txt
# The lock's own tool, pinned here (it is not a dependency of histlog).
UV_VERSION := 0.13.9
PIP := $(PY) -m pip --disable-pip-version-check

.PHONY: install demo test lint bench lock test-latest

# PIP_CONSTRAINT, not -c: it also pins setuptools and wheel in pip's isolated build of histlog itself.
install:
	PIP_CONSTRAINT=$(LOCK) $(PIP) install --quiet -e '.[test,bench]' setuptools
	$(PY) scripts/check-lock $(LOCK)

demo: install
	histlog demo

lint:
	ruff check engine projections schemas tests bench examples
	mypy

test: install lint
	scripts/test

bench: install
	histlog bench

lock:
	$(PIP) install --quiet 'uv==$(UV_VERSION)'
	$(PY) -m uv pip compile --quiet pyproject.toml requirements/build.in --extra test --extra bench \
	  --universal --python-version 3.11 --upgrade -o $(LOCK)
	@echo "== $(LOCK) regenerated: commit it with whatever it needs, after a full 'make test'"

test-latest:
	$(PY) -m venv --clear .venv-latest
	.venv-latest/bin/python -m pip --disable-pip-version-check install --quiet --upgrade -e '.[test,bench]' setuptools
	-.venv-latest/bin/python scripts/check-lock --drift $(LOCK)
	PATH="$(CURDIR)/.venv-latest/bin:$$PATH" $(MAKE) --no-print-directory lint
	PATH="$(CURDIR)/.venv-latest/bin:$$PATH" scripts/test
