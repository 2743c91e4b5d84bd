"""Queue metrics: every source behind one small interface (`MetricsReader.read(queues)`).

Readers: `celery_redis`, `celery_rabbitmq`, `celery_sqla`, `asynq`, `redis_list` (lists and
streams); values for `metric` triggers: `prometheus`; live workers: `workers`; the fallback on
failure: `fallback`; the producer hook that stamps publish times: `stamp`. Build them from config
with `registry.build_source`.
"""

from autoscaler.metrics.base import MetricsReader, SourceError
from autoscaler.metrics.fallback import FallbackReader

__all__ = ["FallbackReader", "MetricsReader", "SourceError"]
