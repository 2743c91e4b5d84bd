"""The server API (`autoscaler serve`): worker endpoints for the agent, admin endpoints for
operators, `/metrics` and `/healthz`. `app.py` builds it; the endpoints are in `routers/`."""
