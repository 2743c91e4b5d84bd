"""The operators' dashboard served by `autoscaler serve` at `/`: a static page (HTML, JS and CSS
shipped in this package, no build step, no CDN) over the admin API; `routes.py` adds the JSON
endpoints only the page needs (overview, chart history, preview, versions, rollback)."""
