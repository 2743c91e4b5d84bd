"""PURE decision core: triggers, decide(), backoff and schedule maths. No I/O, no clock reads."""
