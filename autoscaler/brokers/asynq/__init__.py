"""asynq, the Go queue runqy is built on: its reader (`asynq`)."""
