#!/usr/bin/env python3
"""Reference ("golden") computation for the tiny LightOnOCR fixture, and its check.

The fixture lives in ``tests/fixtures/tiny-lightonocr/`` and is created by
``scripts/make_fixture.py``.  This script is the single source of truth for how the
goldens are computed: ``make_fixture.py`` runs it (in a fresh process) with ``--write``
to produce ``golden/``, and a plain run recomputes everything from the files exactly as
they are on disk and compares.

Usage (the venv needs torch, transformers 5.x, pillow, numpy, safetensors, tokenizers):

    /work/pyref/bin/python scripts/check_fixture.py            # check, exit 1 on mismatch
    /work/pyref/bin/python scripts/check_fixture.py --write    # (re)write golden/
    /work/pyref/bin/python scripts/check_fixture.py --fixture DIR

It takes well under a minute on 2 CPU cores.

What is computed per test image (see ``golden/golden.json`` for the exact recipe):

* ``pixel_values``: transformers ``PixtralImageProcessorPil`` configured from
  ``checkpoint/processor_config.json`` but called with ``patch_size=28`` (patch 14 x
  spatial merge 2), which gives exactly: r = max(h, w)/1540, if r > 1 then
  h = floor(h/r), w = floor(w/r); each side rounded UP to a multiple of 28; PIL BICUBIC
  resize of the uint8 RGB image; x/255 in float64 -> float32; (x - mean)/std in
  float32; NCHW.  An explicit re-implementation (``preprocess_explicit``) must match it
  bit for bit, and is checked to.
* the model is the hub-flavoured checkpoint (``model_type: mistral3``) mapped in memory
  to transformers' native ``lighton_ocr`` config, bf16 weights cast to float32, eager
  attention, CPU.
* ``image_features``: vision encoder + projector output [N, text_hidden].
* prompt: the checkpoint's chat template (image-only user message, generation prompt)
  with the single ``<|image_pad|>`` expanded to N copies, tokenized with tokenizer.json.
* greedy decoding for exactly 40 steps with a KV cache, EOS does not stop it,
  positions 0.. consecutive, attention mask all ones; top-5 log-softmax per step.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
DEFAULT_FIXTURE = REPO / "tests" / "fixtures" / "tiny-lightonocr"

GREEDY_STEPS = 40
TOPK = 5
ATTN_IMPLEMENTATION = "eager"
FLOAT_TOL = 1e-5

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
]

# Keys of the hub (mistral3-flavoured) config.json that carry no information for the
# native lighton_ocr classes; each is checked to hold the only value we support.
_TOP_LEVEL_FIXED = {
    "projector_hidden_act": "gelu",
    "multimodal_projector_bias": False,
    "vision_feature_layer": -1,
}
_DROP_KEYS = ("architectures", "dtype", "transformers_version", "use_cache", "torch_dtype")


# --------------------------------------------------------------------------- helpers
def read_json(path: Path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def ckpt_dir(fixture: Path) -> Path:
    return fixture / "checkpoint"


def set_determinism(threads: int = 1) -> None:
    """One intra-op thread: reproducible reductions, and no OpenMP spin-wait collapse on a
    busy 2-core machine."""
    torch.manual_seed(0)
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------- config
def _fold_rope(sub: dict, what: str) -> dict:
    """The hub writes rope_theta both flat and inside rope_parameters: check, keep one."""
    sub = dict(sub)
    flat = sub.pop("rope_theta", None)
    rp = dict(sub.get("rope_parameters") or {})
    if flat is not None:
        if "rope_theta" in rp and float(rp["rope_theta"]) != float(flat):
            raise ValueError(f"{what}: rope_theta {flat} != rope_parameters.rope_theta {rp['rope_theta']}")
        rp.setdefault("rope_theta", flat)
    rp.setdefault("rope_type", "default")
    sub["rope_parameters"] = rp
    return sub


def hub_config_to_lighton(cfg: dict):
    """Map the hub flavour of config.json (``model_type: mistral3``,
    ``architectures: [LightOnOCRForConditionalGeneration]``) to transformers' native
    ``LightOnOcrConfig`` (``model_type: lighton_ocr``).  Pure, in memory."""
    from transformers import LightOnOcrConfig

    d = copy.deepcopy(cfg)
    mt = d.pop("model_type", None)
    if mt not in ("mistral3", "lighton_ocr"):
        raise ValueError(f"unexpected model_type {mt!r}")
    for k, v in _TOP_LEVEL_FIXED.items():
        if k in d:
            if d[k] != v:
                raise ValueError(f"unsupported {k}={d[k]!r} (expected {v!r})")
            del d[k]
    for k in _DROP_KEYS:
        d.pop(k, None)
    if "image_token_index" in d:  # the pruned models' (older) name
        index = d.pop("image_token_index")
        if d.setdefault("image_token_id", index) != index:
            raise ValueError("image_token_id and image_token_index disagree")
    for name in ("text_config", "vision_config"):
        sub = dict(d[name])
        for k in _DROP_KEYS:
            sub.pop(k, None)
        d[name] = _fold_rope(sub, name)
    tc, vc = d["text_config"], d["vision_config"]
    if tc.get("model_type") != "qwen3" or vc.get("model_type") != "pixtral":
        raise ValueError("expected qwen3 text tower and pixtral vision tower")
    if tc.pop("use_qk_norm", True) is not True:
        raise ValueError("Qwen3 in transformers always applies q/k norm")
    # transformers' PixtralVisionConfig derives head_dim = hidden/heads and ignores the key.
    if vc.get("head_dim", vc["hidden_size"] // vc["num_attention_heads"]) != vc["hidden_size"] // vc["num_attention_heads"]:
        raise ValueError("vision head_dim must equal hidden_size / num_attention_heads")
    # top-level tie flag follows the text config (the hub only sets it there); absent in both
    # (the pruned 0.9B models): Qwen3's default, untied, their own lm_head.weight.
    tie = d.setdefault("tie_word_embeddings", tc.get("tie_word_embeddings", False))
    tc["tie_word_embeddings"] = tie
    return LightOnOcrConfig(**d)


# --------------------------------------------------------------------------- model
def load_model(ckpt: Path, attn_implementation: str = ATTN_IMPLEMENTATION):
    """Build LightOnOcrForConditionalGeneration from the hub config (mapped in memory),
    load model.safetensors (bf16, hub names, lm_head absent -> tied) and cast to fp32."""
    from safetensors.torch import load_file
    from transformers import LightOnOcrForConditionalGeneration

    config = hub_config_to_lighton(read_json(ckpt / "config.json"))
    config._attn_implementation = attn_implementation
    config.text_config._attn_implementation = attn_implementation
    config.vision_config._attn_implementation = attn_implementation
    torch.manual_seed(0)
    model = LightOnOcrForConditionalGeneration(config)
    state = {k: v.to(torch.float32) for k, v in load_file(str(ckpt / "model.safetensors")).items()}
    result = model.load_state_dict(state, strict=False)
    missing = sorted(set(result.missing_keys) - {"lm_head.weight"})
    if missing or result.unexpected_keys:
        raise RuntimeError(f"weight mismatch: missing={missing} unexpected={result.unexpected_keys}")
    embed = model.model.language_model.embed_tokens.weight
    if not config.tie_word_embeddings:
        if "lm_head.weight" not in state:
            raise RuntimeError("untied config but no lm_head.weight in the checkpoint")
        if model.lm_head.weight is embed or not torch.equal(model.lm_head.weight, state["lm_head.weight"]):
            raise RuntimeError("lm_head.weight was not loaded as its own tensor")
    else:
        if "lm_head.weight" in state and not torch.equal(state["lm_head.weight"],
                                                         state["model.language_model.embed_tokens.weight"]):
            raise RuntimeError("lm_head.weight present but not equal to the embeddings")
        model.lm_head.weight = embed  # tie
    model.to(torch.float32).eval()
    return model


# --------------------------------------------------------------------------- preprocessing
def target_hw(h: int, w: int, longest_edge: int = 1540, align: int = 28) -> tuple[int, int]:
    ratio = max(h / longest_edge, w / longest_edge)
    if ratio > 1:
        h = int(math.floor(h / ratio))
        w = int(math.floor(w / ratio))
    return ((h - 1) // align + 1) * align, ((w - 1) // align + 1) * align


def load_rgb(path: Path) -> Image.Image:
    img = Image.open(path)
    img.load()
    return img.convert("RGB") if img.mode != "RGB" else img


def preprocess_explicit(img: Image.Image, proc_cfg: dict, align: int = 28) -> np.ndarray:
    """Exactly what the golden pixel_values are (checked against transformers):
    PIL BICUBIC resize on uint8 RGB, then float32((float64(u8) * (1/255))),
    then (x - float32(mean)) / float32(std) in float32, NCHW with batch 1."""
    ip = proc_cfg["image_processor"]
    if img.mode != "RGB":
        img = img.convert("RGB")
    w, h = img.size
    H, W = target_hw(h, w, ip["size"]["longest_edge"], align)
    resized = img.resize((W, H), resample=Image.BICUBIC)
    u8 = np.asarray(resized, dtype=np.uint8)  # H, W, 3
    x = (u8.astype(np.float64) * ip["rescale_factor"]).astype(np.float32)
    mean = np.asarray(ip["image_mean"], dtype=np.float32)
    std = np.asarray(ip["image_std"], dtype=np.float32)
    x = (x - mean) / std
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


_IMAGE_SETTING_KEYS = ("image_processor_type", "size", "image_mean", "image_std", "rescale_factor", "resample")


def image_settings(ckpt: Path) -> dict:
    """The image processor settings as ``{"image_processor": {...}}``, wherever the layout keeps
    them: nested in processor_config.json (v2), flat in it, or in preprocessor_config.json (v1,
    whose processor_config.json holds the processor keys alone)."""
    proc = ckpt / "processor_config.json"
    pre = ckpt / "preprocessor_config.json"
    p = read_json(proc) if proc.is_file() else {}
    if isinstance(p.get("image_processor"), dict):
        return p
    if any(k in p for k in _IMAGE_SETTING_KEYS):
        return {"image_processor": p}
    return {"image_processor": read_json(pre)}


def hf_image_processor(proc_cfg: dict):
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    ip = {k: v for k, v in proc_cfg["image_processor"].items() if v is not None}
    for k in ("image_processor_type", "data_format", "processor_class", "image_break_token",
              "image_end_token", "image_token", "spatial_merge_size"):
        ip.pop(k, None)
    return PixtralImageProcessorPil(**ip)


def preprocess_reference(img: Image.Image, proc_cfg: dict, align: int = 28) -> np.ndarray:
    proc = hf_image_processor(proc_cfg)
    out = proc(img, patch_size={"height": align, "width": align}, return_tensors="np")
    pv = np.asarray(out["pixel_values"], dtype=np.float32)
    assert tuple(int(v) for v in out["image_sizes"][0]) == pv.shape[-2:]
    return pv


# --------------------------------------------------------------------------- prompt
def load_tokenizer(ckpt: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(ckpt / "tokenizer.json"))


# The pruned-vocabulary models (LightOnOCR-0.9B-*-1025) keep only some of Qwen's special
# tokens (no <|vision_*|>); these four every layout has.
REQUIRED_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|image_pad|>")


def special_token_ids(tok) -> dict[str, int]:
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    missing = [t for t in REQUIRED_SPECIAL_TOKENS if ids[t] is None]
    ids = {t: i for t, i in ids.items() if i is not None}
    if missing:
        raise ValueError(f"tokenizer lacks {missing}")
    return ids


def render_chat_prompt(ckpt: Path) -> str:
    """The checkpoint's own chat template, rendered the way transformers does
    (jinja2, trim_blocks + lstrip_blocks), for one image-only user message."""
    from transformers.utils.chat_template_utils import render_jinja_template

    tc = read_json(ckpt / "tokenizer_config.json")
    # v1 checkpoints keep the template in chat_template.jinja only.
    template = tc.get("chat_template") or (ckpt / "chat_template.jinja").read_text(encoding="utf-8")
    messages = [{"role": "user", "content": [{"type": "image"}]}]
    rendered, _ = render_jinja_template(
        conversations=[messages], chat_template=template, add_generation_prompt=True
    )
    return rendered[0]


def build_prompt(ckpt: Path, tok, n_image_tokens: int) -> tuple[str, list[int]]:
    text = render_chat_prompt(ckpt)
    if text.count("<|image_pad|>") != 1:
        raise ValueError(f"chat template produced {text.count('<|image_pad|>')} image placeholders")
    expanded = text.replace("<|image_pad|>", "<|image_pad|>" * n_image_tokens)
    ids = tok.encode(expanded, add_special_tokens=False).ids
    return expanded, ids


# --------------------------------------------------------------------------- inference
@torch.no_grad()
def image_features(model, pixel_values: torch.Tensor) -> torch.Tensor:
    H, W = pixel_values.shape[-2:]
    out = model.model.get_image_features(pixel_values=pixel_values, image_sizes=[(H, W)], return_dict=True)
    return out.pooler_output[0]


@torch.no_grad()
def greedy(model, input_ids: list[int], pixel_values: torch.Tensor, steps: int = GREEDY_STEPS, topk: int = TOPK):
    """Own greedy loop: KV cache, positions 0.., attention mask of ones, EOS ignored.
    Returns (first_logits [vocab], ids [steps], top[steps][topk] of (id, logprob))."""
    from transformers import DynamicCache

    H, W = pixel_values.shape[-2:]
    ids = torch.tensor([input_ids], dtype=torch.long)
    P = ids.shape[1]
    cache = DynamicCache(config=model.config.text_config)
    out = model(
        input_ids=ids,
        pixel_values=pixel_values,
        image_sizes=[(H, W)],
        attention_mask=torch.ones(1, P, dtype=torch.long),
        position_ids=torch.arange(P).unsqueeze(0),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    logits = out.logits[0, -1].float()
    first_logits = logits.clone()
    gen, tops = [], []
    for step in range(steps):
        logprobs = torch.log_softmax(logits, dim=-1)
        vals, idx = torch.topk(logprobs, topk)
        tops.append([(int(i), float(v)) for i, v in zip(idx, vals)])
        nxt = int(torch.argmax(logits))
        gen.append(nxt)
        if step == steps - 1:
            break
        pos = P + step
        out = model(
            input_ids=torch.tensor([[nxt]], dtype=torch.long),
            attention_mask=torch.ones(1, pos + 1, dtype=torch.long),
            position_ids=torch.tensor([[pos]], dtype=torch.long),
            past_key_values=out.past_key_values,
            use_cache=True,
        )
        logits = out.logits[0, -1].float()
    return first_logits, gen, tops


def decode_until_eos(tok, ids: list[int], eos_ids: list[int]) -> str:
    cut = len(ids)
    for i, t in enumerate(ids):
        if t in eos_ids:
            cut = i
            break
    return tok.decode(ids[:cut], skip_special_tokens=True)


# --------------------------------------------------------------------------- goldens
PREPROCESSING_DOC = (
    "transformers {tv} PixtralImageProcessorPil (PIL backend) built from "
    "checkpoint/processor_config.json image_processor, called with patch_size={{height:28,width:28}} "
    "(= patch_size 14 x spatial_merge_size 2). Equivalent explicit recipe (checked bit-exact): "
    "decode file with PIL {pv}, convert('RGB') if not RGB; r = max(h,w)/1540 (float64); if r > 1: "
    "h = floor(h/r), w = floor(w/r); H = ceil(h/28)*28, W = ceil(w/28)*28; "
    "PIL Image.resize((W,H), Image.BICUBIC) on the uint8 RGB image (reducing_gap None); "
    "x = float32(float64(u8) * 0.00392156862745098); x = (x - float32(mean)) / float32(std) computed in "
    "float32 per channel, mean=[0.48145466,0.4578275,0.40821073], std=[0.26862954,0.26130258,0.27577711]; "
    "layout NCHW [1,3,H,W]. Note: PIL's resize is also applied when (W,H) equals the input size "
    "(a no-op copy). The JPEG test image is decoded by PIL/libjpeg-turbo; other decoders may differ "
    "by +-1: decoded_rgb.<stem> holds PIL's decoded uint8 pixels [h,w,3] for JPEG inputs."
)


def list_images(fixture: Path) -> list[Path]:
    files = sorted(p for p in (fixture / "images").iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
    if not files:
        raise FileNotFoundError(f"no images under {fixture / 'images'}")
    return files


def compute_goldens(fixture: Path, log=print):
    import PIL
    import transformers

    set_determinism()
    ckpt = ckpt_dir(fixture)
    tok = load_tokenizer(ckpt)
    sp = special_token_ids(tok)
    cfg_json = read_json(ckpt / "config.json")
    gen_cfg = read_json(ckpt / "generation_config.json")
    proc_cfg = image_settings(ckpt)
    eos = gen_cfg["eos_token_id"]
    eos_ids = list(eos) if isinstance(eos, list) else [eos]
    # The pruned models name it image_token_index.
    image_token_id = cfg_json.get("image_token_id", cfg_json.get("image_token_index"))
    if image_token_id != sp["<|image_pad|>"]:
        raise ValueError("config image_token_id != tokenizer <|image_pad|>")
    model = load_model(ckpt)
    chat_text = render_chat_prompt(ckpt)

    tensors: dict[str, torch.Tensor] = {}
    images_meta = []
    for path in list_images(fixture):
        stem = path.stem
        raw = Image.open(path)
        raw.load()
        img = load_rgb(path)
        w, h = img.size
        pv_ref = preprocess_reference(img, proc_cfg)
        pv_exp = preprocess_explicit(img, proc_cfg)
        if pv_ref.shape != pv_exp.shape or not np.array_equal(pv_ref, pv_exp):
            raise AssertionError(f"{stem}: explicit preprocessing differs from transformers' processor")
        H, W = pv_ref.shape[-2:]
        assert (H, W) == target_hw(h, w)
        pv = torch.from_numpy(pv_ref)
        n_tok = (H // 28) * (W // 28)
        feats = image_features(model, pv)
        assert feats.shape == (n_tok, model.config.text_config.hidden_size), feats.shape
        prompt_text, prompt_ids = build_prompt(ckpt, tok, n_tok)
        assert prompt_ids.count(image_token_id) == n_tok
        first_logits, gen, tops = greedy(model, prompt_ids, pv)
        # informational: what the stock processor config (patch_size 14) would produce
        hf14 = hf_image_processor(proc_cfg)(img, return_tensors="np")["image_sizes"][0]
        tensors[f"pixel_values.{stem}"] = pv.contiguous()
        tensors[f"image_features.{stem}"] = feats.float().contiguous()
        tensors[f"first_logits.{stem}"] = first_logits.contiguous()
        if path.suffix.lower() in (".jpg", ".jpeg"):
            tensors[f"decoded_rgb.{stem}"] = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy())
        meta = {
            "stem": stem,
            "file": f"images/{path.name}",
            "source_mode": raw.mode,
            "original_hw": [h, w],
            "processed_hw": [int(H), int(W)],
            "stock_processor_patch14_hw": [int(v) for v in hf14],
            "num_image_tokens": n_tok,
            "prompt_ids": prompt_ids,
            "prompt_text": prompt_text,
            "greedy_ids": gen,
            "greedy_text": tok.decode(gen, skip_special_tokens=False),
            "greedy_until_eos_text": decode_until_eos(tok, gen, eos_ids),
            "steps_until_eos": next((i for i, t in enumerate(gen) if t in eos_ids), len(gen)),
            # smallest gap between the best and second-best log-prob: how robust argmax is
            "top1_margin_min_until_eos": min(
                (st[0][1] - st[1][1]) for st in tops[: next((i for i, t in enumerate(gen) if t in eos_ids), len(gen)) + 1]
            ),
            "top1_margin_min_all_steps": min(st[0][1] - st[1][1] for st in tops),
            "top5": [[{"id": i, "logprob": lp} for i, lp in step] for step in tops],
        }
        images_meta.append(meta)
        log(f"  {stem}: {h}x{w} -> {H}x{W}, N={n_tok}, prompt {len(prompt_ids)} ids, "
            f"greedy until eos = {meta['greedy_until_eos_text']!r}, min top1 margin "
            f"{meta['top1_margin_min_until_eos']:.3f} (until eos) / {meta['top1_margin_min_all_steps']:.3f} (40 steps)")

    doc = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "pillow_version": PIL.__version__,
        "preprocessing": PREPROCESSING_DOC.format(tv=transformers.__version__, pv=PIL.__version__),
        "attn_implementation": f"{ATTN_IMPLEMENTATION} (vision and text), float32 on CPU; weights: bf16 in "
        "model.safetensors cast to float32; lm_head tied to model.language_model.embed_tokens.weight",
        "model_loading": "checkpoint/config.json (hub flavour, model_type mistral3) mapped in memory to "
        "transformers LightOnOcrConfig (model_type lighton_ocr) by check_fixture.hub_config_to_lighton",
        "generation": f"own greedy loop: {GREEDY_STEPS} steps, argmax of fp32 logits, EOS does not stop, "
        "KV cache, position_ids consecutive from 0, attention_mask all ones; top5 = topk of "
        "log_softmax(fp32 logits) at each step; first_logits = logits at the last prompt position",
        "chat_template_output": chat_text,
        "image_token_id": image_token_id,
        "eos_token_ids": eos_ids,
        "special_token_ids": sp,
        "greedy_steps": GREEDY_STEPS,
        "images": images_meta,
    }
    return tensors, doc


def write_goldens(fixture: Path, tensors, doc) -> None:
    from safetensors.torch import save_file

    out = fixture / "golden"
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "golden.safetensors"), metadata={"format": "pt"})
    with open(out / "golden.json", "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


def compare(fixture: Path, tensors, doc, log=print) -> list[str]:
    from safetensors.torch import load_file

    errors: list[str] = []
    g_t = load_file(str(fixture / "golden" / "golden.safetensors"))
    g_doc = read_json(fixture / "golden" / "golden.json")

    if set(g_t) != set(tensors):
        errors.append(f"tensor names differ: {sorted(set(g_t) ^ set(tensors))}")
    worst = 0.0
    for name in sorted(set(g_t) & set(tensors)):
        a, b = g_t[name], tensors[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            errors.append(f"{name}: shape/dtype {tuple(a.shape)}/{a.dtype} vs {tuple(b.shape)}/{b.dtype}")
            continue
        diff = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        worst = max(worst, diff)
        if diff > FLOAT_TOL:
            errors.append(f"{name}: max abs diff {diff:.3e} > {FLOAT_TOL}")
        log(f"  {name:40s} {str(tuple(a.shape)):18s} max|diff| = {diff:.3e}")

    for key in ("image_token_id", "eos_token_ids", "special_token_ids", "greedy_steps", "chat_template_output"):
        if g_doc.get(key) != doc.get(key):
            errors.append(f"golden.json {key} differs: {g_doc.get(key)!r} vs {doc.get(key)!r}")
    for key in ("transformers_version", "torch_version", "pillow_version", "preprocessing", "attn_implementation"):
        if g_doc.get(key) != doc.get(key):
            log(f"  note: {key} {g_doc.get(key)} (golden) vs {doc.get(key)} (now)")

    g_imgs = {m["stem"]: m for m in g_doc["images"]}
    n_imgs = {m["stem"]: m for m in doc["images"]}
    if set(g_imgs) != set(n_imgs):
        errors.append(f"image stems differ: {sorted(g_imgs)} vs {sorted(n_imgs)}")
    for stem in sorted(set(g_imgs) & set(n_imgs)):
        g, n = g_imgs[stem], n_imgs[stem]
        for key in ("file", "source_mode", "original_hw", "processed_hw", "stock_processor_patch14_hw",
                    "num_image_tokens", "prompt_ids", "prompt_text", "greedy_ids", "greedy_text",
                    "greedy_until_eos_text", "steps_until_eos"):
            if g[key] != n[key]:
                errors.append(f"{stem}: {key} differs")
        if len(g["top5"]) != len(n["top5"]):
            errors.append(f"{stem}: top5 length differs")
        else:
            for s, (gs, ns) in enumerate(zip(g["top5"], n["top5"])):
                if [e["id"] for e in gs] != [e["id"] for e in ns]:
                    errors.append(f"{stem}: top5 ids differ at step {s}")
                    break
                d = max(abs(e1["logprob"] - e2["logprob"]) for e1, e2 in zip(gs, ns))
                worst = max(worst, d)
                if d > FLOAT_TOL:
                    errors.append(f"{stem}: top5 logprob diff {d:.3e} at step {s}")
                    break
    log(f"  worst float difference: {worst:.3e} (tolerance {FLOAT_TOL})")
    return errors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE, help="fixture directory")
    ap.add_argument("--write", action="store_true", help="write golden/ instead of checking it")
    args = ap.parse_args(argv)
    fixture = args.fixture.resolve()

    print(f"computing goldens from {fixture} (fresh process, fp32, {ATTN_IMPLEMENTATION} attention, CPU)")
    tensors, doc = compute_goldens(fixture)
    if args.write:
        write_goldens(fixture, tensors, doc)
        print(f"wrote {fixture / 'golden'}")
        return 0
    errors = compare(fixture, tensors, doc)
    if errors:
        print(f"FAIL: {len(errors)} mismatch(es)")
        for e in errors:
            print("  - " + e)
        return 1
    print(f"OK: {len(doc['images'])} images, ids identical, floats within {FLOAT_TOL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
