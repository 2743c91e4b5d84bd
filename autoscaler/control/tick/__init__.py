"""The evaluation tick: `evaluate` reads top to bottom (claim slots, lease, read, snapshot,
decide(), write, send); `read`, `snapshot` and `actions` are its phases, `fast_path` its
per-second shortcut for queues with jobs and no machine."""
