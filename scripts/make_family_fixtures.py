#!/usr/bin/env python3
"""Create the tiny fixtures of the other LightOnOCR layouts (issue 38, the family).

Run from the repository root (under a minute on 2 CPU cores):

    /work/pyref/bin/python scripts/make_family_fixtures.py [--only v1|pruned-16k]

Needs what ``make_fixture.py`` needs (torch, transformers 5.x, tokenizers, safetensors,
pillow, numpy).  The models are *not trained*: random initialisation with a fixed seed,
written in each hub layout, is enough for parity (same greedy ids, log-probabilities within
the tests' tolerances).  Each fixture is ``tests/fixtures/family/<name>/`` with
``checkpoint/``, ``images/`` (two PNGs copied from tiny-lightonocr) and ``golden/`` written
by ``check_fixture.py --write --fixture DIR`` in a fresh process, then verified by a second
run.  Seeds are tried until every greedy step's top-1 log-probability leads the second by
``MIN_MARGIN`` (an argmax that another fp32 implementation cannot flip), the greedy ids
vary (``MIN_DISTINCT_IDS``) and differ between the images.  The weights are drawn with
std ``INIT_STD`` instead of the config's 0.02, at which the untrained model repeats one token.

``v1``      LightOnOCR-1B-1025's layout (transformers 4.57): ``config.json`` with
            ``rope_theta`` flat only, ``rope_scaling: null``, no top-level eos/pad ids;
            ``processor_config.json`` with the processor keys alone (processor_class
            ``LightOnOCRProcessor``); the image settings in ``preprocessor_config.json``;
            ``tokenizer_config.json`` of transformers 4 (``Qwen2Tokenizer``, no chat
            template); the template in ``chat_template.jinja``.  Vocabulary 384 (327 tokens).
``pruned-16k``  LightOnOCR-0.9B-16k-1025's layout (transformers 4.50), as its hub files
            are: ``config.json`` names the image token ``image_token_index`` (7), has
            ``torch_dtype``, no ``tie_word_embeddings`` (untied: an ``lm_head.weight`` of its
            own, as the hub model's size shows), no ``attention_bias`` / ``layer_types``;
            the 8 special tokens come *first* (``<|im_start|>`` 0, ``<|im_end|>`` 1,
            ``<|endoftext|>`` 2, box/object-ref tokens 3-6, ``<|image_pad|>`` 7; no
            ``<|vision_*|>`` tokens), then 16 376 byte-level BPE entries trained on seeded
            random words over a European alphabet: ``vocab_size`` 16 384 = tokenizer entries;
            ``generation_config.json`` is ``_from_model_config`` (bos 2, eos 1, no sampling
            defaults); ``processor_config.json`` has ``<|box_end|>`` as Pixtral's break and
            end tokens and ``processor_class: PixtralProcessor``; ``preprocessor_config.json``
            is the slow ``PixtralImageProcessor``'s with ``patch_size {height, width}``; the
            chat template (``chat_template.jinja``) is Qwen2-VL's one-line template with a
            literal backslash-n for each newline (see PRUNED_CHAT_TEMPLATE).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import torch

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
import check_fixture as cf  # noqa: E402
import make_fixture as mf  # noqa: E402

OUT = cf.REPO / "tests" / "fixtures" / "family"
IMAGES = ("unaligned.png", "aligned.png")
MIN_MARGIN = 0.01  # 1000x the fp32 differences between implementations (1e-5)
MIN_DISTINCT_IDS = 8  # per image, over the 40 greedy steps
INIT_STD = 0.25
V1_TRANSFORMERS = "4.57.0.dev0"
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

LAYOUTS = {
    "v1": dict(
        text=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=32, intermediate_size=128),
        vision=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=16,
                    intermediate_size=128),
        bpe=320, vocab=384, pruned=False, seed=11,
    ),
    "pruned-16k": dict(
        # hidden 24: the embeddings and the untied lm_head (16384 x 24, bf16) stay under 2 MB.
        text=dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=16, intermediate_size=48),
        vision=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, head_dim=16,
                    intermediate_size=64),
        # 16 384 random logits lie closer together: 0.005 nats is still 200x the largest
        # top-5 log-prob difference ORT shows on it (2.5e-5).
        bpe=16384, vocab=16384, pruned=True, seed=21, min_margin=0.005,
    ),
}


# ----------------------------------------------------------------------------- tokenizer
def european_corpus(seed: int, words: int = 120_000) -> list[str]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyzéèêàâçëïîôöüûùßñåøæ"
    lines, line = [], []
    for _ in range(words):
        w = "".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))
        line.append(w.capitalize() if rng.random() < 0.1 else w)
        if len(line) == 12:
            lines.append(" ".join(line) + ".")
            line = []
    return lines


# The special tokens of the pruned models, at ids 0..7 (their tokenizer_config.json).
PRUNED_SPECIAL_TOKENS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|box_start|>", "<|box_end|>",
    "<|object_ref_end|>", "<|object_ref_start|>", "<|image_pad|>",
]

# Qwen2-VL's chat template as the pruned models' chat_template.jinja holds it: with a literal
# backslash-n (two characters) where Qwen2-VL has newlines (the hub API's
# `chat_template_jinja` of both pruned repositories shows it escaped twice, LightOnOCR-2's
# once). Rendered as shipped, as transformers does: the prompt holds a backslash and an n.
PRUNED_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system<|im_end|>\\n{% endif %}<|im_start|>{{ message['role'] }}\\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\\n{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|image_pad|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}"
)


def build_tokenizer(bpe_size: int, seed: int, pruned: bool):
    """Byte-level BPE with Qwen2's pre-tokenizer (as make_fixture.build_tokenizer): v1, `bpe_size`
    entries then the special tokens; pruned, the special tokens first (ids 0..7) and `bpe_size`
    entries in all."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(mf.QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    def added(tokens):
        return [AddedToken(t, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
                for t in tokens]

    trainer = trainers.BpeTrainer(
        vocab_size=bpe_size, min_frequency=1, show_progress=False,
        special_tokens=added(PRUNED_SPECIAL_TOKENS) if pruned else [],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = mf.bpe_corpus(seed) + (european_corpus(seed) if pruned else [])
    tok.train_from_iterator(corpus, trainer=trainer)
    if tok.get_vocab_size() != bpe_size:
        raise RuntimeError(f"BPE trained to {tok.get_vocab_size()} entries, wanted {bpe_size}")
    if pruned:
        assert [tok.token_to_id(t) for t in PRUNED_SPECIAL_TOKENS] == list(range(8))
    else:
        tok.add_special_tokens(added(cf.SPECIAL_TOKENS))
    return tok


# ----------------------------------------------------------------------------- v1 files
def v1_config(lay: dict, sp: dict[str, int]) -> dict:
    """config.json key for key like lightonai/LightOnOCR-1B-1025's."""
    T, V = lay["text"], lay["vision"]
    return {
        "architectures": ["LightOnOCRForConditionalGeneration"],
        "dtype": "bfloat16",
        "image_token_id": sp["<|image_pad|>"],
        "model_type": "mistral3",
        "multimodal_projector_bias": False,
        "projector_hidden_act": "gelu",
        "spatial_merge_size": mf.MERGE,
        "text_config": {
            "architectures": ["Qwen3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0,
            "head_dim": T["head_dim"],
            "hidden_act": "silu",
            "hidden_size": T["hidden_size"],
            "initializer_range": 0.02,
            "intermediate_size": T["intermediate_size"],
            "layer_types": ["full_attention"] * T["num_hidden_layers"],
            "max_position_embeddings": 8192,
            "max_window_layers": T["num_hidden_layers"],
            "model_type": "qwen3",
            "num_attention_heads": T["num_attention_heads"],
            "num_hidden_layers": T["num_hidden_layers"],
            "num_key_value_heads": T["num_key_value_heads"],
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000,
            "sliding_window": None,
            "use_cache": True,
            "use_sliding_window": False,
            "tie_word_embeddings": True,
            "vocab_size": lay["vocab"],
        },
        "transformers_version": V1_TRANSFORMERS,
        "vision_config": {
            "attention_dropout": 0,
            "head_dim": V["head_dim"],
            "hidden_act": "silu",
            "hidden_size": V["hidden_size"],
            "image_size": 1540,
            "initializer_range": 0.02,
            "intermediate_size": V["intermediate_size"],
            "model_type": "pixtral",
            "num_attention_heads": V["num_attention_heads"],
            "num_channels": 3,
            "num_hidden_layers": V["num_hidden_layers"],
            "patch_size": 14,
            "rope_theta": 10000,
        },
        "vision_feature_layer": -1,
    }


def v1_generation_config(sp: dict[str, int]) -> dict:
    return {
        "bos_token_id": sp["<|endoftext|>"],
        "do_sample": True,
        "eos_token_id": [sp["<|im_end|>"], sp["<|endoftext|>"]],
        "pad_token_id": sp["<|endoftext|>"],
        "temperature": 0.2,
        "top_k": 0,
        "top_p": 0.9,
        "transformers_version": "4.55.3",
    }


def v1_image_settings() -> dict:
    """preprocessor_config.json of LightOnOCR-1B-1025."""
    return {
        "crop_size": None, "data_format": "channels_first", "default_to_square": True,
        "device": None, "disable_grouping": None, "do_center_crop": None, "do_convert_rgb": True,
        "do_normalize": True, "do_pad": None, "do_rescale": True, "do_resize": True,
        "image_mean": CLIP_MEAN, "image_processor_type": "PixtralImageProcessorFast",
        "image_std": CLIP_STD, "input_data_format": None, "pad_size": None, "patch_size": 14,
        "processor_class": "LightOnOCRProcessor", "resample": 3,
        "rescale_factor": 0.00392156862745098, "return_tensors": None,
        "size": {"longest_edge": 1540},
    }


def v1_processor_config() -> dict:
    return {
        "image_break_token": "<|vision_pad|>",
        "image_end_token": "<|vision_end|>",
        "image_token": "<|image_pad|>",
        "patch_size": 14,
        "processor_class": "LightOnOCRProcessor",
        "spatial_merge_size": 2,
    }


def v1_tokenizer_config(sp: dict[str, int]) -> dict:
    """tokenizer_config.json of transformers 4 (no chat template: chat_template.jinja has it)."""
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(sp[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                         "single_word": False, "special": True}
            for t in cf.SPECIAL_TOKENS
        },
        "additional_special_tokens": [t for t in cf.SPECIAL_TOKENS if t != "<|endoftext|>"],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "extra_special_tokens": {},
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "processor_class": "LightOnOCRProcessor",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


# ----------------------------------------------------------------------------- pruned files
def pruned_config(lay: dict, sp: dict[str, int]) -> dict:
    """config.json key for key like lightonai/LightOnOCR-0.9B-16k-1025's."""
    cfg = v1_config(lay, sp)
    del cfg["dtype"], cfg["image_token_id"]
    for k in ("attention_bias", "layer_types", "max_window_layers", "rope_scaling", "tie_word_embeddings"):
        del cfg["text_config"][k]
    cfg["torch_dtype"] = "bfloat16"
    cfg["transformers_version"] = "4.50.0.dev0"
    cfg["image_token_index"] = sp["<|image_pad|>"]
    return cfg


def pruned_files(sp: dict[str, int]) -> dict[str, dict]:
    image = v1_image_settings()
    for k in ("disable_grouping", "do_pad", "pad_size"):
        image.pop(k)
    image["image_processor_type"] = "PixtralImageProcessor"
    image["patch_size"] = {"height": 14, "width": 14}
    return {
        "generation_config.json": {"_from_model_config": True, "bos_token_id": sp["<|endoftext|>"],
                                   "eos_token_id": sp["<|im_end|>"], "transformers_version": "4.55.3"},
        "processor_config.json": {
            "image_break_token": "<|box_end|>", "image_end_token": "<|box_end|>",
            "image_token": "<|image_pad|>", "patch_size": 14, "processor_class": "PixtralProcessor",
            "spatial_merge_size": 2,
        },
        "preprocessor_config.json": image,
        "tokenizer_config.json": {
            "added_tokens_decoder": {
                str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                         "single_word": False, "special": True}
                for i, t in enumerate(PRUNED_SPECIAL_TOKENS)
            },
            "additional_special_tokens": ["<|im_start|>", "<|object_ref_start|>", "<|object_ref_end|>",
                                          "<|box_start|>", "<|box_end|>", "<|image_pad|>"],
            "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
            "errors": "replace", "extra_special_tokens": {}, "model_max_length": 131072,
            "pad_token": "<|endoftext|>", "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
        },
    }


# ----------------------------------------------------------------------------- model
def random_model(cfg_json: dict, seed: int):
    from transformers import LightOnOcrForConditionalGeneration

    config = cf.hub_config_to_lighton(cfg_json)
    # Wider than the config's 0.02 so that the untrained model's greedy ids vary with the
    # image and the step (at 0.02 it repeats one token whatever it sees).
    config.text_config.initializer_range = INIT_STD
    config.vision_config.initializer_range = INIT_STD
    torch.manual_seed(seed)
    model = LightOnOcrForConditionalGeneration(config)
    model.to(torch.float32).eval()
    return model


def write_checkpoint(name: str, lay: dict, seed: int, ck: Path) -> None:
    tok = build_tokenizer(lay["bpe"], lay["seed"], lay["pruned"])
    sp = cf.special_token_ids(tok)
    ck.mkdir(parents=True)
    tok.save(str(ck / "tokenizer.json"))
    if lay["pruned"]:
        cfg_json = pruned_config(lay, sp)
        files = pruned_files(sp)
        template = PRUNED_CHAT_TEMPLATE
    else:
        cfg_json = v1_config(lay, sp)
        files = {
            "generation_config.json": v1_generation_config(sp),
            "tokenizer_config.json": v1_tokenizer_config(sp),
            "processor_config.json": v1_processor_config(),
            "preprocessor_config.json": v1_image_settings(),
        }
        template = mf.CHAT_TEMPLATE
    mf.write_json(ck / "config.json", cfg_json)
    for file, content in files.items():
        mf.write_json(ck / file, content)
    (ck / "chat_template.jinja").write_text(template, encoding="utf-8")
    save_weights(random_model(cfg_json, seed), ck / "model.safetensors")


def save_weights(model, path: Path) -> None:
    """bf16, hub names; `lm_head.weight` only when untied (the pruned layout)."""
    from safetensors.torch import save_file

    tied = model.config.tie_word_embeddings
    out = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
           if k.startswith(mf.HUB_PREFIXES) or (k == "lm_head.weight" and not tied)}
    if not tied:
        assert not torch.equal(out["lm_head.weight"], out["model.language_model.embed_tokens.weight"])
    save_file(out, str(path), metadata={"format": "pt"})


def quality(fixture: Path) -> tuple[float, int, bool]:
    """Smallest top-1 margin, fewest distinct greedy ids of an image, and whether the images'
    greedy ids differ."""
    g = cf.read_json(fixture / "golden" / "golden.json")
    ims = g["images"]
    margin = min(im["top1_margin_min_all_steps"] for im in ims)
    distinct = min(len(set(im["greedy_ids"])) for im in ims)
    differ = len({tuple(im["greedy_ids"]) for im in ims}) == len(ims)
    return margin, distinct, differ


def make(name: str, log=print) -> None:
    lay = LAYOUTS[name]
    out = OUT / name
    for attempt in range(20):
        seed = 1000 * lay["seed"] + attempt
        shutil.rmtree(out, ignore_errors=True)
        write_checkpoint(name, lay, seed, out / "checkpoint")
        (out / "images").mkdir()
        for im in IMAGES:
            shutil.copy(cf.DEFAULT_FIXTURE / "images" / im, out / "images" / im)
        check = [sys.executable, str(SCRIPTS / "check_fixture.py"), "--fixture", str(out)]
        subprocess.run(check + ["--write"], check=True)
        m, distinct, differ = quality(out)
        log(f"{name}: seed {seed}: smallest top-1 margin {m:.4f}, {distinct} distinct ids, "
            f"images differ: {differ}")
        if m >= lay.get("min_margin", MIN_MARGIN) and distinct >= MIN_DISTINCT_IDS and differ:
            subprocess.run(check, check=True)
            mf.write_json(out / "SEED.json", {"weights_seed": seed, "tokenizer_seed": lay["seed"],
                                              "min_top1_margin": m})
            for path, size in mf.dir_listing(out):
                log(f"  {path} {size} bytes")
            return
    raise RuntimeError(f"{name}: no seed gave a top-1 margin of {MIN_MARGIN}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=sorted(LAYOUTS), help="one fixture only")
    args = ap.parse_args(argv)
    cf.set_determinism()
    for name in [args.only] if args.only else sorted(LAYOUTS):
        make(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
