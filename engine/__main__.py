"""``python -m engine`` runs the ``histlog`` CLI."""

from engine.cli import main

raise SystemExit(main())
