"""Providers: one module per provider behind the small interface in `base` (the container
provider keeps its engine calls in `container_engine` and its containers' make-up in
`container_spec`)."""

from autoscaler.providers.base import (
    AmbiguousCreateError,
    AuthError,
    CapacityError,
    LaunchSpec,
    MachineStatus,
    NotOwnedError,
    Offer,
    OfferGoneError,
    Provider,
    ProviderError,
    ProviderMachine,
    ProviderRequestError,
    RateLimitedError,
    ResumeRefusedError,
    TransientError,
    create_on_first_offer,
)

__all__ = [
    "AmbiguousCreateError",
    "AuthError",
    "CapacityError",
    "LaunchSpec",
    "MachineStatus",
    "NotOwnedError",
    "Offer",
    "OfferGoneError",
    "Provider",
    "ProviderError",
    "ProviderMachine",
    "ProviderRequestError",
    "RateLimitedError",
    "ResumeRefusedError",
    "TransientError",
    "create_on_first_offer",
]
