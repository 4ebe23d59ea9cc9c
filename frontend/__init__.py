"""Web UI assets: Jinja2 templates and static files, served by ``backend/ui``.

Nothing here imports Python code; the backend renders these templates.
"""

from pathlib import Path

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
STATIC_DIR = Path(__file__).resolve().parent / "static"
