"""A provider kind is its options model (registered in `config.provider_options.ProviderConfig`)
and its factory (`providers.registry.FACTORIES`): every registered kind has every part, or this
fails.

Before, a kind was known in seven places, and forgetting one (`config/summary.py`'s terms) made
`validate` describe a rented GPU as "local processes on this machine (nothing is rented)"."""

from __future__ import annotations

import pytest
from click import Choice

from autoscaler.config.fields import Strict
from autoscaler.config.machine_specs import InstanceSpec
from autoscaler.config.provider_options import KEYED_KINDS, PROVIDER_KINDS, PROVIDER_MODELS
from autoscaler.providers.base import AuthError, Provider, ProviderRequestError
from autoscaler.providers.registry import FACTORIES, build_provider

MINIMAL = {
    "runpod": {"kind": "runpod"},
    "vast": {"kind": "vast"},
    "mock": {"kind": "mock"},
    "local": {"kind": "local", "command": "true"},
    "container": {"kind": "container", "gpus": 0},
}


def test_every_kind_has_its_options_model_and_its_factory():
    assert set(PROVIDER_KINDS) == set(FACTORIES)
    assert len(PROVIDER_KINDS) == len(PROVIDER_MODELS) == len(set(PROVIDER_KINDS))
    assert set(MINIMAL) == set(PROVIDER_KINDS), "a new kind: add its minimal options here"
    for model in PROVIDER_MODELS:
        assert issubclass(model, Strict), model


@pytest.mark.parametrize("kind", PROVIDER_KINDS)
def test_every_kind_says_its_terms_price_and_key_need(kind, sessions, tmp_path):
    (model,) = [m for m in PROVIDER_MODELS if m.model_fields["kind"].annotation.__args__ == (kind,)]
    config = model.model_validate(MINIMAL[kind])
    assert config.terms()  # the dry run's words: the base raises for a kind that has none
    spec = InstanceSpec(gpu="RTX 4090", max_price_per_hour=1.0)
    known = config.known_price(spec)
    assert known is None or (known[0] >= 0 and known[1])
    built = build_provider(
        f"p-{kind}",
        config,
        credential="k",
        installation_id="inst",
        sessions=sessions,
        state_dir=tmp_path,
    )
    assert isinstance(built, Provider) and built.kind == kind
    if kind in KEYED_KINDS:  # rented with a key: refused without one
        with pytest.raises(AuthError):
            build_provider(
                f"p-{kind}",
                config,
                credential=None,
                installation_id="inst",
                sessions=sessions,
                state_dir=tmp_path,
            )


@pytest.mark.parametrize("kind", PROVIDER_KINDS)
def test_a_kinds_can_stop_is_its_options_models_and_it_implements_stop_and_start(
    kind, sessions, tmp_path, monkeypatch
):
    """`validate` (the options model) and the provider read one `can_stop`: a kind that says it
    can stop implements both stop and start, and switching the model's flag switches the
    provider's."""
    (model,) = [m for m in PROVIDER_MODELS if m.model_fields["kind"].annotation.__args__ == (kind,)]
    built = build_provider(
        f"p-{kind}",
        model.model_validate(MINIMAL[kind]),
        credential="k",
        installation_id="inst",
        sessions=sessions,
        state_dir=tmp_path,
    )
    assert built.can_stop is model.can_stop
    if model.can_stop:
        assert type(built).stop is not Provider.stop and type(built).start is not Provider.start
    monkeypatch.setattr(model, "can_stop", not model.can_stop)
    assert built.can_stop is model.can_stop


def test_a_kind_that_cannot_stop_refuses_stop_and_start():
    class Fixed(Provider):  # no options model of its own: cannot stop
        kind = "fixed"

        def find_offers(self, spec):
            return []

        def create(self, offer, launch):
            raise NotImplementedError

        def get(self, provider_instance_id):
            return None

        def list_owned(self):
            return []

        def destroy(self, provider_instance_id):
            return None

    fixed = Fixed("rack", "inst")
    assert not fixed.can_stop
    for call in (fixed.stop, fixed.start):
        with pytest.raises(ProviderRequestError, match="fixed machines cannot be stopped"):
            call("asg-inst-x")


def test_the_cli_offers_every_kind():
    from autoscaler.cli import main

    add = main.commands["providers"].commands["add"]  # type: ignore[attr-defined]
    (kind,) = [p for p in add.params if p.name == "kind"]
    assert isinstance(kind.type, Choice) and tuple(kind.type.choices) == PROVIDER_KINDS
