"""``[model]``: the OpenAI-compatible endpoint a live campaign's agents call (parsed data).

Rules this module obeys:

1. Every field is checked here; a wrong one is a one-line :class:`ModelTableError` (a ``UserError``) naming
   ``model.<field>`` and what is allowed. Nothing here touches the network (the run
   probes the endpoint before its first episode, ``testbed.run.model_access``).
2. The API key is never part of a campaign: ``api_key_env`` names the environment
   variable the agents read it from, and only that name is recorded.
3. ``placement`` says where the model server sits: ``beside`` each agent (a role call
   crosses no emulated link) or behind the ``central`` host (it crosses the agent's access
   link and the central host's, and its bytes are counted in their own column).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from testbed.errors import UserError

PLACEMENTS = ("beside", "central")
RESPONSE_FORMATS = ("none", "json_object", "json_schema")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class ModelTableError(UserError):
    """A ``[model]`` field is wrong (the campaign file's fault); one line naming it."""


@dataclass(frozen=True)
class ModelSettings:
    """A live campaign's endpoint (``[model]``)."""

    base_url: str = "http://127.0.0.1:8800/v1"
    model: str = "planfence-stand-in"
    api_key_env: str = ""
    temperature: float = 0.2
    top_p: float = 0.95
    max_tokens: int = 1024
    timeout_s: float = 60.0
    seed: int | None = None
    concurrency: int = 1
    placement: str = "beside"
    max_retries: int = 3
    corrections: int = 1
    # How the role's schema constrains decoding: json_object (the schema inside a JSON-mode
    # request, llama.cpp's form; other servers fall back to JSON mode), json_schema (the
    # OpenAI form: vLLM, Ollama, llama-server, hosted APIs) or none (the prompt only).
    response_format: str = "json_object"

    def to_data(self) -> dict[str, Any]:
        """What the manifest records (rule 2: the key's variable name, never the key)."""
        return asdict(self)

    @property
    def upstream(self) -> tuple[str, int]:
        """The (host, port) a relay connects to."""
        url = urlsplit(self.base_url)
        port = url.port or (443 if url.scheme == "https" else 80)
        return url.hostname or "", port


MODEL_FIELDS = tuple(ModelSettings.__dataclass_fields__)


def parse_model(value: Any, *, where: str = "model") -> ModelSettings:
    """``[model]`` in, settings out, or a one-line error naming the field (rule 1)."""
    if not isinstance(value, Mapping):
        raise ModelTableError(f"{where}: expected a [model] table")
    unknown = [k for k in value if k not in MODEL_FIELDS]
    if unknown:
        raise ModelTableError(f"{where}: unknown field {unknown[0]!r}; allowed: "
                            f"{', '.join(MODEL_FIELDS)}")
    out: dict[str, Any] = {}
    if "base_url" in value:
        url = value["base_url"]
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname \
                or parts.query or parts.fragment:
            raise ModelTableError(f"{where}.base_url: {url!r} is not allowed; allowed: an "
                                "http(s) URL of an OpenAI-compatible API, e.g. "
                                "http://127.0.0.1:8000/v1")
        out["base_url"] = url.rstrip("/")
    if "model" in value:
        out["model"] = _text(value["model"], f"{where}.model", "the model name the server "
                             "serves (non-empty, at most 200 characters)")
    if "api_key_env" in value:
        name = value["api_key_env"]
        if not (isinstance(name, str) and (name == "" or _ENV_RE.match(name))):
            raise ModelTableError(f"{where}.api_key_env: {name!r} is not allowed; allowed: the "
                                "name of an environment variable holding the key (or \"\")")
        out["api_key_env"] = name
    for name, lo, hi, what in (("temperature", 0.0, 2.0, "a number 0..2"),
                               ("top_p", 0.0, 1.0, "a number > 0 and <= 1"),
                               ("timeout_s", 0.0, 3600.0, "a number of seconds > 0, <= 3600")):
        if name in value:
            number = value[name]
            ok = _is_number(number) and math.isfinite(number) and number <= hi and (
                number >= lo if name == "temperature" else number > lo)
            if not ok:
                raise ModelTableError(f"{where}.{name}: {number!r} is not allowed; allowed: "
                                    f"{what}")
            out[name] = float(number)
    for name, lo, hi in (("max_tokens", 1, 131072), ("concurrency", 1, 64),
                         ("max_retries", 0, 10), ("corrections", 0, 5)):
        if name in value:
            number = value[name]
            if not (_is_int(number) and lo <= number <= hi):
                raise ModelTableError(f"{where}.{name}: {number!r} is not allowed; allowed: "
                                    f"integers {lo}..{hi}")
            out[name] = int(number)
    if "seed" in value:
        seed = value["seed"]
        if not (_is_int(seed) and 0 <= seed < 2**63):
            raise ModelTableError(f"{where}.seed: {seed!r} is not allowed; allowed: an integer "
                                ">= 0 (sent to servers that support it)")
        out["seed"] = int(seed)
    for name, choices in (("placement", PLACEMENTS), ("response_format", RESPONSE_FORMATS)):
        if name in value:
            if value[name] not in choices:
                raise ModelTableError(f"{where}.{name}: {value[name]!r} is not allowed; "
                                    f"allowed: {', '.join(choices)}")
            out[name] = value[name]
    return ModelSettings(**out)


def model_from_data(data: Mapping[str, Any]) -> ModelSettings:
    """Settings back from :meth:`ModelSettings.to_data` (a manifest's config)."""
    return parse_model({k: v for k, v in data.items() if v is not None})


def _text(value: Any, where: str, allowed: str) -> str:
    if not (isinstance(value, str) and 0 < len(value) <= 200 and value.strip() == value):
        raise ModelTableError(f"{where}: {value!r} is not allowed; allowed: {allowed}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
