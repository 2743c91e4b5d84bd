"""Operations helpers: container health checks (deploy/)."""
