"""``IngressSettings`` and API keys from a ``ClusterConfig`` (the ingress never reads YAML).

Settings are per served model. The effective ``max_model_len`` is the smaller of its two pools'
limits (each the pool's ``engine.max_model_len`` or the checkpoint's own limit), so the ingress
rejects a prompt that either pool would refuse. API keys come from the file or environment
variable the config names, read inside the ingress replica so no key ever travels in the
deployment's arguments."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from cluster.ingress.settings import IngressSettings
from core.config import ClusterConfig, ServedModel, ServerConfig
from core.config.models import ROLES, served_names
from core.errors import ConfigError
from engine.models import ModelArchConfig


def load_api_keys(server: ServerConfig, environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The accepted API keys (empty: no authentication); ConfigError when the source is empty."""
    if server.api_keys_file:
        try:
            lines = Path(server.api_keys_file).expanduser().read_text().splitlines()
        except OSError as e:
            raise ConfigError(
                f"cannot read server.api_keys_file: {e}", param="server.api_keys_file"
            ) from e
        keys = frozenset(line.strip() for line in lines if line.strip())
        source, param = server.api_keys_file, "server.api_keys_file"
    elif server.api_keys_env:
        # NOTE: the config names the variable; reading it is the only env access outside
        # core/env.py in this package (like transfer's auth token).
        value = (environ if environ is not None else os.environ).get(server.api_keys_env, "")
        keys = frozenset(part.strip() for part in value.split(",") if part.strip())
        source, param = f"${server.api_keys_env}", "server.api_keys_env"
    else:
        return frozenset()
    if not keys:
        raise ConfigError(f"no API keys in {source}", param=param)
    return keys


def effective_max_model_len(served: ServedModel, arch: ModelArchConfig) -> int:
    """The longest prompt + output both of the model's pools accept."""
    limits = []
    for role in ROLES:
        configured = served.engine_for(role).max_model_len
        limits.append(arch.max_model_len if configured is None else configured)
    return min(limits)


def build_ingress_settings(
    config: ClusterConfig,
    served: ServedModel,
    model_dir: Path,
    environ: Mapping[str, str] | None = None,
) -> IngressSettings:
    """The ingress's settings for ``served`` (one of ``config``'s models, its checkpoint in
    ``model_dir``)."""
    arch = ModelArchConfig.from_dir(model_dir)
    names = tuple(n for n, m in served_names(config.served_models()).items() if m == served)
    decode_engine = served.engine_for("decode")
    return IngressSettings(
        served_model_names=names,
        max_model_len=effective_max_model_len(served, arch),
        block_size=decode_engine.block_size,
        hash_seed=decode_engine.hash_seed,
        server=config.server,
        routing=config.routing,
        disaggregation=config.disaggregation,
        pipelined_from_tokens=pipelined_from_tokens(config, served),
        prefill_required=served.prefill.min_replicas > 0,
        api_keys=load_api_keys(config.server, environ),
        lora_modules=served.model.lora_modules,
    )


def pipelined_from_tokens(config: ClusterConfig, served: ServedModel) -> int | None:
    """The shortest prompt the pipelined handoff is used for: every one (``on``), none
    (``off``), or those longer than one chunk of the prefill pool's engine (``auto``: a
    one-chunk prompt finishes before its transfer could start)."""
    mode = config.disaggregation.pipelined_handoff
    if mode == "off":
        return None
    if mode == "on":
        return 0
    engine = served.engine_for("prefill")
    return (engine.long_prefill_token_threshold or engine.max_num_batched_tokens) + 1
