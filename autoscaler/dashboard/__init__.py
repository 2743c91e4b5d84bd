"""The operators' dashboard served by `autoscaler serve` at `/`: a static page (HTML, JS and CSS
shipped in this package, no build step, no CDN) over the admin API, and the config documents
as its editor shows them (`documents.py`). Its JSON endpoints are the API's
(`autoscaler/api/routers/dashboard.py`): this package imports nothing of the API."""

from pathlib import Path

STATIC = Path(__file__).parent / "static"
"""The page's files, served at `/dashboard/static/` (package data)."""

__all__ = ["STATIC"]
