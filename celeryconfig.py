"""Celery settings of the autoscaler's own control plane, read from the environment.

Embedded default: kombu's SQLAlchemy transport on SQLite under $AUTOSCALER_HOME, so a fresh
machine runs the loop with nothing but Python. Production: AUTOSCALER_BROKER_URL=redis://...

Never point AUTOSCALER_BROKER_URL at a watched application's Redis database and key prefix:
kombu keeps one `unacked` hash per database/prefix, and our workers' restore logic would requeue
the *application's* in-flight messages under our visibility timeout — its jobs would run twice.
A distinct database number (or server) is required; `global_keyprefix` below is a second fence,
and `autoscaler validate` refuses a config whose watched queue shares both.
"""

from kombu.entity import Queue

from autoscaler.settings import LIFECYCLE_TASKS, Settings

_settings = Settings.from_env()
if _settings.broker_url.startswith("sqla+sqlite") or _settings.result_backend.startswith(
    "db+sqlite"
):
    _settings.ensure_home()

broker_url = _settings.broker_url
result_backend = _settings.result_backend
database_url = _settings.database_url

task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
timezone = "UTC"
enable_utc = True

# The control plane's own queues; watched application queues are only ever *read*. The
# lifecycle steps (providers, machines' remote control: what others can slow down) have a queue
# of their own, so that workers of the loop's queue are never held by them (settings.py).
task_default_queue = _settings.control_queue
task_queues = tuple(
    Queue(name, routing_key=name)  # type: ignore[no-untyped-call]
    for name in (_settings.control_queue, _settings.lifecycle_queue)
)
task_routes = {
    name: {"queue": _settings.lifecycle_queue, "routing_key": _settings.lifecycle_queue}
    for name in LIFECYCLE_TASKS
}
worker_prefetch_multiplier = 1
task_track_started = True
result_expires = 86400
broker_connection_retry_on_startup = True
worker_hijack_root_logger = False

# Results on Redis carry the same prefix: two control planes sharing a database never read
# (or purge) each other's.
result_backend_transport_options: dict[str, object] = {}
if result_backend.startswith(("redis://", "rediss://")):
    result_backend_transport_options = {"global_keyprefix": _settings.control_keyprefix}

broker_transport_options: dict[str, object] = {}
if broker_url.startswith("sqla+sqlite"):
    # Worker, beat and CLI share one SQLite file: wait for its lock instead of failing at once.
    broker_transport_options = {"connect_args": {"timeout": 30}}
elif broker_url.startswith(("redis://", "rediss://")):
    broker_transport_options = {
        "global_keyprefix": _settings.control_keyprefix,
        "visibility_timeout": 3600,
    }

# The loop: our scheduler builds beat's entries from the stored config (tick, fast path,
# reconcile, one per cron trigger) and keeps them in memory: no schedule file is written.
beat_scheduler = "autoscaler.control.beat:ConfigScheduler"
beat_schedule_filename = str(_settings.home / "celerybeat-schedule")
beat_max_loop_interval = 1

if broker_url.startswith("sqla+"):
    # kombu's SQL transport polls once a second; poll more often so a launch leaves within the
    # fast path's second. Its transport options all go to create_engine(), so the interval can
    # only be set on the transport class.
    from kombu.transport import sqlalchemy as _kombu_sqla

    _kombu_sqla.Transport.polling_interval = 0.1
