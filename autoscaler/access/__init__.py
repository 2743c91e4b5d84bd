"""Who may do what: API keys and worker tokens (hashed), provider credentials (the vault), and
the broker users a rented machine holds. Beneath both the lifecycle (`control/`) and the server
API (`api/`), which use it; its queries live in `store/`."""
