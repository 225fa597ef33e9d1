"""The frozen target model: any Hugging Face causal LM, and the features DFlash taps from it.

A target comes from one of three sources:
- a named shape (``dflash.presets.TARGET_SHAPES``): a Qwen3 config with random weights, built on the
  meta device and initialised directly on the target device (an 8B-shaped model never
  exists in fp32 on the host);
- a local folder with a ``config.json`` but no weights, or a ``config.json`` file:
  the same, for any architecture transformers knows;
- a local folder with weights: its safetensors read onto the device, offline.

A Qwen3 (every named shape, and any folder whose config is a plain Qwen3) runs on
dflash's own network (``dflash.qwen3``), which keeps transformers' import, about 5 s on
a GPU host, off the trainer's start; any other architecture is built by transformers.
``DFLASH_TARGET_BACKEND=transformers`` builds a Qwen3 with transformers too.

The target is frozen and in eval mode. ``features`` runs it only up to the highest
tapped layer (forward hooks capture the taps; the last one stops the forward), so the
layers above the taps cost nothing in training. transformers is imported lazily, and only
for a target ``dflash.qwen3`` does not run.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
from torch import Tensor, nn

from dflash import qwen3, reading
from dflash.config import DrafterConfig, TargetShape, target_layer_ids_for
from dflash.errors import TargetError
from dflash.model import KVCache
from dflash.presets import STDLIB_TARGET, TARGET_SHAPES, target_path
from dflash.ticks import TickFn

if TYPE_CHECKING:
    from transformers import (
        DynamicCache,
        PretrainedConfig,
        PreTrainedModel,
        PreTrainedTokenizerBase,
    )


TargetCache: TypeAlias = "DynamicCache | KVCache"
"""A decoding cache: dflash's own for its Qwen3, transformers' for any other target."""


class _StopForward(Exception):
    """Raised by the hook on the highest tapped layer to end the forward early."""


class TargetModel:
    """A frozen causal LM plus the tapped layers. Every method is no-grad."""

    def __init__(self, model: PreTrainedModel | qwen3.Qwen3ForCausalLM,
                 layer_ids: tuple[int, ...], mask_token_id: int,
                 tokenizer: PreTrainedTokenizerBase | None = None) -> None:
        hf: Any = model  # transformers' model methods (eval, get_decoder, ...) are untyped
        self.model: Any = hf.eval().requires_grad_(False)
        self.config: PretrainedConfig | qwen3.Qwen3Config = model.config
        self.layers: nn.ModuleList = hf.get_decoder().layers
        self.num_layers = len(self.layers)
        if not layer_ids or list(layer_ids) != sorted(set(layer_ids)):
            raise TargetError(f"layer ids must be strictly increasing, got {list(layer_ids)}")
        if layer_ids[0] < 0 or layer_ids[-1] >= self.num_layers:
            raise TargetError(f"layer ids {list(layer_ids)} outside the target's "
                              f"{self.num_layers} layers")
        self.layer_ids = tuple(layer_ids)
        self.tokenizer = tokenizer
        emb: nn.Embedding = hf.get_input_embeddings()
        self.vocab_size, self.hidden_size = (int(n) for n in emb.weight.shape)
        if not 0 <= mask_token_id < self.vocab_size:
            raise TargetError(f"mask token id {mask_token_id} outside the embedding "
                              f"({self.vocab_size} rows)")
        self.mask_token_id = mask_token_id
        self.device: torch.device = emb.weight.device
        self.dtype: torch.dtype = emb.weight.dtype
        self._embed = emb
        self.lm_head: nn.Module = hf.get_output_embeddings()
        forward_params = inspect.signature(hf.forward).parameters
        self._cache_kw = "cache" if "cache" in forward_params else "past_key_values"
        self._taps: dict[int, Tensor] = {}
        self._stop_after: int | None = None
        self.released = False
        for i in self.layer_ids:
            self.layers[i].register_forward_hook(self._hook(i))

    def _hook(self, index: int) -> Any:
        def capture(_module: nn.Module, _args: Any, output: Any) -> None:
            self._taps[index] = output[0] if isinstance(output, tuple) else output
            if index == self._stop_after:
                raise _StopForward
        return capture

    @contextmanager
    def _tapping(self, stop_early: bool) -> Iterator[dict[int, Tensor]]:
        self._taps = {}
        self._stop_after = self.layer_ids[-1] if stop_early else None
        try:
            yield self._taps
        finally:
            self._stop_after = None
            self._taps = {}

    def _concat_taps(self, taps: dict[int, Tensor]) -> Tensor:
        return torch.cat([taps[i] for i in self.layer_ids], dim=-1)

    @torch.no_grad()
    def embed(self, ids: Tensor) -> Tensor:
        out: Tensor = self._embed(ids)
        return out

    @property
    def feature_dim(self) -> int:
        return len(self.layer_ids) * int(self.hidden_size)

    def release_layers(self) -> None:
        """Free the decoder layers, keeping the embedding and LM head: a drafter rank
        whose features come from target ranks needs nothing else."""
        self.model.get_decoder().layers = nn.ModuleList()
        self.layers = self.model.get_decoder().layers
        self.released = True

    @torch.no_grad()
    def features(self, input_ids_BS: Tensor) -> Tensor:
        """[B, S, k*H]: the tapped layers' outputs (HF hidden_states[i+1]), concatenated.

        Runs only up to the highest tapped layer. Causal attention makes right padding
        harmless to the real positions, so no attention mask is passed.
        """
        if self.released:
            raise TargetError("this target's layers were released (features come from "
                              "the target ranks)")
        with self._tapping(stop_early=True) as taps:
            with suppress(_StopForward):
                self.model(input_ids=input_ids_BS, use_cache=False)
            return self._concat_taps(taps)

    def new_cache(self) -> TargetCache:
        if isinstance(self.model, qwen3.Qwen3ForCausalLM):
            return self.model.new_cache()
        from transformers import DynamicCache
        return DynamicCache()

    @staticmethod
    def cache_length(cache: TargetCache) -> int:
        return int(cache.get_seq_length())

    @staticmethod
    def crop_cache(cache: TargetCache, length: int) -> None:
        """Keep the first ``length`` positions. A negative argument to transformers'
        ``crop`` means 'remove that many' in every version (5.x accepts only that form)."""
        remove = int(cache.get_seq_length()) - length
        if remove < 0:
            raise ValueError(f"cannot crop a cache of {cache.get_seq_length()} to {length}")
        if isinstance(cache, KVCache):
            cache.crop(length)
        elif remove:
            cache.crop(-remove)

    @torch.no_grad()
    def forward_cached(self, ids_BT: Tensor, cache: TargetCache, start: int, *,
                       last_only: bool = False, pad_B: Tensor | None = None
                       ) -> tuple[Tensor, Tensor]:
        """Run T new tokens at positions start..start+T-1 on top of ``cache``.

        Returns fp32 logits [B, T, V] and the tapped features [B, T, k*H]; with
        ``last_only`` (plain generation) the logits and features of the last position
        only, [B, 1, ...]: a prefill then never holds a [B, T, V] logits tensor.
        ``pad_B`` (a left-padded batch): row b's first ``pad_B[b]`` positions are padding;
        they are masked, and the row's positions count from its first token.
        """
        if self.cache_length(cache) != start:
            raise ValueError(f"cache holds {self.cache_length(cache)} positions, not {start}")
        bsz, t = ids_BT.shape
        pos_BT = torch.arange(start, start + t, device=ids_BT.device).expand(bsz, t)
        keep: dict[str, Any] = {"logits_to_keep": 1} if last_only else {}
        if pad_B is not None:
            pos_BT = (pos_BT - pad_B[:, None]).clamp(min=0)
            keep["attention_mask"] = (torch.arange(start + t, device=ids_BT.device)[None]
                                      >= pad_B[:, None]).long()
        with self._tapping(stop_early=False) as taps:
            out = self.model(input_ids=ids_BT, position_ids=pos_BT, use_cache=True,
                             **{self._cache_kw: cache}, **keep)
            features = self._concat_taps(taps)
            return out.logits.float(), features[:, -1:] if last_only else features


# -- building targets ----------------------------------------------------------------------

def _own_backend() -> bool:
    return os.environ.get("DFLASH_TARGET_BACKEND", "dflash") != "transformers"


def _qwen3_config(shape: TargetShape) -> qwen3.Qwen3Config:
    return qwen3.Qwen3Config(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size, num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim, rope_theta=shape.rope_theta, rms_norm_eps=1e-6,
        max_position_embeddings=40960, tie_word_embeddings=shape.tie_embeddings)


def transformers_config(config: qwen3.Qwen3Config) -> Any:
    """The same Qwen3 as a transformers config (rope_theta: a keyword in 4.x, folded into
    rope_parameters by 5.x)."""
    from transformers import Qwen3Config
    kwargs = {k: v for k, v in config.to_json().items() if k not in ("architectures",
                                                                    "model_type")}
    return Qwen3Config(**kwargs)


def _random_model(config: Any, device: torch.device, dtype: torch.dtype, seed: int
                  ) -> Any:
    """Build on meta, allocate on ``device``, fill matrices with N(0, 1/fan_in) and norm
    weights with ones. 1/fan_in (about HF's 0.02 at H=4096) keeps logits at a realistic
    scale for every width; 0.02 at H=64 gives near-uniform next-token distributions.
    Either backend draws the same weights: the parameters by name, in sorted order."""
    if isinstance(config, qwen3.Qwen3Config) and not _own_backend():
        config = transformers_config(config)
    own = isinstance(config, qwen3.Qwen3Config)
    if own:
        model: Any = qwen3.build(config, dtype)
    else:
        from transformers import AutoModelForCausalLM
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]
    if device.type == "meta":  # shapes only (FLOP counts, feature sizes): no values
        return model
    if own:
        qwen3.allocate(model, device)  # storage, and the RoPE frequencies computed
    else:
        model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        # Tied names twice (the head, then the embedding that overwrites it): the same draws
        # whether or not the model was tied when it was built (transformers ties later).
        for _name, param in sorted(model.named_parameters(remove_duplicate=False),
                                   key=lambda item: item[0]):
            if param.dim() == 1:
                param.fill_(1.0)
            else:
                param.normal_(0.0, param.shape[1] ** -0.5, generator=gen)
    if not own:
        # to_empty leaves non-persistent buffers (RoPE inv_freq) as garbage: rebuild them.
        for name, module in list(model.named_modules()):
            if "inv_freq" in dict(module.named_buffers(recurse=False)):
                fresh = type(module)(config=module.config).to(device)
                parent = model.get_submodule(name.rpartition(".")[0])
                setattr(parent, name.rpartition(".")[2], fresh)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return model


def _read_config(path: Path) -> Any:
    """The JSON of a ``config.json`` (``path`` the file or its folder); None if absent."""
    file = path if path.is_file() else path / "config.json"
    try:
        return reading.read_json(file, TargetError, "model config")
    except FileNotFoundError:
        return None


def _own_config(path: Path) -> qwen3.Qwen3Config | None:
    return qwen3.config_from_json(_read_config(path)) if _own_backend() else None


def _config_only(path: Path) -> Any:
    own = _own_config(path)
    if own is not None:
        return own
    from transformers import AutoConfig
    try:
        if path.is_file():
            return AutoConfig.for_model(**reading.read_json(path, TargetError, "model config"))
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TargetError(f"{path}: not a usable model config: {exc}") from None


def _has_weights(folder: Path) -> bool:
    return any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))


def _tokenizer(folder: Path) -> PreTrainedTokenizerBase | None:
    if not any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json",
                                                     "tokenizer.model")):
        return None
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise TargetError(f"{folder}: tokenizer does not load: {exc}") from None


def default_mask_token_id(vocab_size: int, tokenizer: PreTrainedTokenizerBase | None
                          ) -> int:
    """The tokenizer's mask token, else the first embedding row past the tokenizer
    (a trained-never row, as the published Qwen3 drafters use), else the last row."""
    if tokenizer is not None:
        if getattr(tokenizer, "mask_token_id", None) is not None:
            return int(tokenizer.mask_token_id)
        if len(tokenizer) < vocab_size:
            return len(tokenizer)
    return vocab_size - 1


def target_text(source: str) -> str:
    """What building the target ``source`` does, for the progress display (no I/O
    beyond a directory listing)."""
    path = target_path(source)
    if source == STDLIB_TARGET:
        return ("loading the target (tiny-stdlib: the tiny shape pretrained on the standard "
                "library; built and cached on first use)")
    if path is None:
        return f"building the target ({source}, random weights)"
    if path.is_dir() and _has_weights(path):
        return f"loading the target ({path})"
    return f"building the target ({path}, random weights)"


def load_target(source: str, *, device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.float32, layer_ids: tuple[int, ...] | None = None,
                num_features: int = 5, mask_token_id: int | None = None, seed: int = 0,
                on_tick: TickFn | None = None) -> TargetModel:
    """A frozen target from a named shape, a config (random weights) or a weights folder."""
    device = torch.device(device)
    tokenizer = None
    path = target_path(source)
    if source == STDLIB_TARGET:
        from dflash import stdlib_target

        shape = TARGET_SHAPES["tiny"]
        path = stdlib_target.ensure(transformers_config(_qwen3_config(shape)), on_tick=on_tick)
        layer_ids = layer_ids or shape.layer_ids
    if path is None:
        shape = TARGET_SHAPES[source]
        model = _random_model(_qwen3_config(shape), device, dtype, seed)
        ids = layer_ids or shape.layer_ids
        mask = shape.mask_token_id
    else:
        folder = path if path.is_dir() else path.parent
        # The loaders open its files themselves; a config file named builds random weights.
        reading.check_folder(folder, TargetError, weights=path.is_dir())
        own = _own_config(path) if path.is_dir() and any(path.glob("*.safetensors")) else None
        if own is not None:
            model = qwen3.load_folder(path, own, device=device, dtype=dtype)
        elif path.is_dir() and _has_weights(path):
            from transformers import AutoModelForCausalLM
            try:
                loaded: Any = AutoModelForCausalLM.from_pretrained(
                    path, dtype=dtype, local_files_only=True)
                model = loaded.to(device)
            except (OSError, ValueError, RuntimeError) as exc:
                raise TargetError(f"{path}: model does not load: {exc}") from None
        else:
            model = _random_model(_config_only(path), device, dtype, seed)
        tokenizer = _tokenizer(folder)
        ids = layer_ids
        mask = default_mask_token_id(model.get_input_embeddings().weight.shape[0], tokenizer)
    if ids is None:
        try:
            ids = tuple(target_layer_ids_for(len(model.get_decoder().layers), num_features))
        except ValueError as exc:
            raise TargetError(str(exc)) from None
    return TargetModel(model, tuple(ids), mask if mask_token_id is None else mask_token_id,
                       tokenizer)


def rope_theta_of(config: Any) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        params = getattr(config, "rope_parameters", None) or {}
        theta = params.get("rope_theta", 10_000.0)
    return float(theta)


def drafter_config_for(target: TargetModel, *, num_layers: int, block_size: int, gamma: float,
                       mask_token_id: int | None = None) -> DrafterConfig:
    """A drafter whose attention/MLP shapes, RoPE and vocabulary match the target's."""
    c = target.config
    heads = int(c.num_attention_heads)
    head_dim = getattr(c, "head_dim", None) or target.hidden_size // heads
    return DrafterConfig(
        hidden_size=target.hidden_size, intermediate_size=int(c.intermediate_size),
        num_layers=num_layers, num_heads=heads,
        num_kv_heads=int(getattr(c, "num_key_value_heads", None) or heads),
        head_dim=int(head_dim), rope_theta=rope_theta_of(c),
        rms_eps=float(getattr(c, "rms_norm_eps", 1e-6)), block_size=block_size,
        mask_token_id=target.mask_token_id if mask_token_id is None else mask_token_id,
        target_layer_ids=target.layer_ids, num_target_layers=target.num_layers,
        vocab_size=target.vocab_size, gamma=gamma)
