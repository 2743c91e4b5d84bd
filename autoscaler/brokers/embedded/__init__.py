"""Celery on kombu's SQLAlchemy transport (`sqla+...` URLs), the embedded broker: its reader
(`celery_sqla`)."""
