//! Activation-aware INT4 scaling (AWQ-style) from calibration statistics.
//!
//! For a group of Linears sharing one input `x` (q/k/v after a norm, gate/up after a norm,
//! or down after gate·up), a per-input-channel scale `s = mean|x|^α` (normalised so that
//! `√(max·min) = 1`) multiplies the weights' input channels before round-to-nearest INT4,
//! and `1/s` is folded into what produces `x`: the preceding RMSNorm's weight, or the
//! output rows of `up_proj` for `down_proj`. The product is unchanged in exact arithmetic;
//! only the quantization error moves to channels with small activations. α is searched on
//! a grid per group, minimising `Σ_k E[x_k²] Σ_n (W_kn − Ŵ_kn)²` (the layer's expected output
//! error with a diagonal input covariance); α = 0 is plain round-to-nearest, so the chosen
//! scale is never worse than RTN on this measure.
//!
//! Linears with no such producer (attention `o_proj`, the projector, the lm_head) stay
//! round-to-nearest. Ports the idea of Lin et al., "AWQ" (2023), not its code.

use crate::checkpoint::Weights;
use crate::config::ModelConfig;
use crate::quant;
use crate::ExportError;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Per-input-channel statistics of one Linear's input over the calibration data.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChannelStats {
    pub mean_abs: Vec<f32>,
    pub mean_sq: Vec<f32>,
    /// Number of activation rows (tokens or patches) seen.
    pub rows: u64,
}

/// Statistics keyed by the Linear's weight name.
pub type ActivationStats = BTreeMap<String, ChannelStats>;

/// The α grid searched per group.
pub const ALPHA_GRID: [f32; 11] = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

/// Linears sharing one input, and where the inverse scale is folded.
#[derive(Debug, Clone)]
struct Group {
    /// Weights (`[out, in]`) whose input channels are scaled by `s`.
    weights: Vec<(String, usize)>,
    /// Width of the shared input.
    k: usize,
    /// A norm weight divided by `s`, or an `[k, in]` weight whose rows are divided by `s`.
    fold: Fold,
}

#[derive(Debug, Clone)]
enum Fold {
    Norm(String),
    Rows(String),
}

fn groups(cfg: &ModelConfig) -> Vec<Group> {
    let mut g = Vec::new();
    let v = &cfg.vision;
    for i in 0..v.num_layers {
        let p = format!("{}.transformer.layers.{i}", crate::vision::ENCODER);
        let inner = v.num_heads * v.head_dim;
        g.push(Group {
            weights: ["q", "k", "v"]
                .iter()
                .map(|n| (format!("{p}.attention.{n}_proj.weight"), inner))
                .collect(),
            k: v.hidden_size,
            fold: Fold::Norm(format!("{p}.attention_norm.weight")),
        });
        g.push(Group {
            weights: ["gate", "up"]
                .iter()
                .map(|n| {
                    (
                        format!("{p}.feed_forward.{n}_proj.weight"),
                        v.intermediate_size,
                    )
                })
                .collect(),
            k: v.hidden_size,
            fold: Fold::Norm(format!("{p}.ffn_norm.weight")),
        });
        g.push(Group {
            weights: vec![(format!("{p}.feed_forward.down_proj.weight"), v.hidden_size)],
            k: v.intermediate_size,
            fold: Fold::Rows(format!("{p}.feed_forward.up_proj.weight")),
        });
    }
    let t = &cfg.text;
    for i in 0..t.num_layers {
        let p = format!("{}.layers.{i}", crate::decoder::PREFIX);
        g.push(Group {
            weights: vec![
                (
                    format!("{p}.self_attn.q_proj.weight"),
                    t.num_heads * t.head_dim,
                ),
                (
                    format!("{p}.self_attn.k_proj.weight"),
                    t.num_kv_heads * t.head_dim,
                ),
                (
                    format!("{p}.self_attn.v_proj.weight"),
                    t.num_kv_heads * t.head_dim,
                ),
            ],
            k: t.hidden_size,
            fold: Fold::Norm(format!("{p}.input_layernorm.weight")),
        });
        g.push(Group {
            weights: ["gate", "up"]
                .iter()
                .map(|n| (format!("{p}.mlp.{n}_proj.weight"), t.intermediate_size))
                .collect(),
            k: t.hidden_size,
            fold: Fold::Norm(format!("{p}.post_attention_layernorm.weight")),
        });
        g.push(Group {
            weights: vec![(format!("{p}.mlp.down_proj.weight"), t.hidden_size)],
            k: t.intermediate_size,
            fold: Fold::Rows(format!("{p}.mlp.up_proj.weight")),
        });
    }
    g
}

/// The chosen α and the proxy errors for one group (for reports and the manifest).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupChoice {
    pub first_weight: String,
    pub alpha: f32,
    pub rtn_error: f64,
    pub awq_error: f64,
}

/// Scales to apply, computed by [`plan`].
#[derive(Debug, Clone, Default)]
pub struct AwqPlan {
    col_scale: HashMap<String, Vec<f32>>,
    norm_div: HashMap<String, Vec<f32>>,
    row_div: HashMap<String, Vec<f32>>,
    pub choices: Vec<GroupChoice>,
}

/// `Σ_k m2_k Σ_n (W_kn − deq(quant(W·s))_kn / s_k)²` for `wt` = `[k, n]`.
fn proxy_error(wt: &[f32], k: usize, n: usize, bs: usize, s: &[f32], m2: &[f32]) -> f64 {
    let scaled: Vec<f32> = (0..k * n).map(|i| wt[i] * s[i / n]).collect();
    let deq = quant::quantize(&scaled, k, n, bs).dequantize();
    let mut err = 0f64;
    for r in 0..k {
        let mut row = 0f64;
        for c in 0..n {
            let d = (wt[r * n + c] - deq[r * n + c] / s[r]) as f64;
            row += d * d;
        }
        err += m2[r] as f64 * row;
    }
    err
}

fn scales_for(mean_abs: &[f32], alpha: f32) -> Vec<f32> {
    let s: Vec<f32> = mean_abs
        .iter()
        .map(|m| m.max(1e-8).powf(alpha).clamp(1e-4, 1e4))
        .collect();
    let (mx, mn) = s
        .iter()
        .fold((f32::MIN, f32::MAX), |(a, b), x| (a.max(*x), b.min(*x)));
    let norm = (mx * mn).sqrt();
    s.iter().map(|x| x / norm).collect()
}

/// Searches α per group; `stats` must hold every group's first weight.
pub fn plan(
    cfg: &ModelConfig,
    w: &dyn Weights,
    stats: &ActivationStats,
    block_size: usize,
) -> Result<AwqPlan, ExportError> {
    let mut plan = AwqPlan::default();
    for g in groups(cfg) {
        let key = &g.weights[0].0;
        let st = stats.get(key).ok_or_else(|| {
            ExportError::Invalid(format!("calibration statistics lack the input of `{key}`"))
        })?;
        if st.mean_abs.len() != g.k || st.mean_sq.len() != g.k {
            return Err(ExportError::Invalid(format!(
                "calibration statistics for `{key}` have width {}, expected {}",
                st.mean_abs.len(),
                g.k
            )));
        }
        let mats: Vec<(Vec<f32>, usize)> = g
            .weights
            .iter()
            .map(|(name, out)| {
                w.get(name, &[*out, g.k])
                    .map(|v| (crate::layers::transpose(&v, *out, g.k), *out))
            })
            .collect::<Result<_, _>>()?;
        let mut best = (0f32, f64::INFINITY, Vec::new());
        let mut rtn = 0f64;
        for alpha in ALPHA_GRID {
            let s = scales_for(&st.mean_abs, alpha);
            let err: f64 = mats
                .iter()
                .map(|(wt, n)| proxy_error(wt, g.k, *n, block_size, &s, &st.mean_sq))
                .sum();
            if alpha == 0.0 {
                rtn = err;
            }
            if err < best.1 {
                best = (alpha, err, s);
            }
        }
        plan.choices.push(GroupChoice {
            first_weight: key.clone(),
            alpha: best.0,
            rtn_error: rtn,
            awq_error: best.1,
        });
        if best.0 == 0.0 {
            continue;
        }
        for (name, _) in &g.weights {
            plan.col_scale.insert(name.clone(), best.2.clone());
        }
        match g.fold {
            Fold::Norm(n) => plan.norm_div.insert(n, best.2),
            Fold::Rows(n) => plan.row_div.insert(n, best.2),
        };
    }
    Ok(plan)
}

/// Weights with an [`AwqPlan`] applied: scaled Linear inputs, compensated producers.
pub struct AwqWeights<'a> {
    pub inner: &'a dyn Weights,
    pub plan: &'a AwqPlan,
}

impl Weights for AwqWeights<'_> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ExportError> {
        let mut v = self.inner.get(name, shape)?;
        if let Some(s) = self.plan.col_scale.get(name) {
            let inp = shape[1];
            for (i, x) in v.iter_mut().enumerate() {
                *x *= s[i % inp];
            }
        }
        if let Some(s) = self.plan.norm_div.get(name) {
            for (x, d) in v.iter_mut().zip(s) {
                *x /= d;
            }
        }
        if let Some(s) = self.plan.row_div.get(name) {
            let inp = shape[1];
            for (i, x) in v.iter_mut().enumerate() {
                *x /= s[i / inp];
            }
        }
        Ok(v)
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }

    fn source_dtype(&self) -> String {
        self.inner.source_dtype()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_moves_error_to_quiet_channels_and_never_loses_to_rtn() {
        // Channel 0 carries large activations and small weights; the others are quiet.
        let (k, n, bs) = (32, 8, 32);
        let mut wt = vec![0f32; k * n];
        for r in 0..k {
            for c in 0..n {
                wt[r * n + c] = if r == 0 {
                    0.01
                } else {
                    ((r * 7 + c * 3) % 11) as f32 / 11.0 - 0.5
                };
            }
        }
        let mut mean_abs = vec![0.05f32; k];
        mean_abs[0] = 50.0;
        let m2: Vec<f32> = mean_abs.iter().map(|m| m * m).collect();
        let rtn = proxy_error(&wt, k, n, bs, &vec![1.0; k], &m2);
        let best = ALPHA_GRID
            .iter()
            .map(|a| proxy_error(&wt, k, n, bs, &scales_for(&mean_abs, *a), &m2))
            .fold(f64::INFINITY, f64::min);
        assert!(best < rtn * 0.5, "awq {best} vs rtn {rtn}");
    }

    #[test]
    fn wrapped_weights_keep_the_product() {
        let s = vec![2.0f32, 0.5];
        let mut plan = AwqPlan::default();
        plan.col_scale.insert("lin".into(), s.clone());
        plan.norm_div.insert("norm".into(), s.clone());
        let a = AwqWeights {
            inner: &crate::checkpoint::CountingWeights,
            plan: &plan,
        };
        let norm = a.get("norm", &[2]).unwrap();
        let lin = a.get("lin", &[3, 2]).unwrap();
        // (x ⊙ norm/s) · (W ⊙ s)ᵀ == (x ⊙ norm) · Wᵀ
        let x = [0.3f32, -1.2];
        for o in 0..3 {
            let got: f32 = (0..2).map(|i| x[i] * norm[i] * lin[o * 2 + i]).sum();
            let want: f32 = (0..2)
                .map(|i| x[i] * (i as f32 + 1.0) * (o * 2 + i) as f32 + x[i] * (i as f32 + 1.0))
                .sum();
            assert!((got - want).abs() < 1e-4, "{got} vs {want}");
        }
    }
}
