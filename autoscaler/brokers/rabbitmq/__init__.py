"""Celery on RabbitMQ: the reader through the management API (`celery_rabbitmq`) and the
per-machine RabbitMQ users (`users`)."""
