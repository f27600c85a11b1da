"""Tiny random instances of real transformers VLM families, saved with a working processor.

Each builder writes a folder that `AutoModelForImageTextToText.from_pretrained` and
`AutoProcessor.from_pretrained` load offline, as a hub checkpoint of that family would be:

    folder = build_family("qwen2_vl", tmp_path / "qwen2_vl")
    adapter = load_adapter(folder)

The models have 2-layer vision towers and 2-layer LMs with hidden size 32; the tokenizer is the shipped
byte-level BPE (``assets/tokenizer``) plus the family's special tokens, and the chat templates follow
each family's hub template (image placeholders in the family's place and format).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ASSET_TOKENIZER = Path(__file__).resolve().parents[2] / "assets" / "tokenizer" / "tokenizer.json"
HIDDEN = 32

LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}"
    "{% endif %}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' ' }}{% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
QWEN2_VL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'text' %}{{ content['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}<start_of_image>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
INTERNVL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<IMG_CONTEXT>\n{% elif content['type'] == 'text' %}"
    "{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def tiny_tokenizer(
    *,
    specials: list[str],
    bos: str,
    eos: str,
    pad: str,
    chat_template: str,
    named: dict[str, str] | None = None,
) -> Any:
    """The shipped byte-level BPE with the family's special tokens added (ids after the base vocabulary);
    ``named``: special tokens the processor reads by name (``tokenizer.boi_token``), saved with it."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(ASSET_TOKENIZER)),
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        unk_token="<unk>",
        **({"extra_special_tokens": named} if named else {}),
    )
    new = [t for t in specials if t not in tok.get_vocab()]
    tok.add_special_tokens({"additional_special_tokens": new})
    tok.chat_template = chat_template
    return tok


def _vocab(tok: Any) -> int:
    return (len(tok) + 15) // 16 * 16


def _text_config(tok: Any, model_type: str = "llama", **extra: Any) -> dict[str, Any]:
    return {
        "model_type": model_type,
        "vocab_size": _vocab(tok),
        "hidden_size": HIDDEN,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        **extra,
    }


CLIP_TOWER = {
    "model_type": "clip_vision_model", "hidden_size": HIDDEN, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 2, "image_size": 16, "patch_size": 4, "projection_dim": HIDDEN,
}  # fmt: skip
"""The tiny CLIP tower of the LLaVA families (16 px images, 4 px patches)."""
LLAVA_PROCESSOR = {
    "patch_size": 4, "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1,
    "chat_template": LLAVA_TEMPLATE,
}  # fmt: skip
"""Processor settings of the LLaVA families that match :data:`CLIP_TOWER`."""


def _llava_tokenizer() -> Any:
    return tiny_tokenizer(
        specials=["<image>", "<s>", "</s>"], bos="<s>", eos="</s>", pad="<pad>", chat_template=LLAVA_TEMPLATE
    )


def build_llava(seed: int = 0) -> tuple[Any, Any]:
    """LLaVA-1.5 layout: CLIP tower (16 px, 4 px patches) + MLP projector + Llama; 16 tokens per image."""
    from transformers import (
        CLIPImageProcessor,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tok = _llava_tokenizer()
    config = LlavaConfig(
        vision_config=CLIP_TOWER,
        text_config=_text_config(tok),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}, do_center_crop=True
    )
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tok, **LLAVA_PROCESSOR)
    return model, processor


def build_llava_next(seed: int = 0) -> tuple[Any, Any]:
    """LLaVA-NeXT (1.6) layout: the LLaVA tower and LM with anyres patches. An image is resized to the best of
    four grids (16 or 32 px a side) and cut into 16 px patches plus a 16 px base view, so its token count
    depends on its size (``image_sizes``)."""
    from transformers import (
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
    )

    tok = _llava_tokenizer()
    grids = [[16, 16], [16, 32], [32, 16], [32, 32]]
    config = LlavaNextConfig(
        vision_config=CLIP_TOWER,
        text_config=_text_config(tok),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        image_grid_pinpoints=grids,
    )
    torch.manual_seed(seed)
    model = LlavaNextForConditionalGeneration(config).eval()
    image_processor = LlavaNextImageProcessor(
        size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}, image_grid_pinpoints=grids
    )
    processor = LlavaNextProcessor(image_processor=image_processor, tokenizer=tok, **LLAVA_PROCESSOR)
    return model, processor


def _qwen_family(
    seed: int, classes: tuple[Any, Any, Any], text_type: str, vision: dict[str, Any], **text: Any
) -> tuple[Any, Any]:
    """The Qwen2-VL layout's tokenizer, tiny random model and processor: 4 px patches merged 2x2 (an H x W
    image -> H*W/64 tokens), M-RoPE Qwen2 LM; ``classes`` (config, model, processor), ``vision`` (the
    tower's config) and ``text`` (more LM config keys) are the version's."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    config_cls, model_cls, processor_cls = classes
    specials = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                "<|video_pad|>", "<|endoftext|>"]  # fmt: skip
    tok = tiny_tokenizer(
        specials=specials, bos="<|endoftext|>", eos="<|im_end|>", pad="<|endoftext|>",
        chat_template=QWEN2_VL_TEMPLATE,
    )  # fmt: skip
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}
    config = config_cls(
        text_config=_text_config(tok, text_type, rope_parameters=rope, **text),
        vision_config={
            "depth": 2,
            "num_heads": 2,
            "patch_size": 4,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            **vision,
        },  # fmt: skip
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    pixels = {"shortest_edge": 8 * 8, "longest_edge": 32 * 32}
    image_processor = Qwen2VLImageProcessor(size=pixels, patch_size=4, merge_size=2, temporal_patch_size=2)
    video_processor = Qwen2VLVideoProcessor(size=pixels, patch_size=4, merge_size=2, temporal_patch_size=2)
    processor = processor_cls(
        image_processor=image_processor, tokenizer=tok, video_processor=video_processor,
        chat_template=QWEN2_VL_TEMPLATE,
    )  # fmt: skip
    return model, processor


def build_qwen2_vl(seed: int = 0) -> tuple[Any, Any]:
    """Qwen2-VL (:func:`_qwen_family`)."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor

    classes = (Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor)
    return _qwen_family(
        seed, classes, "qwen2_vl_text", {"embed_dim": HIDDEN, "hidden_size": HIDDEN, "mlp_ratio": 2}
    )


def build_qwen2_5_vl(seed: int = 0) -> tuple[Any, Any]:
    """Qwen2.5-VL: Qwen2-VL's layout with a windowed-attention tower (windows of 2 x 2 merged patches; block
    0 windowed, block 1 full) and an RMSNorm / SwiGLU merger."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor

    classes = (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor)
    vision = {
        "hidden_size": HIDDEN,
        "intermediate_size": 64,
        "out_hidden_size": HIDDEN,
        "window_size": 16,
        "fullatt_block_indexes": [1],
    }  # fmt: skip  (window: 16 / 2 / 4 = 2 merged)
    return _qwen_family(seed, classes, "qwen2_5_vl_text", vision)


def build_qwen3_vl(seed: int = 0) -> tuple[Any, Any]:
    """Qwen3-VL: Qwen2-VL's layout with learned tower positions (an 8 x 8 grid, interpolated), DeepStack
    (tower block 0's merged features added to the LM's first layer) and interleaved M-RoPE on a Qwen3 LM."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor

    classes = (Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor)
    vision = {
        "hidden_size": HIDDEN,
        "intermediate_size": 64,
        "out_hidden_size": HIDDEN,
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [0],
    }  # fmt: skip
    return _qwen_family(seed, classes, "qwen3_vl_text", vision, head_dim=HIDDEN // 4)


def build_gemma3(seed: int = 0) -> tuple[Any, Any]:
    """Gemma 3 layout: SigLIP tower (16 px, 4 px patches) average-pooled to 4 tokens an image between
    ``<start_of_image>`` / ``<end_of_image>``, attended both ways (``token_type_ids``), and a Gemma 3 LM with
    sliding-window and global layers."""
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
    )

    named = {
        "boi_token": "<start_of_image>",
        "eoi_token": "<end_of_image>",
        "image_token": "<image_soft_token>",
    }
    tok = tiny_tokenizer(
        specials=["<bos>", "<start_of_turn>", "<end_of_turn>"], bos="<bos>", eos="<end_of_turn>", pad="<pad>",
        chat_template=GEMMA3_TEMPLATE, named=named,
    )  # fmt: skip
    config = Gemma3Config(
        text_config=_text_config(tok, "gemma3_text", head_dim=8, sliding_window=64, query_pre_attn_scalar=8),
        vision_config={
            "model_type": "siglip_vision_model",
            "hidden_size": HIDDEN,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 16,
            "patch_size": 4,
        },  # fmt: skip
        mm_tokens_per_image=4,
        boi_token_index=tok.boi_token_id,
        eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
        image_token_index=tok.image_token_id,
    )
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).eval()
    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessor(size={"height": 16, "width": 16}), tokenizer=tok,
        image_seq_length=4, chat_template=GEMMA3_TEMPLATE,
    )  # fmt: skip
    return model, processor


def build_internvl(seed: int = 0) -> tuple[Any, Any]:
    """InternVL (2.5 / 3 / 3.5 in transformers' layout): InternViT-like tower (16 px patches of 4 px),
    pixel shuffle 0.5 (4 tokens a patch) and a Qwen2 LM. An image is cut into up to 4 tiles of 16 px plus
    a thumbnail, by its aspect ratio, so its number of patches (``pixel_values`` rows) depends on its size."""
    from transformers import (
        GotOcr2ImageProcessor,
        InternVLConfig,
        InternVLForConditionalGeneration,
        InternVLProcessor,
        InternVLVideoProcessor,
    )

    named = {"start_image_token": "<img>", "end_image_token": "</img>", "video_token": "<video>",
             "context_image_token": "<IMG_CONTEXT>"}  # fmt: skip
    tok = tiny_tokenizer(
        specials=["<|im_start|>", "<|im_end|>", "<|endoftext|>"], bos="<|endoftext|>", eos="<|im_end|>",
        pad="<|endoftext|>", chat_template=INTERNVL_TEMPLATE, named=named,
    )  # fmt: skip
    config = InternVLConfig(
        vision_config={
            "hidden_size": HIDDEN,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "image_size": [16, 16],
            "patch_size": [4, 4],
        },  # fmt: skip
        text_config=_text_config(tok, "qwen2"),
        downsample_ratio=0.5,
        image_token_id=tok.context_image_token_id,
    )
    torch.manual_seed(seed)
    model = InternVLForConditionalGeneration(config).eval()
    size = {"height": 16, "width": 16}
    processor = InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(size=size, crop_to_patches=True, min_patches=1, max_patches=4),
        tokenizer=tok, video_processor=InternVLVideoProcessor(size=size), image_seq_length=4,
        chat_template=INTERNVL_TEMPLATE,
    )  # fmt: skip
    return model, processor


def _tiled_family(seed: int, config_cls: Any, model_cls: Any) -> tuple[Any, Any]:
    """The Idefics3 layout's tokenizer and tiny random model (``config_cls``, ``model_cls``: Idefics3's or
    SmolVLM's): SigLIP-like tower (16 px tiles, 8 px patches), pixel shuffle x2, Llama LM."""
    specials = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", "<|im_start|>"]
    specials += [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
    tok = tiny_tokenizer(
        specials=specials, bos="<|im_start|>", eos="<end_of_utterance>", pad="<pad>",
        chat_template=IDEFICS3_TEMPLATE,
    )  # fmt: skip
    config = config_cls(
        vision_config={
            "hidden_size": HIDDEN,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 16,
            "patch_size": 8,
        },
        text_config=_text_config(tok),
        scale_factor=2,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
    )
    torch.manual_seed(seed)
    return tok, model_cls(config).eval()


TILED_SIZES = {"size": {"longest_edge": 32}, "max_image_size": {"longest_edge": 16}}
"""Images split into up to 2 x 2 tiles of 16 px plus a global view (one token per tile)."""


def build_idefics3(seed: int = 0) -> tuple[Any, Any]:
    """Idefics3 layout (:func:`_tiled_family`), images split into tiles (:data:`TILED_SIZES`)."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
    )

    tok, model = _tiled_family(seed, Idefics3Config, Idefics3ForConditionalGeneration)
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessor(**TILED_SIZES, do_image_splitting=True), tokenizer=tok,
        image_seq_len=1, chat_template=IDEFICS3_TEMPLATE,
    )  # fmt: skip
    return model, processor


def build_smolvlm(seed: int = 0) -> tuple[Any, Any]:
    """SmolVLM: Idefics3's layout with SmolVLM's own classes and processor (with its video processor)."""
    from transformers import (
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
        SmolVLMVideoProcessor,
    )

    tok, model = _tiled_family(seed, SmolVLMConfig, SmolVLMForConditionalGeneration)
    processor = SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(**TILED_SIZES, do_image_splitting=True),
        video_processor=SmolVLMVideoProcessor(**TILED_SIZES), tokenizer=tok, image_seq_len=1,
        chat_template=IDEFICS3_TEMPLATE,
    )  # fmt: skip
    return model, processor


BUILDERS: dict[str, Callable[[int], tuple[Any, Any]]] = {
    "llava": build_llava,
    "llava_next": build_llava_next,
    "qwen2_vl": build_qwen2_vl,
    "qwen2_5_vl": build_qwen2_5_vl,
    "qwen3_vl": build_qwen3_vl,
    "gemma3": build_gemma3,
    "internvl": build_internvl,
    "idefics3": build_idefics3,
    "smolvlm": build_smolvlm,
}
"""Family name -> builder of a tiny random (model, processor)."""


def build_family(family: str, folder: Path, seed: int = 0) -> Path:
    """Build the tiny ``family`` model, save it with its processor into ``folder``; returns ``folder``."""
    if family not in BUILDERS:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(BUILDERS)}")
    model, processor = BUILDERS[family](seed)
    eos = processor.tokenizer.eos_token_id
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def random_image(width: int, height: int, seed: int = 0) -> Any:
    """A random RGB PIL image of the given size."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8), "RGB")
