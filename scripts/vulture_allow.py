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

# Used only by the tests today (issue 35 item 7 moves them into tests/ or removes them with
# their tests; listed here so the check fails on any new one):
hand_made_workers  # control/observe.py: tests/agent/test_agent.py, tests/api/...
uninstall  # brokers/stamp.py: the brokers and image tests
BrokerWorkers  # brokers/workers.py: tests/brokers/test_workers.py
merge_live_workers  # brokers/workers.py: tests/brokers/test_workers.py
with_broker_workers  # brokers/workers.py: tests/brokers/test_workers.py
_.interruptible_share  # sim/interruptible.py: tests/sim/test_interruptible.py
_.pays  # sim/interruptible.py: tests/sim/test_sim.py
run_one  # sim/run.py: tests/sim/
compare_files  # sim/run.py: tests/sim/test_report_honesty.py
forget_source  # store/head_sightings.py: tests/brokers/test_head_sightings.py
live_agent_workers  # store/instances.py: tests/store/test_instances.py
holder_of  # store/leases.py: tests/store/test_leases.py
claim_tick  # store/leases.py: tests/store/test_leases.py
differences  # store/migrate.py: tests/store/test_migrations.py
unaccounted  # store/retention.py: tests/store/test_retention.py
_.from_keys  # vault.py: the vault and credential tests
