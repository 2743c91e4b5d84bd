"""Celery on Redis (kombu's Redis transport): the reader (`celery_redis`), the read cut into
bounded server calls (`redis_pieces`), the key layout a watched Redis really has (`layout`),
and kombu's `unacked_mutex` when a machine forges it (`unacked_mutex`)."""
