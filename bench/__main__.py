"""``python -m bench``: run every benchmark (see ``bench/__init__.py``)."""

from bench import run_all

raise SystemExit(run_all())
