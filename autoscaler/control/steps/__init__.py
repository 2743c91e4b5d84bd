"""The lifecycle steps: launch, drain, stop, resume, terminate, handback. Each module declares
its step (`STEP`, a `frame.Step`), run in the one frame (`frame.run_step`);
`control.tasks.STEPS` registers each with its Celery task.

A new step: its module here; its name in `control.outbox.StepName`; its line in
`control.tasks.STEPS`; its task in `settings.LIFECYCLE_TASKS` (`tests/control/
test_step_registry.py` fails on any one forgotten); reconcile's retry in `policy/reconcile_rules.py`
if a lost one must be sent again.
"""
