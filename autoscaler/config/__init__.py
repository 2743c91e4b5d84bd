"""Typed configuration: the YAML a user writes, validated with path, cause and fix."""

from autoscaler.config.errors import ConfigError, Refusal
from autoscaler.config.loader import load_config, load_config_text, read_config
from autoscaler.config.models import Config

__all__ = ["Config", "ConfigError", "Refusal", "load_config", "load_config_text", "read_config"]
