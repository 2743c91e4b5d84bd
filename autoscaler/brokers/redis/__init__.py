"""Celery on Redis (kombu's Redis transport): the reader and its read loop (`celery_redis`),
built of its concerns - one round trip (`rounds`), the per-key piece reads (`piece_reads`), the
in-flight accounting from kombu's unacked index (`unacked`), the head sightings glue
(`sightings`) - and what they use: the script cut into bounded server calls (`redis_pieces`),
the lists' tasks and pieces (`list_scans`), bounded reads of the index and of sets and hashes
(`index_scans`), ETA and age examination of a list's head (`heads`), what a read found per
queue (`found`), kombu's key layout (`keys`); the key layout a watched Redis really has
(`layout`), and kombu's `unacked_mutex` when a machine forges it (`unacked_mutex`)."""
