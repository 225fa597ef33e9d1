"""Does a drafter fit the target it will be served with? A serving engine (SGLang, vLLM)
runs the drafter on the target's embedding, positions and tokens; where the drafter was
trained with other ones, every draft is wrong and the engine accepts nothing (τ 1), with
no error anywhere. These are the fields that decide it, compared one by one:

================== ===================================================================
embedding scale    what the embedding is multiplied by before the first layer (Gemma:
                   √H, inside its model; MiniCPM: ``scale_emb``; Granite:
                   ``embedding_multiplier``; otherwise 1). The drafter records the scale
                   its training applied (``dflash_config.embedding_scale``)
rope theta/scaling the positions' rotary base and scaling (YaRN, linear, ...)
norm eps           ``rms_norm_eps``
vocab size         rows of the embedding and LM head the drafter shares
bos/eos/pad ids    the special tokens
chat template      the prompt format (its SHA-256; ``dflash_config.chat_template_sha256``)
================== ===================================================================

The target's side is read from its files (``config.json``, ``generation_config.json``,
``tokenizer_config.json``, ``chat_template.jinja``), or from a named shape; the
drafter's from its exported ``config.json``, where the trainer writes the target's values
at export (:func:`export_fields`). A field the drafter's config does not record (an
export made before it did, or another trainer's) is listed as not compared. Plain Python,
no torch: ``dflash-eval --check-config`` answers before anything is loaded.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash import reading, stdlib_target
from dflash.config import TargetShape
from dflash.errors import TargetError
from dflash.presets import STDLIB_TARGET, TARGET_SHAPES, target_path

if TYPE_CHECKING:
    from dflash.target import TargetModel

FIELDS = ("embedding_scale", "rope_theta", "rope_scaling", "rms_norm_eps", "vocab_size",
          "bos_token_id", "eos_token_id", "pad_token_id", "chat_template")
WHY = {
    "embedding_scale": "the drafter's first layer sees embeddings of another size",
    "rope_theta": "positions rotate at another rate",
    "rope_scaling": "positions are scaled differently",
    "rms_norm_eps": "every norm computes other values",
    "vocab_size": "token ids index other rows",
    "bos_token_id": "another start token",
    "eos_token_id": "another end token: drafts run past the end or stop early",
    "pad_token_id": "another padding token",
    "chat_template": "prompts are formatted otherwise than in training",
}
"""What a serving engine gets wrong when the field differs."""
NAMES = {"embedding_scale": "embedding scale", "rope_theta": "rope theta",
         "rope_scaling": "rope scaling", "rms_norm_eps": "norm eps",
         "vocab_size": "vocab size", "bos_token_id": "bos id", "eos_token_id": "eos id",
         "pad_token_id": "pad id", "chat_template": "chat template"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Difference:
    """One field on which the drafter and the target disagree."""

    field: str
    drafter: Any
    target: Any

    def line(self) -> str:
        return (f"{NAMES[self.field]}: drafter {_show(self.field, self.drafter)}, target "
                f"{_show(self.field, self.target)} ({WHY[self.field]})")


@dataclass(frozen=True, kw_only=True, slots=True)
class ConfigCheck:
    """Every difference, and the fields the drafter's config does not record."""

    differences: tuple[Difference, ...]
    not_recorded: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.differences

    def lines(self) -> list[str]:
        """One line per difference, then one naming what was not compared."""
        out = [d.line() for d in self.differences]
        if self.not_recorded:
            out.append("not compared (the drafter's config.json does not record them): "
                       + ", ".join(NAMES[f] for f in self.not_recorded))
        return out


def _show(field: str, value: Any) -> str:
    if value is None:
        return "none"
    if field == "chat_template":
        return f"sha256 {value[:12]}"
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else str(value)


def _same(field: str, a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(a)), abs(float(b)))
    if field == "eos_token_id":  # one id and a list of that one id are the same
        return bool(_ids(a) == _ids(b))
    return bool(a == b)


def _ids(value: Any) -> Any:
    if isinstance(value, list):
        return sorted(value) if len(value) != 1 else value[0]
    return value


def compare(drafter: dict[str, Any], target: dict[str, Any]) -> ConfigCheck:
    """Every field of :data:`FIELDS` the drafter records, against the target's."""
    diffs, missing = [], []
    for field in FIELDS:
        if field not in drafter:
            missing.append(field)
        elif not _same(field, drafter[field], target.get(field)):
            diffs.append(Difference(field=field, drafter=drafter[field],
                                    target=target.get(field)))
    return ConfigCheck(differences=tuple(diffs), not_recorded=tuple(missing))


# -- each side's fields -----------------------------------------------------------------

def rope_scaling_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """The config's RoPE scaling (``rope_scaling``, or transformers 5's
    ``rope_parameters`` without the base); None when positions are not scaled."""
    rope = config.get("rope_scaling") or config.get("rope_parameters") or None
    if not isinstance(rope, dict):
        return None
    rope = {k: v for k, v in rope.items() if k != "rope_theta"}
    kind = rope.get("rope_type", rope.get("type", "default"))
    return None if kind in ("default", None) and len(rope) <= 1 else rope


def embedding_scale_of(config: dict[str, Any]) -> float:
    """What the architecture multiplies its token embeddings by."""
    if str(config.get("model_type", "")).startswith("gemma"):
        return math.sqrt(float(config["hidden_size"]))
    for key in ("scale_emb", "embedding_multiplier"):
        if isinstance(config.get(key), int | float):
            return float(config[key])
    return 1.0


def template_digest(template: Any) -> str | None:
    """SHA-256 of a chat template (a string, or transformers' list of named ones)."""
    if template is None or template == "" or template == []:
        return None
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = reading.read_json(path, TargetError)
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def _token_ids(tokenizer: dict[str, Any]) -> dict[str, int]:
    """tokenizer_config.json's special tokens (strings or {"content": ...}) as ids, read
    from its ``added_tokens_decoder``."""
    ids = {str(v.get("content")): int(k) for k, v in
           (tokenizer.get("added_tokens_decoder") or {}).items() if isinstance(v, dict)}
    out = {}
    for name in ("bos", "eos", "pad"):
        token = tokenizer.get(f"{name}_token")
        text = token.get("content") if isinstance(token, dict) else token
        if isinstance(text, str) and text in ids:
            out[f"{name}_token_id"] = ids[text]
    return out


def fields_of(config: dict[str, Any], folder: Path | None = None) -> dict[str, Any]:
    """A target's fields: its ``config.json`` (and, in ``folder``, its generation config
    and tokenizer files for what the config leaves out)."""
    rope_theta = config.get("rope_theta")
    if rope_theta is None:
        rope_theta = (config.get("rope_parameters") or {}).get("rope_theta", 10_000.0)
    out: dict[str, Any] = {
        "embedding_scale": embedding_scale_of(config), "rope_theta": float(rope_theta),
        "rope_scaling": rope_scaling_of(config), "rms_norm_eps": config.get("rms_norm_eps"),
        "vocab_size": config.get("vocab_size")}
    generation = _read_json(folder / "generation_config.json") if folder else {}
    tokenizer = _read_json(folder / "tokenizer_config.json") if folder else {}
    from_tokenizer = _token_ids(tokenizer)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        out[key] = next((v for v in (config.get(key), generation.get(key),
                                     from_tokenizer.get(key)) if v is not None), None)
    template = tokenizer.get("chat_template")
    jinja = folder / "chat_template.jinja" if folder else None
    if template is None and jinja is not None and jinja.is_file():
        template = reading.read_text(jinja, TargetError, "chat template")
    out["chat_template"] = template_digest(template)
    return out


def shape_fields(shape: TargetShape) -> dict[str, Any]:
    """A named shape's fields: dflash's own Qwen3 (no tokenizer; the norm eps and the
    unscaled RoPE that :func:`dflash.target.load_target` builds it with)."""
    return fields_of({"model_type": "qwen3", "hidden_size": shape.hidden_size,
                      "rope_theta": shape.rope_theta, "rms_norm_eps": 1e-6,
                      "vocab_size": shape.vocab_size})


def target_fields(source: str) -> dict[str, Any]:
    """The fields of the target ``--target source`` names: a named shape, ``tiny-stdlib``
    (once built), a model folder or a ``config.json``."""
    if source == STDLIB_TARGET:
        folder = stdlib_target.built()
        if folder is None:
            raise TargetError(f"{STDLIB_TARGET} is not built yet (dflash-train --preset demo "
                              "builds it)")
        return fields_of(_read_json(folder / "config.json"), folder)
    path = target_path(source)
    if path is None:
        return shape_fields(TARGET_SHAPES[source])
    config = _read_json(path if path.is_file() else path / "config.json")
    if not config:
        raise TargetError(f"{path}: no model config (config.json) to compare with")
    return fields_of(config, path if path.is_dir() else path.parent)


def drafter_fields(config: dict[str, Any]) -> dict[str, Any]:
    """What an exported drafter's ``config.json`` records of :data:`FIELDS` (the published
    layout's fields, and what the trainer adds at export)."""
    dflash = config.get("dflash_config") or {}
    keys = ("rope_theta", "rms_norm_eps", "vocab_size", "bos_token_id", "eos_token_id",
            "pad_token_id")
    out: dict[str, Any] = {k: config[k] for k in keys if k in config}
    if "rope_theta" in out:
        out["rope_theta"] = float(out["rope_theta"])
    if "rope_scaling" in config or "rope_parameters" in config:
        out["rope_scaling"] = rope_scaling_of(config)
    if "embedding_scale" in dflash:
        out["embedding_scale"] = dflash["embedding_scale"]
    if "chat_template_sha256" in dflash:
        out["chat_template"] = dflash["chat_template_sha256"]
    return out


def export_record(source: str, target: TargetModel) -> dict[str, Any]:
    """:func:`export_fields` of the target ``source`` names, with the scale the trainer's
    embedding applied (a scaled embedding module's ``embed_scale``, else 1): what the
    trainer writes into the export's config.json ({} when the target's files do not
    read: the export must not fail for its notes)."""
    module = target.model.get_input_embeddings()
    scale = float(getattr(module, "embed_scale", 1.0))
    try:
        return export_fields(target_fields(source), scale)
    except TargetError:
        return {}


def export_fields(target: dict[str, Any], embedding_scale: float) -> dict[str, Any]:
    """What the trainer adds to the exported ``config.json``: the target's special ids
    and chat template's digest, and the embedding scale training applied."""
    return {"bos_token_id": target.get("bos_token_id"),
            "eos_token_id": target.get("eos_token_id"),
            "pad_token_id": target.get("pad_token_id"),
            "dflash_config": {"embedding_scale": embedding_scale,
                              "chat_template_sha256": target.get("chat_template")}}
