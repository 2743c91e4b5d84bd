"""The brokers we watch: their queues read, their workers probed, their per-machine users made.

One subpackage per transport, as kombu has them: `redis` (Celery on Redis: the reader, its
pieces, kombu's key layout, the unacked mutex), `rabbitmq` (Celery on RabbitMQ: the reader, the
per-machine users), `embedded` (Celery on kombu's SQL transport, the embedded broker), `asynq`,
`lists` (plain Redis lists and streams). Transport-neutral, here: `base` (the one small
interface every source implements, `MetricsReader.read(queues)`, and what they share),
`registry` (each source kind's reader, by its config's `source`; `build_source` from config),
`fallback` (last-known numbers on failure), `prometheus` (values for `metric` triggers),
`workers` and `remote_control` (live workers through Celery's remote control), `marks` (age
bounds of unstamped jobs), `stamp` (the producer hook that stamps publish times), `users`
(per-machine broker users), `redis_client` (the one way a Redis is opened).
"""

from autoscaler.brokers.base import MetricsReader, SourceError
from autoscaler.brokers.fallback import FallbackReader

__all__ = ["FallbackReader", "MetricsReader", "SourceError"]
