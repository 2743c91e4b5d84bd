"""Celery tasks and the beat schedule: thin glue from store + metrics + policy + providers."""
