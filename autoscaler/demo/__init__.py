"""The live demo (`autoscaler demo`): the real loop on one computer, watched in a status table.

Everything runs on the embedded defaults under one folder: the state store and the control
plane's broker (SQLite), `celery worker` and `celery beat` of the control plane, the server API
(`autoscaler serve` on a free loopback port), a demo queue on kombu's SQL transport, and the
local provider's machines, each running the worker agent, which clones the demo's task app from
a Git repository the demo makes in the folder (file://) and runs its Celery worker. A burst of
jobs is published; the loop rents machines, they run the jobs, go idle, are drained through
their agent and destroyed; the demo then prints a summary read from the store and exits.
"""
