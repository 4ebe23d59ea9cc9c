"""``python -m backend`` is the ``vigil`` command."""

from backend.cli import main

main()
