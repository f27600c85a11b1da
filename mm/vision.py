"""Vision towers built from a config: images ``(B, N_img, 3, H, W)`` -> patch features ``(B, N_img, P, D_v)``.

    tower = build_vision_tower(VisionConfig(kind="open_clip", image_size=64, patch_size=8, width=64))
    feats = tower(pixel_values, image_mask)  # padded image slots come out as zeros
    tower.num_patches, tower.dim, tower.grid

Kinds: ``open_clip`` (any ``open_clip.list_models()`` architecture via ``arch``, or a custom tiny ViT
from the dims below; the patch tokens of the last block after ``ln_post``, class token dropped),
``hf_clip`` (transformers ``CLIPVisionModel``; ``last_hidden_state`` without the CLS token) and
``hf_siglip`` (transformers ``SiglipVisionModel``; no CLS token, pooling head disabled).
Towers start from random init; ``pretrained`` loads weights from a local path only (nothing is
downloaded). :func:`resolve_pretrained` reads what a pretrained source says about itself (its
architecture, input size and normalisation) into the config, so a saved model rebuilds the tower
without the source. open_clip and transformers are imported inside the builders, so ``import mm.vision``
stays light. Pixel values are expected already normalised for the tower (``image_mean`` / ``image_std``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from mm.errors import UserError

VISION_KINDS = ("open_clip", "hf_clip", "hf_siglip")
RESIZE_MODES = ("stretch", "pad", "crop")
DEFAULT_MEAN_STD = (0.5, 0.5, 0.5)
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# Bookkeeping keys of a transformers config dict that are not architecture.
_HF_META_KEYS = ("transformers_version", "architectures", "_name_or_path", "dtype", "torch_dtype", "auto_map")


@dataclass
class VisionConfig:
    """A vision tower: its family, its architecture and where its weights come from."""

    kind: str = "open_clip"
    """Tower family: "open_clip", "hf_clip" or "hf_siglip"."""
    arch: str | None = None
    """open_clip only: an architecture name from open_clip.list_models(); None = custom ViT from the dims."""
    image_size: int | None = 64
    """Input side in pixels. With ``arch``, None keeps the architecture's own size."""
    patch_size: int = 8
    """Patch side in pixels (custom dims only)."""
    width: int = 64
    """Transformer width D_v (custom dims only)."""
    layers: int = 2
    """Transformer blocks (custom dims only)."""
    heads: int = 4
    """Attention heads (custom dims only); width must divide by heads."""
    mlp_ratio: float = 4.0
    """MLP hidden size / width (custom dims only)."""
    arch_overrides: dict[str, Any] | None = None
    """Extra architecture fields applied last: open_clip ``CLIPVisionCfg`` fields (e.g. pos_embed_type,
    pool_type, ls_init_value) or transformers vision-config fields (e.g. hidden_act)."""
    pretrained: str | None = None
    """Local weights: a .safetensors/.pt/.bin state dict (open_clip: full CLIP or visual-only keys;
    hf_*: vision-model keys) or, for hf_*, a save_pretrained folder. None = random init."""
    resize: str = "stretch"
    """How NoteProcessor fits an image to the square input: "stretch" (aspect ignored), "pad" (letterbox:
    aspect kept, the borders filled with the mean colour) or "crop" (aspect kept, centre crop)."""
    image_mean: list[float] | None = None
    """Per-channel mean of the input normalisation; None = the pretrained source's own (open_clip arch
    or transformers tower), else 0.5."""
    image_std: list[float] | None = None
    """Per-channel std of the input normalisation; None = the pretrained source's own, else 0.5."""
    arch_config: dict[str, Any] | None = None
    """The resolved architecture of a pretrained tower, written by `resolve_pretrained` (open_clip:
    embed_dim, quick_gelu, vision_cfg; hf_*: the transformers vision config) so that a saved model
    rebuilds the tower without the source; leave unset."""

    def __post_init__(self) -> None:
        if self.kind not in VISION_KINDS:
            raise ValueError(f"unknown vision kind {self.kind!r}; known kinds: {', '.join(VISION_KINDS)}")
        if self.resize not in RESIZE_MODES:
            raise ValueError(f"vision.resize must be one of {RESIZE_MODES}, got {self.resize!r}")
        for name in ("image_mean", "image_std"):
            value = getattr(self, name)
            if value is not None:
                if len(value) != 3:
                    raise ValueError(f"vision.{name} needs 3 values (R, G, B), got {value!r}")
                setattr(self, name, [float(v) for v in value])
        if self.image_std is not None and min(self.image_std) <= 0:
            raise ValueError(f"vision.image_std must be > 0, got {self.image_std}")
        if self.arch_config is not None:
            return  # architecture already resolved from a pretrained source
        if self.arch is not None and self.kind != "open_clip":
            raise ValueError(f"arch={self.arch!r} is only for kind 'open_clip'; got kind {self.kind!r}")
        if self.arch is None:
            if self.image_size is None:
                raise ValueError("image_size must be set when no open_clip arch is named")
            if self.image_size % self.patch_size != 0:
                raise ValueError(
                    f"image_size {self.image_size} must be a multiple of patch_size {self.patch_size}"
                )
            if self.width % self.heads != 0:
                raise ValueError(f"width {self.width} must be divisible by heads {self.heads}")


def _load_state_dict(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"pretrained weights {p} not found; give a local file path or set pretrained: null")
    if p.suffix == ".safetensors":
        sd = load_file(str(p))
    else:
        sd = torch.load(str(p), map_location="cpu", weights_only=True)
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    return {k.removeprefix("module."): v for k, v in sd.items()}


def _strict_load(
    module: Any, sd: dict[str, Any], path: str, prefixes: tuple[str, ...], dropped: tuple[str, ...]
) -> None:
    """Load ``sd`` into ``module``: every module key must be present; extra keys are allowed only
    for the heads the tower dropped (``dropped`` key prefixes), so full checkpoints still load."""
    for prefix in prefixes:
        if any(k.startswith(prefix) for k in sd):
            sd = {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
            break
    sd = {k: v for k, v in sd.items() if not any(k == d or k.startswith(d + ".") for d in dropped)}
    try:
        module.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        first = " ".join(str(e).splitlines()[0:3])
        raise UserError(
            f"weights in {path} do not match the configured vision tower ({first}); check "
            "arch/image_size/patch_size/width/layers against the checkpoint (with an arch, "
            "image_size: null keeps its native size)"
        ) from e


class VisionTower(nn.Module):
    """Wraps a per-image patch encoder ``(M, 3, H, W) -> (M, P, D_v)`` for multi-image notes.

    Attributes: ``num_patches`` (P), ``dim`` (D_v), ``grid`` ((h, w), row-major patch order),
    ``image_size`` ((H, W)), ``encoder`` (the wrapped open_clip / transformers module).
    """

    def __init__(
        self,
        *,
        encoder: nn.Module,
        encode: Callable[[nn.Module, torch.Tensor], torch.Tensor],
        image_size: tuple[int, int],
        cfg: VisionConfig,
    ):
        super().__init__()
        self.encoder = encoder
        self._encode = encode
        self.image_size = image_size
        self.vision_config = cfg
        with torch.no_grad():
            was_training = encoder.training
            encoder.eval()
            probe = encode(encoder, torch.zeros(1, 3, *image_size))  # (1, P, D_v)
            encoder.train(was_training)
        self.num_patches, self.dim = int(probe.shape[1]), int(probe.shape[2])
        self.grid = _infer_grid(encoder, self.num_patches, image_size)

    def forward(self, pixel_values: torch.Tensor, image_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N_img, 3, H, W) [+ (B, N_img) bool mask] -> (B, N_img, P, D_v); padded slots are zeros."""
        if pixel_values.dim() != 5 or pixel_values.shape[2] != 3:
            raise ValueError(
                f"pixel_values must be (B, N_img, 3, H, W), got shape {tuple(pixel_values.shape)}"
            )
        B, N, _, H, W = pixel_values.shape
        if (H, W) != tuple(self.image_size):
            raise ValueError(
                f"this tower takes {self.image_size[0]}x{self.image_size[1]} images, got {H}x{W}; "
                "resize the images or set vision.image_size"
            )
        if image_mask is None:
            image_mask = torch.ones(B, N, dtype=torch.bool, device=pixel_values.device)
        if image_mask.shape != (B, N):
            raise ValueError(f"image_mask must be (B, N_img)=({B}, {N}), got {tuple(image_mask.shape)}")
        image_mask = image_mask.to(torch.bool)
        out = pixel_values.new_zeros(B, N, self.num_patches, self.dim)  # (B, N, P, D_v)
        if not bool(image_mask.any()):
            return out
        real = pixel_values[image_mask]  # (M, 3, H, W): padded slots are never encoded
        feats = self._encode(self.encoder, real)  # (M, P, D_v)
        return out.to(feats.dtype).index_put((image_mask,), feats)


def _infer_grid(encoder: Any, num_patches: int, image_size: tuple[int, int]) -> tuple[int, int]:
    grid = getattr(encoder, "grid_size", None)
    if grid is not None and grid[0] * grid[1] == num_patches:
        return (int(grid[0]), int(grid[1]))
    side = int(round(num_patches**0.5))
    if side * side == num_patches:
        return (side, side)
    raise UserError(f"cannot infer the patch grid of {num_patches} patches for {image_size} images")


def _import_open_clip() -> Any:
    # lazy: heavy and only open_clip towers need it; inside `try` so that transformers' import check of a
    # saved model's code does not demand open_clip for transformers towers
    try:
        import open_clip
    except ImportError as e:
        raise UserError(
            "this vision tower is an open_clip model and open_clip is not installed; "
            "pip install open_clip_torch"
        ) from e
    return open_clip


def _open_clip_arch(cfg: VisionConfig) -> dict[str, Any]:
    """The tower's architecture: {"embed_dim", "quick_gelu", "vision_cfg" (CLIPVisionCfg fields)}."""
    if cfg.arch_config is not None:
        return cfg.arch_config
    if cfg.arch is not None:
        model_cfg = _import_open_clip().get_model_config(cfg.arch)
        if model_cfg is None:
            known = ", ".join(_import_open_clip().list_models()[:12])
            raise UserError(
                f"unknown open_clip arch {cfg.arch!r}; see open_clip.list_models() (e.g. {known}, ...)"
            )
        vision_cfg = dict(model_cfg["vision_cfg"])
        embed_dim = int(model_cfg["embed_dim"])
        quick_gelu = bool(model_cfg.get("quick_gelu", False))
        if cfg.image_size is not None:
            vision_cfg["image_size"] = cfg.image_size
    else:
        vision_cfg = {
            "image_size": cfg.image_size,
            "patch_size": cfg.patch_size,
            "width": cfg.width,
            "layers": cfg.layers,
            "head_width": cfg.width // cfg.heads,
            "mlp_ratio": cfg.mlp_ratio,
        }
        embed_dim, quick_gelu = cfg.width, False
    vision_cfg.update(cfg.arch_overrides or {})
    if "timm_model_name" in vision_cfg:
        raise UserError(
            f"open_clip arch {cfg.arch!r} uses a timm backbone, which this toolkit does not wrap; "
            "pick a ViT or RN arch (e.g. ViT-B-32, RN50) or custom dims"
        )
    return {"embed_dim": embed_dim, "quick_gelu": quick_gelu, "vision_cfg": vision_cfg}


def _build_open_clip(cfg: VisionConfig):
    oc_model = _import_open_clip().model
    CLIPVisionCfg, _build_vision_tower = oc_model.CLIPVisionCfg, oc_model._build_vision_tower
    arch = _open_clip_arch(cfg)
    vision_cfg = arch["vision_cfg"]
    try:
        vision_cfg_obj = CLIPVisionCfg(**vision_cfg)
    except TypeError as e:
        valid = sorted(f.name for f in dataclasses.fields(CLIPVisionCfg))
        raise UserError(f"bad open_clip vision field ({e}); valid CLIPVisionCfg fields: {valid}") from e
    encoder = _build_vision_tower(arch["embed_dim"], vision_cfg_obj, quick_gelu=arch["quick_gelu"])
    _drop_open_clip_heads(encoder)
    if cfg.pretrained is not None:
        sd = _load_state_dict(cfg.pretrained)
        _strict_load(encoder, sd, cfg.pretrained, ("visual.",), _OPEN_CLIP_HEADS)
    size = vision_cfg.get("image_size", 224)
    size = (size, size) if isinstance(size, int) else tuple(size)
    return encoder, _encode_open_clip, size


_OPEN_CLIP_HEADS = ("proj", "attn_pool", "attn_pool_contrastive", "attnpool")


def _drop_open_clip_heads(encoder) -> None:
    """Remove the pooling/projection heads that patch tokens never use.

    Unused parameters would get no gradient, which DDP rejects; they also waste memory. Their keys
    in a full open_clip checkpoint are skipped on load (see ``_strict_load``).
    """
    for name in ("proj", "attn_pool", "attn_pool_contrastive"):  # VisionTransformer
        if hasattr(encoder, name):
            setattr(encoder, name, None)
    if hasattr(encoder, "attnpool"):  # ModifiedResNet
        encoder.attnpool = nn.Identity()


def _encode_open_clip(encoder, x):
    # Last block's output, final norm applied, prefix (class) tokens removed.
    out = encoder.forward_intermediates(x, indices=1, normalize_intermediates=True, intermediates_only=True)
    feat = out["image_intermediates"][-1]  # (M, D_v, h, w)
    return feat.flatten(2).transpose(1, 2)  # (M, P, D_v)


def _build_hf(cfg: VisionConfig):
    # function-level: transformers loads a model family's code on first use; load only the one asked for
    if cfg.kind == "hf_clip":
        from transformers import CLIPVisionConfig as Config
        from transformers import CLIPVisionModel as Model

        extra: dict[str, Any] = {}
    else:
        from transformers import SiglipVisionConfig as Config
        from transformers import SiglipVisionModel as Model

        extra = {"vision_use_head": False}
    if cfg.pretrained is not None and Path(cfg.pretrained).is_dir():
        encoder = Model.from_pretrained(cfg.pretrained, local_files_only=True)
        _drop_hf_heads(encoder, cfg.kind)
    elif cfg.arch_config is not None:  # a saved model: the architecture resolved from its source
        arch = {k: v for k, v in cfg.arch_config.items() if k not in _HF_META_KEYS}
        encoder = Model(Config(**arch))
        _drop_hf_heads(encoder, cfg.kind)
        if cfg.pretrained is not None:
            _strict_load(encoder, _load_state_dict(cfg.pretrained), cfg.pretrained, (), _hf_heads(cfg.kind))
    else:
        hf_cfg = Config(
            hidden_size=cfg.width,
            intermediate_size=int(cfg.width * cfg.mlp_ratio),
            num_hidden_layers=cfg.layers,
            num_attention_heads=cfg.heads,
            image_size=cfg.image_size,
            patch_size=cfg.patch_size,
            **extra,
        )
        for key, value in (cfg.arch_overrides or {}).items():
            if not hasattr(hf_cfg, key):
                raise UserError(f"arch_overrides key {key!r} is not a field of {Config.__name__}")
            setattr(hf_cfg, key, value)
        encoder = Model(hf_cfg)
        _drop_hf_heads(encoder, cfg.kind)
        if cfg.pretrained is not None:
            _strict_load(encoder, _load_state_dict(cfg.pretrained), cfg.pretrained, (), _hf_heads(cfg.kind))
    size = encoder.config.image_size
    drop_cls = cfg.kind == "hf_clip"
    return encoder, (_encode_hf_clip if drop_cls else _encode_hf_siglip), (size, size)


def _hf_heads(kind: str) -> tuple[str, ...]:
    """State-dict key prefixes of the heads `_drop_hf_heads` removes (skipped when loading)."""
    heads = tuple(f"{p}{h}" for p in ("", "vision_model.") for h in ("post_layernorm", "head"))
    return heads if kind == "hf_clip" else tuple(h for h in heads if h.endswith("head"))


def _drop_hf_heads(encoder, kind: str) -> None:
    """Drop what only feeds the pooled output (unused by patch tokens; DDP rejects gradient-less params)."""
    vm = encoder.vision_model if hasattr(encoder, "vision_model") else encoder  # layouts differ by version
    if kind == "hf_clip":
        vm.post_layernorm = nn.Identity()  # CLIP applies it to the pooled CLS token only
    elif getattr(vm, "use_head", False):
        vm.use_head = False
        del vm.head


def _encode_hf_clip(encoder, x):
    return encoder(pixel_values=x).last_hidden_state[:, 1:]  # (M, P, D_v), CLS dropped


def _encode_hf_siglip(encoder, x):
    return encoder(pixel_values=x).last_hidden_state  # (M, P, D_v), SigLIP has no CLS


def build_vision_tower(cfg: VisionConfig) -> VisionTower:
    """Build the tower described by ``cfg``: an ``nn.Module`` with ``num_patches``, ``dim``, ``grid``."""
    if cfg.kind == "open_clip":
        encoder, encode, size = _build_open_clip(cfg)
    else:
        encoder, encode, size = _build_hf(cfg)
    return VisionTower(encoder=encoder, encode=encode, image_size=size, cfg=cfg)


# --- what a pretrained source says about itself ---


def resolve_pretrained(cfg: VisionConfig) -> VisionConfig:
    """``cfg`` with the pretrained source's architecture, input size and normalisation filled in.

    open_clip with ``arch``: the architecture's fields (``arch_config``), its ``preprocess_cfg``
    mean/std (open_clip's OpenAI defaults when it has none). hf_* folder: its transformers config
    (``arch_config``, ``image_size``) and the mean/std of its ``preprocessor_config.json`` (the family's
    defaults when absent); hf_* state dict: the family's mean/std. Explicit ``image_mean`` /
    ``image_std`` win. No ``pretrained``, an already resolved config or a custom-dims open_clip tower:
    returned unchanged (0.5 normalisation). Reads configs only, never weights.
    """
    if cfg.pretrained is None or cfg.arch_config is not None:
        return cfg
    updates: dict[str, Any] = {}
    if cfg.kind == "open_clip":
        if cfg.arch is None:
            return cfg
        arch = _open_clip_arch(cfg)
        size = arch["vision_cfg"].get("image_size", 224)
        pre = _import_open_clip().get_model_config(cfg.arch).get("preprocess_cfg", {})
        mean, std = pre.get("mean", OPENAI_CLIP_MEAN), pre.get("std", OPENAI_CLIP_STD)
        updates = {"arch_config": arch, "image_size": size if isinstance(size, int) else None}
    else:
        mean, std = (OPENAI_CLIP_MEAN, OPENAI_CLIP_STD) if cfg.kind == "hf_clip" else (DEFAULT_MEAN_STD,) * 2
        folder = Path(cfg.pretrained)
        if folder.is_dir():
            arch = _hf_folder_config(cfg.kind, folder)
            pre_file = folder / "preprocessor_config.json"
            if pre_file.is_file():
                pre = json.loads(pre_file.read_text())
                mean, std = pre.get("image_mean", mean), pre.get("image_std", std)
            updates = {"arch_config": arch, "image_size": int(arch["image_size"])}
    updates["image_mean"] = cfg.image_mean if cfg.image_mean is not None else list(mean)
    updates["image_std"] = cfg.image_std if cfg.image_std is not None else list(std)
    return dataclasses.replace(cfg, **updates)


def _hf_folder_config(kind: str, folder: Path) -> dict[str, Any]:
    """The transformers vision config of a CLIP/SigLIP (vision or full) model folder, as a dict."""
    if kind == "hf_clip":
        from transformers import CLIPVisionConfig as Config
    else:
        from transformers import SiglipVisionConfig as Config
    if not (folder / "config.json").is_file():
        raise UserError(f"vision.pretrained={folder} has no config.json; give a save_pretrained folder")
    config = Config.from_pretrained(str(folder), local_files_only=True)
    return {k: v for k, v in config.to_dict().items() if k not in _HF_META_KEYS}


def normalisation(cfg: VisionConfig) -> tuple[list[float], list[float]]:
    """(mean, std) the processor applies to [0, 1] pixels for this tower (0.5 / 0.5 when unset)."""
    mean = cfg.image_mean if cfg.image_mean is not None else list(DEFAULT_MEAN_STD)
    std = cfg.image_std if cfg.image_std is not None else list(DEFAULT_MEAN_STD)
    return list(mean), list(std)
