"""Names vulture cannot see used (scripts/test.sh runs it over autoscaler/, benchmarks/ and
celeryconfig.py). Every other function nothing calls fails the build.

Called by frameworks, by name or through a base class:"""

# ruff: noqa: B018, F821
# mypy: ignore-errors

_.do_POST  # http.server.BaseHTTPRequestHandler (agent's local report endpoint)
_.log_message  # http.server.BaseHTTPRequestHandler
_.show  # click.ClickException subclasses (autoscaler/boundary.py)
ConfigScheduler  # celery beat's scheduler class, named in celeryconfig / the beat command line
_.remaining_estimate  # celery.schedules.schedule
_.setup_schedule  # celery.beat.Scheduler
_._collect  # kombu.pidbox.Mailbox (remote_control.BoundedMailbox)
_.process_bind_param  # sqlalchemy TypeDecorator
_.process_result_value  # sqlalchemy TypeDecorator
