"""The state store: models, engine/sessions, and the queries the rest of the code needs."""
