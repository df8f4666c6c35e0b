#!/usr/bin/env python3
"""Create the tiny *trained* LightOnOCR fixture used by ocrctl's tests.

Run from the repository root (about 8-10 minutes on 2 busy CPU cores; training is
~2400 steps of batch 16, everything runs on one thread):

    /work/pyref/bin/python scripts/make_fixture.py [--out tests/fixtures/tiny-lightonocr]
                                                   [--steps 2400] [--seed 1234]

Needs torch, transformers 5.x (written against 5.17.0), pillow, numpy, safetensors,
tokenizers.  Deterministic on a given machine/software stack: fixed seeds, one thread,
fixed step count.  The output directory is deleted and recreated.

What it writes under ``--out`` (default ``tests/fixtures/tiny-lightonocr``, < 6 MB):

``checkpoint/``  a LightOnOCR checkpoint in the *hub* layout
    ``config.json``            hub flavour: ``model_type: mistral3``,
                               ``architectures: [LightOnOCRForConditionalGeneration]``,
                               qwen3 text_config / pixtral vision_config, ``rope_theta`` both
                               flat and in ``rope_parameters`` (key layout of
                               lightonai/LightOnOCR-2-1B's config.json), tiny sizes.
    ``model.safetensors``      bf16, hub names ``model.vision_encoder.*``,
                               ``model.vision_projection.*``, ``model.language_model.*``;
                               no ``lm_head.weight`` (tied to the embeddings).
    ``tokenizer.json``         byte-level BPE trained here (Qwen2 pre-tokenizer: NFC, Split
                               with Qwen's regex - single digits - then ByteLevel; ByteLevel
                               decoder) plus the Qwen special tokens as added special tokens
                               with small ids (320..326).
    ``tokenizer_config.json``  the real LightOnOCR chat template, special tokens and
                               ``added_tokens_decoder``; ``chat_template.jinja`` = same template.
    ``generation_config.json`` the hub's sampling defaults with the tiny tokenizer's ids.
    ``processor_config.json``  the hub's PixtralImageProcessor settings (longest_edge 1540,
                               patch 14, bicubic, CLIP mean/std, rescale 1/255).
``images/``      digit strings: ``wide_downscale.png`` 1800x96 (downscaled past 1540),
                 ``unaligned.png`` 250x71, ``aligned.png`` 224x56, ``portrait.png`` 170x340 (grayscale),
                 ``photo.jpg`` 300x84.
``golden/``      ``golden.safetensors`` + ``golden.json``, written by
                 ``scripts/check_fixture.py --write`` in a fresh process from the files
                 above, then verified by a second fresh ``scripts/check_fixture.py`` run.
``TRAINING.json`` seeds, steps, accuracies, what the test images read as.

The model (vision hidden 64 != text hidden 96, text head_dim 32 != 96/4, GQA 4:2,
config vocab 384 > 327 tokenizer entries) is trained in fp32 on synthetic images of 6-10
digits (Pillow's default font).  Images come in four layout families (a line filling one
row of 28x28 merged-token cells; a little blank space, 1-3 rows; portrait, up to 14 rows;
wide, up to 55 columns, sometimes downscaled past 1540 px); each digit is drawn so that
after preprocessing it sits (with +-2 px jitter) in one merged-token cell.  The input is
the real prompt (chat template, N expanded ``<|image_pad|>``, no instruction) and the
target ``digits<|im_end|>``.  Two training aids, neither of which changes the
architecture or the saved layout: the projector's linear_1/linear_2 start at 3x/10x the
default init scale, and an auxiliary loss makes each image feature, read through the
final norm and tied lm_head, predict the digit in its cell (or a space) - without them a
model this small does not start using the image within minutes.  The fp32 model and the
saved bf16 weights are both evaluated (accuracy per family, in TRAINING.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
import check_fixture as cf  # noqa: E402  (shared reference logic: config mapping, preprocessing, prompt)

# ----------------------------------------------------------------------------- sizes
TEXT = dict(
    hidden_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,  # deliberately != hidden_size / num_attention_heads (= 24)
    intermediate_size=192,
    rms_norm_eps=1e-6,
    rope_theta=1000000,
    max_position_embeddings=4096,
)
VISION = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    head_dim=16,
    intermediate_size=128,
    patch_size=14,
    image_size=1540,
    rope_theta=10000,
)
BPE_VOCAB = 320  # byte-level BPE size before the special tokens
VOCAB_ALIGN = 64  # config vocab_size = len(tokenizer) rounded up to this
MERGE = 2
ALIGN = VISION["patch_size"] * MERGE  # 28

QWEN_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The chat template of lightonai/LightOnOCR-2-1B (as copied by onnx-community).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}\n{% for message in messages %}\n"
    "{% if loop.first and message['role'] != 'system' %}\n<|im_start|>system<|im_end|>\n{% endif %}\n"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}\n"
    "{{ message['content'] }}<|im_end|>\n{% else %}\n{% for content in message['content'] %}\n"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}\n"
    "{% set image_count.value = image_count.value + 1 %}\n{% if add_vision_id %}\n"
    "Picture {{ image_count.value }}:\n{% endif -%}\n<|image_pad|>\n{%- elif 'text' in content %}\n"
    "{{ content['text'] }}\n{% endif %}\n{% endfor %}\n<|im_end|>\n{% endif %}\n{% endfor %}\n"
    "{% if add_generation_prompt %}\n<|im_start|>assistant\n{% endif %}"
)


# ----------------------------------------------------------------------------- tokenizer
def bpe_corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    sentences = [
        "The quick brown fox jumps over the lazy dog.",
        "Invoice number 4711, total amount 1,234.56 EUR, due date 2025-10-31.",
        "Please read the text in the image and return it as markdown.",
        "LightOnOCR converts scanned pages and receipts into clean text.",
        "Table: item | quantity | price\nTea | 2 | 3.50\nCoffee | 1 | 2.80",
        "# Heading\n\n- first bullet point\n- second bullet point\n",
        "system\nuser\nassistant\n",
        "Picture 1:\nWhat does the receipt say?\n",
        "Hello, world! It's a simple test; we'll see what the model reads.",
        "Page 3 of 12 -- Chapter two: the history of optical character recognition.",
        "Name: Jane Doe\nAddress: 221B Baker Street, London\nPhone: +44 20 7946 0958",
        "def main():\n    return 0\n",
    ]
    corpus = []
    for _ in range(40):
        corpus.extend(sentences)
        corpus.append(" ".join("".join(rng.choice("0123456789") for _ in range(rng.randint(3, 10)))
                               for _ in range(rng.randint(2, 6))))
    return corpus


def build_tokenizer(seed: int):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(bpe_corpus(seed), trainer=trainer)
    tok.add_special_tokens([
        AddedToken(t, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
        for t in cf.SPECIAL_TOKENS
    ])
    for d in "0123456789":  # digits must be single tokens
        assert tok.encode(d * 5).tokens == [d] * 5
    return tok


def tokenizer_config(sp: dict[str, int]) -> dict:
    return {
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(sp[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                         "single_word": False, "special": True}
            for t in cf.SPECIAL_TOKENS
        },
        "backend": "tokenizers",
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "image_break_token": "<|vision_pad|>",
        "image_end_token": "<|vision_end|>",
        "image_token": "<|image_pad|>",
        "is_local": False,
        "max_length": None,
        "model_max_length": 131072,
        "model_specific_special_tokens": {
            "image_break_token": "<|vision_pad|>",
            "image_end_token": "<|vision_end|>",
            "image_token": "<|image_pad|>",
        },
        "pad_to_multiple_of": None,
        "pad_token": "<|endoftext|>",
        "pad_token_type_id": 0,
        "padding_side": "right",
        "processor_class": "PixtralProcessor",
        "split_special_tokens": False,
        "tokenizer_class": "TokenizersBackend",
        "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
    }


# ----------------------------------------------------------------------------- configs
def hub_config(sp: dict[str, int], vocab_size: int, transformers_version: str) -> dict:
    """config.json in the hub flavour, key for key like lightonai/LightOnOCR-2-1B."""
    T, V = TEXT, VISION
    return {
        "architectures": ["LightOnOCRForConditionalGeneration"],
        "dtype": "bfloat16",
        "eos_token_id": sp["<|im_end|>"],
        "image_token_id": sp["<|image_pad|>"],
        "model_type": "mistral3",
        "multimodal_projector_bias": False,
        "pad_token_id": sp["<|endoftext|>"],
        "projector_hidden_act": "gelu",
        "spatial_merge_size": MERGE,
        "text_config": {
            "architectures": ["Qwen3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0,
            "dtype": "bfloat16",
            "head_dim": T["head_dim"],
            "hidden_act": "silu",
            "hidden_size": T["hidden_size"],
            "initializer_range": 0.02,
            "intermediate_size": T["intermediate_size"],
            "layer_types": ["full_attention"] * T["num_hidden_layers"],
            "max_position_embeddings": T["max_position_embeddings"],
            "max_window_layers": T["num_hidden_layers"],
            "model_type": "qwen3",
            "num_attention_heads": T["num_attention_heads"],
            "num_hidden_layers": T["num_hidden_layers"],
            "num_key_value_heads": T["num_key_value_heads"],
            "rms_norm_eps": T["rms_norm_eps"],
            "rope_parameters": {"rope_theta": T["rope_theta"], "rope_type": "default"},
            "rope_theta": T["rope_theta"],
            "sliding_window": None,
            "use_cache": True,
            "use_sliding_window": False,
            "tie_word_embeddings": True,
            "vocab_size": vocab_size,
            "use_qk_norm": True,
        },
        "transformers_version": transformers_version,
        "use_cache": False,
        "vision_config": {
            "attention_dropout": 0,
            "dtype": "bfloat16",
            "head_dim": V["head_dim"],
            "hidden_act": "silu",
            "hidden_size": V["hidden_size"],
            "image_size": V["image_size"],
            "initializer_range": 0.02,
            "intermediate_size": V["intermediate_size"],
            "model_type": "pixtral",
            "num_attention_heads": V["num_attention_heads"],
            "num_channels": 3,
            "num_hidden_layers": V["num_hidden_layers"],
            "patch_size": V["patch_size"],
            "rope_parameters": {"rope_theta": V["rope_theta"], "rope_type": "default"},
            "rope_theta": V["rope_theta"],
        },
        "vision_feature_layer": -1,
    }


def generation_config(sp: dict[str, int], transformers_version: str) -> dict:
    return {
        "bos_token_id": sp["<|endoftext|>"],
        "do_sample": True,
        "eos_token_id": [sp["<|im_end|>"], sp["<|endoftext|>"]],
        "pad_token_id": sp["<|endoftext|>"],
        "temperature": 0.2,
        "top_k": 0,
        "top_p": 0.9,
        "transformers_version": transformers_version,
        "trust_remote_code": False,
    }


def processor_config() -> dict:
    return {
        "image_break_token": "<|vision_pad|>",
        "image_end_token": "<|vision_end|>",
        "image_processor": {
            "data_format": "channels_first",
            "default_to_square": True,
            "do_convert_rgb": True,
            "do_normalize": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_processor_type": "PixtralImageProcessorFast",
            "image_std": [0.26862954, 0.26130258, 0.27577711],
            "patch_size": VISION["patch_size"],
            "resample": 3,
            "rescale_factor": 0.00392156862745098,
            "size": {"longest_edge": VISION["image_size"]},
        },
        "image_token": "<|image_pad|>",
        "patch_size": VISION["patch_size"],
        "processor_class": "PixtralProcessor",
        "spatial_merge_size": MERGE,
    }


def write_json(path: Path, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


# ----------------------------------------------------------------------------- images
_FONTS: dict[int, ImageFont.FreeTypeFont] = {}


def font(px: int):
    if px not in _FONTS:
        _FONTS[px] = ImageFont.load_default(size=px)  # Pillow's embedded FreeType font
    return _FONTS[px]


def render_line(w0: int, h0: int, digits: str, c0: int, r0: int, glyph_px: float = 22.0,
                jitter=(0.0, 0.0), ink: int = 0, bg: int = 255):
    """Draw ``digits`` on a w0 x h0 canvas so that, *after* the model's preprocessing
    (resize to the 28-aligned size), digit i sits centred in merged-token cell
    (row r0, column c0 + i) of the 28 x 28 grid.  Returns (image, per-token labels)
    where labels[r, c] is the digit in that cell or -1 (blank)."""
    H, W = cf.target_hw(h0, w0)
    rows, cols = H // ALIGN, W // ALIGN
    assert 0 <= r0 < rows and 0 <= c0 and c0 + len(digits) <= cols, (w0, h0, H, W, c0, r0, digits)
    sx, sy = W / w0, H / h0
    img = Image.new("RGB", (w0, h0), (bg, bg, bg))
    draw = ImageDraw.Draw(img)
    f = font(max(8, int(round(glyph_px / sy))))
    labels = np.full((rows, cols), -1, dtype=np.int64)
    for i, d in enumerate(digits):
        cx = (ALIGN * (c0 + i) + ALIGN / 2 + jitter[0]) / sx
        cy = (ALIGN * r0 + ALIGN / 2 + jitter[1]) / sy
        draw.text((cx, cy), d, fill=(ink, ink, ink), font=f, anchor="mm")
        labels[r0, c0 + i] = int(d)
    return img, labels


# Layout families (in merged-token units after preprocessing):
#   exact: the line fills a single row; tight: a little blank space around it, 1-3 rows;
#   tall: 4-14 rows (portrait pages); wide: up to 55 columns (1540 px), sometimes drawn
#   larger than 1540 px so that the preprocessing downscales it.
KINDS = ("exact", "tight", "tall", "wide")
KIND_WEIGHTS = (1, 3, 1, 1)


def sample_layout(rng: random.Random, kind: str) -> dict:
    n = rng.randint(6, 10)
    if kind == "exact":
        cols, rows = n, 1
    elif kind == "tight":
        cols, rows = n + rng.randint(0, 4), rng.randint(1, 3)
    elif kind == "tall":
        cols, rows = n + rng.randint(0, 3), rng.randint(4, 14)
    else:
        cols, rows = rng.randint(n + 4, 55), rng.randint(1, 3)
    # canvas size before preprocessing: the same grid, stretched by up to 15-20 %
    sx = 1.0 if rng.random() < 0.4 else rng.uniform(1.0, 1.15)
    sy = 1.0 if rng.random() < 0.4 else rng.uniform(1.0, 1.2)
    w0 = max(ALIGN * (cols - 1) + 1, int(ALIGN * cols / sx))
    h0 = max(ALIGN * (rows - 1) + 1, int(ALIGN * rows / sy))
    if kind == "wide" and cols == 55 and rng.random() < 0.5:  # downscaled past 1540
        f = rng.uniform(1.05, 1.25)
        w0, h0 = int(1540 * f), int(h0 * f)
    H, W = cf.target_hw(h0, w0)
    rows, cols = H // ALIGN, W // ALIGN
    return dict(kind=kind, n=n, w0=w0, h0=h0, rows=rows, cols=cols)


def sample_image(rng: random.Random, lay: dict):
    n = lay["n"]
    digits = "".join(rng.choice("0123456789") for _ in range(n))
    c0 = rng.randint(0, lay["cols"] - n)
    r0 = rng.randint(0, lay["rows"] - 1)
    img, labels = render_line(lay["w0"], lay["h0"], digits, c0, r0, glyph_px=rng.uniform(20, 24),
                              jitter=(rng.uniform(-2, 2), rng.uniform(-2, 2)),
                              ink=rng.randint(0, 60), bg=rng.randint(225, 255))
    return img, digits, labels


# Test images: (file, canvas w, h, digits, first column, row) in merged-token cells
TEST_IMAGES = [
    ("wide_downscale.png", 1800, 96, "4071938265", 20, 1),  # r>1: 82x1540 -> 84x1540 (3x55)
    ("unaligned.png", 250, 71, "83920571", 1, 1),  # -> 84x252 (3x9)
    ("aligned.png", 224, 56, "5930284", 1, 0),  # already 28-aligned (2x8)
    ("portrait.png", 170, 340, "618274", 0, 5),  # -> 364x196 (13x7); saved as 8-bit grayscale
    ("photo.jpg", 300, 84, "27364819", 2, 2),  # JPEG, -> 84x308 (3x11)
]


def write_test_images(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, w, h, digits, c0, r0 in TEST_IMAGES:
        img, _ = render_line(w, h, digits, c0, r0, glyph_px=22.0, ink=20, bg=250)
        if name.endswith(".jpg"):
            img.save(out / name, format="JPEG", quality=90, subsampling=0, optimize=False)
        elif name == "portrait.png":  # exercises convert('RGB'); lossless since R == G == B
            gray = img.convert("L")
            assert np.array_equal(np.asarray(gray.convert("RGB")), np.asarray(img))
            gray.save(out / name, format="PNG", optimize=True)
        else:
            img.save(out / name, format="PNG", optimize=True)


# ----------------------------------------------------------------------------- training
class PromptBuilder:
    def __init__(self, ckpt: Path, tok):
        self.tok = tok
        text = cf.render_chat_prompt(ckpt)
        pre, post = text.split("<|image_pad|>")
        self.pre = tok.encode(pre, add_special_tokens=False).ids
        self.post = tok.encode(post, add_special_tokens=False).ids
        self.img = tok.token_to_id("<|image_pad|>")
        self.im_end = tok.token_to_id("<|im_end|>")
        self.eos = [self.im_end, tok.token_to_id("<|endoftext|>")]
        self.digit_ids = [tok.token_to_id(str(d)) for d in range(10)]
        self.blank_id = tok.encode(" ", add_special_tokens=False).ids[0]
        assert self.ids(3) == cf.build_prompt(ckpt, tok, 3)[1]

    def ids(self, n: int) -> list[int]:
        return self.pre + [self.img] * n + self.post

    def target(self, digits: str) -> list[int]:
        return self.tok.encode(digits, add_special_tokens=False).ids + [self.im_end]


def vision_features_batched(model, pvs: torch.Tensor) -> torch.Tensor:
    """Vision encoder + projector for a batch of same-size images in one pass (no
    block-diagonal mask over the concatenation).  Training-only shortcut; checked
    against the official per-image path before training starts."""
    ve = model.model.vision_encoder
    B, _, H, W = pvs.shape
    x = ve.patch_conv(pvs)
    h, w = x.shape[-2:]
    x = ve.ln_pre(x.flatten(2).transpose(1, 2))
    hh, ww = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    pos = ve.patch_positional_embedding(x, torch.stack([hh.flatten(), ww.flatten()], -1))
    x = ve.transformer(x, attention_mask=None, position_embeddings=pos).last_hidden_state
    return model.model.vision_projection(x.reshape(B * h * w, -1), [(H, W)] * B)


def batch_loss(model, pb: PromptBuilder, pvs, digit_strs, labels, aux_weight: float, lm: bool):
    """LM loss on ``digits<|im_end|>`` after the real prompt, plus an auxiliary loss that
    makes each image feature, read through the tied lm_head, predict the digit in its
    cell (or a space when blank) - it gets the vision tower going quickly."""
    B, _, H, W = pvs.shape
    feats = vision_features_batched(model, pvs)
    lab = torch.from_numpy(np.concatenate([l.reshape(-1) for l in labels]))
    table = torch.tensor(pb.digit_ids + [pb.blank_id])
    aux_logits = model.lm_head(model.model.language_model.norm(feats))
    aux = torch.nn.functional.cross_entropy(aux_logits, table[torch.where(lab < 0, 10, lab)])
    if not lm:
        return aux, aux
    prompt = pb.ids((H // ALIGN) * (W // ALIGN))
    seqs = [prompt + pb.target(d) for d in digit_strs]
    ids = torch.tensor(seqs, dtype=torch.long)
    targets = ids.clone()
    targets[:, : len(prompt)] = -100
    embeds = model.model.get_input_embeddings()(ids)
    mask = (ids == pb.img).unsqueeze(-1).expand_as(embeds)
    embeds = embeds.masked_scatter(mask, feats.to(embeds.dtype))
    loss = model(inputs_embeds=embeds, labels=targets, use_cache=False).loss
    return loss + aux_weight * aux, aux


def train(model, pb: PromptBuilder, proc_cfg: dict, steps: int, batch: int, seed: int, log=print):
    rng = random.Random(seed)
    # sanity: the batched training shortcut equals the official vision path
    with torch.no_grad():
        pv = torch.randn(2, 3, 56, 84, generator=torch.Generator().manual_seed(seed))
        a = vision_features_batched(model, pv)
        b = torch.cat([cf.image_features(model, pv[i: i + 1]) for i in range(2)])
        assert torch.allclose(a, b, atol=1e-5), float((a - b).abs().max())
        # start the projector at a larger scale than the default 0.02-std init, so that
        # image features are not drowned in the decoder's residual stream
        model.model.vision_projection.linear_1.weight.mul_(3.0)
        model.model.vision_projection.linear_2.weight.mul_(10.0)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.98), eps=1e-8)
    warm, aux_only = 30, 150

    def lr_at(step):
        return min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / steps))))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    t0 = time.time()
    ema = None
    for step in range(steps):
        lay = sample_layout(rng, rng.choices(KINDS, KIND_WEIGHTS)[0])
        imgs, digs, labs = zip(*(sample_image(rng, lay) for _ in range(batch)))
        pvs = torch.from_numpy(np.concatenate([cf.preprocess_explicit(im, proc_cfg) for im in imgs]))
        loss, aux = batch_loss(model, pb, pvs, digs, labs, aux_weight=0.5, lm=step >= aux_only)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        lv = float(loss.detach())
        if step >= aux_only:
            ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        if step % 100 == 0 or step == steps - 1:
            log(f"  step {step:4d}  loss {lv:.4f}  aux {float(aux.detach()):.4f}  ema {ema if ema is not None else float('nan'):.4f}  "
                f"lr {sched.get_last_lr()[0]:.2e}  {time.time() - t0:.0f}s")
    model.eval()
    return ema


@torch.no_grad()
def read_digits(model, pb: PromptBuilder, img: Image.Image, proc_cfg: dict, max_new: int = 12) -> str:
    pv = torch.from_numpy(cf.preprocess_explicit(img, proc_cfg))
    n_img = (pv.shape[-2] // ALIGN) * (pv.shape[-1] // ALIGN)
    _, ids, _ = cf.greedy(model, pb.ids(n_img), pv, steps=max_new, topk=1)
    return cf.decode_until_eos(pb.tok, ids, pb.eos)


def evaluate(model, pb, proc_cfg, per_kind: int, seed: int) -> dict:
    rng = random.Random(seed)
    res = {}
    tot_ex = tot_ok = tot_d = tot_n = 0
    for kind in KINDS:
        exact = ok = nd = 0
        for _ in range(per_kind):
            img, truth, _ = sample_image(rng, sample_layout(rng, kind))
            pred = read_digits(model, pb, img, proc_cfg)
            exact += pred == truth
            ok += sum(a == b for a, b in zip(pred, truth))
            nd += len(truth)
        res[kind] = {"exact_match": exact / per_kind, "digit_accuracy": ok / nd}
        tot_ex += exact
        tot_ok += ok
        tot_d += nd
        tot_n += per_kind
    res["all"] = {"samples": tot_n, "exact_match": tot_ex / tot_n, "digit_accuracy": tot_ok / tot_d}
    return res


# ----------------------------------------------------------------------------- weights
HUB_PREFIXES = ("model.vision_encoder.", "model.vision_projection.", "model.language_model.")


def save_weights(model, path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import save_file

    sd = model.state_dict()
    out = {}
    for k, v in sd.items():
        if k == "lm_head.weight":
            continue
        if not k.startswith(HUB_PREFIXES):
            raise RuntimeError(f"unexpected tensor name {k}")
        out[k] = v.detach().to(torch.bfloat16).contiguous()
    save_file(out, str(path), metadata={"format": "pt"})
    return out


def verify_native_save(model_bf16_as_fp32, saved_names: set[str], tmp: Path, log=print) -> dict:
    """What does transformers itself save, and does its own reload give identical outputs?"""
    from safetensors import safe_open
    from transformers import LightOnOcrForConditionalGeneration

    m16 = LightOnOcrForConditionalGeneration(model_bf16_as_fp32.config)
    m16.load_state_dict(model_bf16_as_fp32.state_dict())
    m16.to(torch.bfloat16)
    m16.save_pretrained(tmp)
    with safe_open(str(tmp / "model.safetensors"), "pt") as f:
        native = set(f.keys())
        dtypes = {f.get_slice(k).get_dtype() for k in native}
    native_cfg = cf.read_json(tmp / "config.json")
    reloaded = LightOnOcrForConditionalGeneration.from_pretrained(
        tmp, dtype=torch.float32, attn_implementation=cf.ATTN_IMPLEMENTATION)
    reloaded.eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 300, (1, 7), generator=g)
    with torch.no_grad():
        a = model_bf16_as_fp32(input_ids=ids).logits
        b = reloaded(input_ids=ids).logits
    info = {
        "native_names_equal_hub_names": native == saved_names,
        "native_has_lm_head": "lm_head.weight" in native,
        "native_dtypes": sorted(dtypes),
        "native_config_model_type": native_cfg.get("model_type"),
        "native_config_architectures": native_cfg.get("architectures"),
        "native_vision_rope_parameters": native_cfg["vision_config"].get("rope_parameters"),
        "native_reload_max_abs_logit_diff": float((a - b).abs().max()),
    }
    log(f"  transformers save_pretrained: {info}")
    return info


# ----------------------------------------------------------------------------- main
def dir_listing(root: Path) -> list[tuple[str, int]]:
    return [(str(p.relative_to(root)), p.stat().st_size) for p in sorted(root.rglob("*")) if p.is_file()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=cf.DEFAULT_FIXTURE, help="fixture directory to (re)create")
    ap.add_argument("--steps", type=int, default=2400, help="training steps (batch 16)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--eval-per-kind", type=int, default=50, help="evaluation samples per layout family")
    ap.add_argument("--no-goldens", action="store_true", help="skip golden computation and check")
    args = ap.parse_args(argv)

    import transformers

    t_start = time.time()
    out = args.out.resolve()
    ckpt = out / "checkpoint"
    if out.exists():
        shutil.rmtree(out)
    ckpt.mkdir(parents=True)
    random.seed(args.seed)
    np.random.seed(args.seed)
    cf.set_determinism()
    tv = transformers.__version__

    print("[1/6] tokenizer")
    tok = build_tokenizer(args.seed)
    tok.save(str(ckpt / "tokenizer.json"))
    sp = cf.special_token_ids(tok)
    n_tok = tok.get_vocab_size(with_added_tokens=True)
    vocab_size = ((n_tok + VOCAB_ALIGN - 1) // VOCAB_ALIGN) * VOCAB_ALIGN
    print(f"  {n_tok} tokens (BPE {n_tok - len(sp)} + {len(sp)} special), config vocab_size {vocab_size}; {sp}")

    print("[2/6] configs")
    write_json(ckpt / "tokenizer_config.json", tokenizer_config(sp))
    (ckpt / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    write_json(ckpt / "generation_config.json", generation_config(sp, tv))
    write_json(ckpt / "processor_config.json", processor_config())
    hub_cfg = hub_config(sp, vocab_size, tv)
    write_json(ckpt / "config.json", hub_cfg)
    proc_cfg = processor_config()

    print("[3/6] model + training")
    from transformers import LightOnOcrForConditionalGeneration

    config = cf.hub_config_to_lighton(hub_cfg)
    config._attn_implementation = "sdpa"
    config.text_config._attn_implementation = "sdpa"
    config.vision_config._attn_implementation = "sdpa"
    torch.manual_seed(args.seed)
    model = LightOnOcrForConditionalGeneration(config)
    assert model.lm_head.weight is model.model.language_model.embed_tokens.weight
    n_params = sum(p.numel() for p in model.parameters())
    print(f"  {n_params} parameters (lm_head tied)")
    pb = PromptBuilder(ckpt, tok)
    final_loss = train(model, pb, proc_cfg, args.steps, args.batch, args.seed)
    acc32 = evaluate(model, pb, proc_cfg, args.eval_per_kind, args.seed + 1)
    print(f"  fp32 model: {acc32}")

    print("[4/6] save bf16 weights, reload, re-evaluate")
    saved = save_weights(model, ckpt / "model.safetensors")
    reloaded = cf.load_model(ckpt)
    acc16 = evaluate(reloaded, pb, proc_cfg, args.eval_per_kind, args.seed + 1)
    print(f"  bf16 weights (run in fp32): {acc16}")
    with tempfile.TemporaryDirectory() as td:
        native = verify_native_save(reloaded, set(saved), Path(td))

    print("[5/6] test images")
    write_test_images(out / "images")
    test_reads = {}
    for name, _w, _h, truth, _c0, _r0 in TEST_IMAGES:
        pred = read_digits(reloaded, pb, cf.load_rgb(out / "images" / name), proc_cfg)
        test_reads[name] = {"truth": truth, "read": pred}
        print(f"  {name}: truth {truth}  read {pred!r}")

    write_json(out / "TRAINING.json", {
        "generated_by": "scripts/make_fixture.py",
        "seed": args.seed,
        "steps": args.steps,
        "batch": args.batch,
        "final_loss_ema": final_loss,
        "parameters": n_params,
        "eval_fp32": acc32,
        "eval_bf16_weights": acc16,
        "test_images": test_reads,
        "transformers_save_pretrained": native,
        "transformers_version": tv,
        "torch_version": torch.__version__,
    })

    if not args.no_goldens:
        print("[6/6] goldens (fresh process), then check (another fresh process)")
        env = dict(os.environ)
        script = str(SCRIPTS / "check_fixture.py")
        subprocess.run([sys.executable, script, "--fixture", str(out), "--write"], check=True, env=env)
        subprocess.run([sys.executable, script, "--fixture", str(out)], check=True, env=env)

    total = 0
    for rel, size in dir_listing(out):
        total += size
        print(f"  {size:9d}  {rel}")
    print(f"  total {total} bytes; done in {time.time() - t_start:.0f}s")
    if total >= 6 * 1024 * 1024:
        print("WARNING: fixture is larger than 6 MB")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
