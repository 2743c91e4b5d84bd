"""The decision core stays pure: importing it pulls in no database, network or broker client."""

from __future__ import annotations

import subprocess
import sys

IO_MODULES = ("sqlalchemy", "requests", "redis", "celery", "kombu", "psycopg", "boto3", "werkzeug")


def test_policy_imports_no_io_library():
    code = (
        "import sys, autoscaler.policy.decide, autoscaler.policy.backoff, "
        "autoscaler.policy.schedule, autoscaler.policy.caps, autoscaler.policy.reconcile; "
        f"print(','.join(m for m in {IO_MODULES!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
