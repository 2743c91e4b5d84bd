"""Providers: one module per provider behind the small interface in `base`."""

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
