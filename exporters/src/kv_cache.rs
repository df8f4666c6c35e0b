//! The element type of the GQA decoder's KV cache (`ocrctl export --kv-cache`).
//!
//! A decode step at a large batch is bound by reading the KV cache (every layer reads every
//! row's keys and values once), so a cache of one byte per element makes those steps up to
//! twice as fast and holds twice the sequences in the same memory. ONNX Runtime's
//! `GroupQueryAttention` takes an 8-bit cache (`T_CACHE` int8 or float8e4m3fn, attributes
//! `k_quant_type`/`v_quant_type`/`kv_cache_bit_width`, inputs `k_scale`/`v_scale`); checked
//! against its CUDA kernel (`contrib_ops/cuda/bert/group_query_attention.cc`) and measured on
//! the H200 with `docs/benchmarks/2026-12-03-kv-cache/gpu_kv_quant_probe.py`:
//!
//! - A decode step reads the quantized cache without dequantizing it only through XQA, and
//!   XQA's 8-bit path takes 4, 8, 16 or 32 query heads per KV head, one scale per tensor, and
//!   the *same* scale tensor for keys and values. LightOnOCR has 2 query heads per KV head:
//!   with 2 the kernel falls back to dequantizing the whole cache every step (measured: 3.4 ms
//!   per layer at batch 256 against 0.72 ms for fp16). So the query heads are padded to the
//!   next group XQA takes ([`xqa_group`]): zero queries added in each group, their outputs
//!   dropped. A decode step's attention is bound by the cache, not by the queries, and the
//!   padding costs nothing there (batch 256, 2 700 positions: 0.37 ms per layer for fp8 or
//!   int8 with padding, 0.67–0.72 ms for fp16 with or without). A prompt's attention (flash,
//!   on the new keys before they are quantized) does twice the work for its padded heads.
//! - `fp8` (E4M3, SM 8.9 and later: Ada, Hopper, Blackwell) keeps 3 mantissa bits over a wide
//!   range, so one scale of 1.0 serves keys and values of any layer, like vLLM's
//!   `--kv-cache-dtype fp8` without calibration: relative error per element ≤ 1/16.
//! - `int8` (any GPU XQA runs on, and ONNX Runtime's CPU provider) has 255 even levels over
//!   ±127·scale: keys and values beyond that are clipped. One scale must fit both, so it
//!   needs a measured range: `--kv-scale`, or `--calibrate`, which measures one scale per
//!   layer ([`KvCache::calibrated`], `ExportOptions::kv_layer_scales`).
//!
//! The cache type is part of the graph (its `past_key_values.*` inputs' type); the runtime
//! reads it from there and allocates the cache to match.

use crate::graph::DType;
use crate::ExportError;
use serde::{Deserialize, Serialize};

/// The GQA decoder's KV cache element type.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase", tag = "type")]
pub enum KvCache {
    /// The graph's activation type (float16 for fp16 graphs): exact.
    #[default]
    Activation,
    /// float8 E4M3, value = stored × `scale`.
    Fp8 { scale: f32 },
    /// int8, value = stored × `scale`.
    Int8 { scale: f32 },
}

/// The scale `--kv-cache fp8` uses without `--kv-scale`.
pub const FP8_DEFAULT_SCALE: f32 = 1.0;

/// The largest finite float8 E4M3 (fn) value.
pub const FP8_E4M3_MAX: f32 = 448.0;

/// Prefix (after `calib.`) of a calibration graph's key/value outputs: `kv_cache.{layer}.key`.
pub const CALIB_KV: &str = "kv_cache.";

/// The calibration output of layer `i`'s new keys or values (`[rows, head_dim]`, after
/// the norm and RoPE: what the cache stores), under [`crate::layers::CALIB_PREFIX`].
pub fn calib_name(i: usize, kv: crate::contract::Kv) -> String {
    let which = match kv {
        crate::contract::Kv::Key => "key",
        crate::contract::Kv::Value => "value",
    };
    format!("{CALIB_KV}{i}.{which}")
}

impl KvCache {
    /// Parses `--kv-cache` (`auto`, `fp8`, `int8`) with `--kv-scale`.
    pub fn parse(kind: &str, scale: Option<f32>) -> Result<KvCache, ExportError> {
        if let Some(s) = scale {
            if !(s.is_finite() && s > 0.0) {
                return Err(ExportError::Invalid(format!(
                    "--kv-scale must be a positive number, got {s}"
                )));
            }
        }
        match kind.trim() {
            "auto" | "fp16" | "activation" => match scale {
                None => Ok(KvCache::Activation),
                Some(_) => Err(ExportError::Invalid(
                    "--kv-scale applies to --kv-cache fp8 or int8 only".into(),
                )),
            },
            "fp8" => Ok(KvCache::Fp8 {
                scale: scale.unwrap_or(FP8_DEFAULT_SCALE),
            }),
            "int8" => match scale {
                Some(scale) => Ok(KvCache::Int8 { scale }),
                None => Err(ExportError::Invalid(
                    "--kv-cache int8 needs --kv-scale or --calibrate DIR: one scale per tensor \
                     (keys and values share it) clips everything beyond ±127 × scale, so it \
                     must come from a measured range; --kv-cache fp8 needs none"
                        .into(),
                )),
            },
            other => Err(ExportError::Invalid(format!(
                "unknown --kv-cache `{other}` (expected auto, fp8 or int8)"
            ))),
        }
    }

    /// `kind` (`fp8` or `int8`) with the scale that maps `absmax`, the largest |key| or
    /// |value| measured over calibration pages (`ocrctl export --calibrate`), to the type's
    /// largest value: nothing measured is clipped (as vLLM's `amax / max` KV scales).
    pub fn calibrated(kind: &str, absmax: f32) -> Result<KvCache, ExportError> {
        if !(absmax.is_finite() && absmax > 0.0) {
            return Err(ExportError::Invalid(format!(
                "--calibrate measured no usable key/value range (largest |x| {absmax})"
            )));
        }
        match KvCache::parse(kind, Some(1.0)).map(|kv| (kv, kv.largest_stored())) {
            Ok((kv, Some(top))) => Ok(kv.with_scale(absmax / top)),
            _ => Err(ExportError::Invalid(format!(
                "--kv-cache `{}` takes no calibrated scale (fp8 or int8 do)",
                kind.trim()
            ))),
        }
    }

    /// The largest magnitude the stored type holds (448 for fp8 E4M3, 127 for int8); `None`
    /// when not quantized.
    pub fn largest_stored(self) -> Option<f32> {
        match self {
            KvCache::Activation => None,
            KvCache::Fp8 { .. } => Some(FP8_E4M3_MAX),
            KvCache::Int8 { .. } => Some(127.0),
        }
    }

    /// The same 8-bit type with `scale` (the activation type has none: unchanged).
    pub fn with_scale(self, scale: f32) -> KvCache {
        match self {
            KvCache::Activation => KvCache::Activation,
            KvCache::Fp8 { .. } => KvCache::Fp8 { scale },
            KvCache::Int8 { .. } => KvCache::Int8 { scale },
        }
    }

    /// The scale of layer `i` of `n`: `layer_scales[i]` when given (checked: one positive
    /// finite scale per layer, for an 8-bit cache only), else this cache's one scale.
    pub fn layer_scale(
        self,
        layer_scales: &[f32],
        i: usize,
        n: usize,
    ) -> Result<Option<f32>, ExportError> {
        if layer_scales.is_empty() {
            return Ok(self.scale());
        }
        if self.scale().is_none() || layer_scales.len() != n {
            return Err(ExportError::Invalid(format!(
                "{} per-layer KV scales for a {} cache of {n} layers: one per layer of an \
                 8-bit cache",
                layer_scales.len(),
                self.name()
            )));
        }
        match layer_scales[i] {
            s if s.is_finite() && s > 0.0 => Ok(Some(s)),
            s => Err(ExportError::Invalid(format!(
                "the KV scale of layer {i} must be a positive number, got {s}"
            ))),
        }
    }

    /// Whether `kind` names an 8-bit cache (one whose scale `--calibrate` can measure).
    pub fn is_8bit_kind(kind: &str) -> bool {
        KvCache::parse(kind, Some(1.0)).is_ok_and(|kv| kv.largest_stored().is_some())
    }

    /// The stored element type, for graphs whose activations are `act`.
    pub fn dtype(self, act: DType) -> DType {
        match self {
            KvCache::Activation => act,
            KvCache::Fp8 { .. } => DType::F8E4M3,
            KvCache::Int8 { .. } => DType::I8,
        }
    }

    /// The quantization scale (`None`: not quantized).
    pub fn scale(self) -> Option<f32> {
        match self {
            KvCache::Activation => None,
            KvCache::Fp8 { scale } | KvCache::Int8 { scale } => Some(scale),
        }
    }

    /// `auto`, `fp8` or `int8`.
    pub fn name(self) -> &'static str {
        match self {
            KvCache::Activation => "auto",
            KvCache::Fp8 { .. } => "fp8",
            KvCache::Int8 { .. } => "int8",
        }
    }
}

/// How the GQA decoder stores its cache and lays out its query heads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GqaLayout<'a> {
    pub kv: KvCache,
    /// One scale per layer for an 8-bit cache (`ExportOptions::kv_layer_scales`); empty:
    /// `kv`'s scale for every layer.
    pub layer_scales: &'a [f32],
    /// Pads the query heads as an 8-bit cache does whatever the cache type (with the
    /// activation type's cache this checks the padding alone, exactly: tests).
    pub pad_query_heads: bool,
}

impl GqaLayout<'_> {
    /// Query heads per KV head in the attention node for a model of `group`: `group`, or
    /// for an 8-bit cache (or `pad_query_heads`) the group XQA takes ([`xqa_group`]).
    pub fn attention_group(self, group: usize) -> Result<usize, ExportError> {
        if self.kv == KvCache::Activation && !self.pad_query_heads {
            return Ok(group);
        }
        xqa_group(group).ok_or_else(|| {
            ExportError::Invalid(format!(
                "--kv-cache {}: the model has {group} query heads per KV head; ONNX Runtime's \
                 8-bit cache kernel takes at most 32",
                self.kv.name()
            ))
        })
    }
}

/// The smallest number of query heads per KV head that XQA's 8-bit path takes (4, 8, 16,
/// 32) and that holds `group`; `None` past 32.
pub fn xqa_group(group: usize) -> Option<usize> {
    [4, 8, 16, 32].into_iter().find(|&g| g >= group.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_layer_scales_are_one_positive_scale_per_layer_of_an_8bit_cache() {
        let int8 = KvCache::Int8 { scale: 0.5 };
        assert_eq!(int8.layer_scale(&[], 1, 2).unwrap(), Some(0.5));
        assert_eq!(int8.layer_scale(&[0.25, 0.5], 0, 2).unwrap(), Some(0.25));
        assert_eq!(KvCache::Activation.layer_scale(&[], 0, 2).unwrap(), None);
        let e = int8.layer_scale(&[0.25], 0, 2).unwrap_err().to_string();
        assert!(
            e.contains("1 per-layer KV scales") && e.contains("2 layers"),
            "{e}"
        );
        let e = KvCache::Activation
            .layer_scale(&[1.0, 1.0], 0, 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("8-bit"), "{e}");
        let e = int8
            .layer_scale(&[0.25, 0.0], 1, 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("layer 1 must be a positive number"), "{e}");
    }

    #[test]
    fn a_calibrated_scale_maps_the_measured_range_to_the_largest_value() {
        assert_eq!(
            KvCache::calibrated("int8", 63.5).unwrap(),
            KvCache::Int8 { scale: 0.5 }
        );
        assert_eq!(
            KvCache::calibrated(" fp8", 896.0).unwrap(),
            KvCache::Fp8 { scale: 2.0 }
        );
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let e = KvCache::calibrated("int8", bad).unwrap_err().to_string();
            assert!(e.contains("no usable key/value range"), "{e}");
        }
        let e = KvCache::calibrated("auto", 1.0).unwrap_err().to_string();
        assert!(e.contains("auto"), "{e}");
        assert!(KvCache::is_8bit_kind("int8") && KvCache::is_8bit_kind("fp8"));
        assert!(!KvCache::is_8bit_kind("auto") && !KvCache::is_8bit_kind("fp4"));
    }

    #[test]
    fn groups_round_up_to_what_xqa_takes() {
        assert_eq!(xqa_group(1), Some(4));
        assert_eq!(xqa_group(2), Some(4));
        assert_eq!(xqa_group(4), Some(4));
        assert_eq!(xqa_group(5), Some(8));
        assert_eq!(xqa_group(32), Some(32));
        assert_eq!(xqa_group(33), None);
        let layout = |kv, pad_query_heads| GqaLayout {
            kv,
            layer_scales: &[],
            pad_query_heads,
        };
        let fp8 = KvCache::Fp8 { scale: 1.0 };
        assert_eq!(
            layout(KvCache::Activation, false)
                .attention_group(2)
                .unwrap(),
            2
        );
        assert_eq!(
            layout(KvCache::Activation, true)
                .attention_group(2)
                .unwrap(),
            4
        );
        assert_eq!(layout(fp8, false).attention_group(2).unwrap(), 4);
        assert_eq!(layout(fp8, false).attention_group(8).unwrap(), 8);
        let e = layout(fp8, false)
            .attention_group(40)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--kv-cache fp8") && e.contains("40"), "{e}");
    }

    #[test]
    fn parse_names_what_is_wrong() {
        assert_eq!(KvCache::parse("auto", None).unwrap(), KvCache::Activation);
        assert_eq!(
            KvCache::parse("fp8", None).unwrap(),
            KvCache::Fp8 { scale: 1.0 }
        );
        assert_eq!(
            KvCache::parse("int8", Some(0.05)).unwrap(),
            KvCache::Int8 { scale: 0.05 }
        );
        let err = |k, s| KvCache::parse(k, s).unwrap_err().to_string();
        assert!(err("int8", None).contains("--kv-scale"));
        assert!(err("fp4", None).contains("fp4"));
        assert!(err("fp8", Some(0.0)).contains("--kv-scale"));
        assert!(err("fp8", Some(f32::NAN)).contains("--kv-scale"));
        assert!(err("auto", Some(1.0)).contains("--kv-scale"));
        assert_eq!(KvCache::Fp8 { scale: 1.0 }.dtype(DType::F16), DType::F8E4M3);
        assert_eq!(KvCache::Activation.dtype(DType::F16), DType::F16);
    }
}
