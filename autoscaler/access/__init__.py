"""Who may do what: API keys and worker tokens (hashed) and provider credentials (the vault);
the broker users a rented machine holds are `brokers.users`'. Beneath both the lifecycle
(`control/`) and the server API (`api/`), which use it; its queries live in `store/`."""
