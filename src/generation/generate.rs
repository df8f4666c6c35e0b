//! Greedy generation for one request over any [`Backend`].
//!
//! The prompt's image-token rows of the embeddings are replaced by the image features
//! (transformers' `masked_scatter`), the decoder runs a prefill then one token per step,
//! and every step records the top-K log-probabilities (log-softmax of float32 logits,
//! accumulated in float64).

use crate::runtime::backend::{Backend, BackendError};
use ndarray::Array2;
use serde::Serialize;

/// One candidate token and its log-probability.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// A stop id was produced (it is included in `token_ids`).
    Stop,
    /// `max_new_tokens` was reached.
    Length,
    /// The loop guard saw the output repeating itself and stopped it.
    Repetition,
}

/// Settings for [`generate_greedy`].
#[derive(Debug, Clone)]
pub struct GreedyOptions {
    pub max_new_tokens: usize,
    /// How many top log-probabilities to record per step (0 = none).
    pub top_logprobs: usize,
    /// Token ids that end generation (from `generation_config.json` / `config.json`).
    pub stop_ids: Vec<u32>,
    /// Keep generating past stop ids (benchmarks, parity tests).
    pub ignore_eos: bool,
}

/// The result of one request.
#[derive(Debug, Clone, Serialize)]
pub struct Generation {
    pub token_ids: Vec<u32>,
    /// The chosen tokens' log-probabilities, when asked for (else empty).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<f32>,
    pub top_logprobs: Vec<Vec<TokenLogprob>>,
    pub finish_reason: FinishReason,
}

/// Stop ids of an exported model: `generation_config.json`'s `eos_token_id` (a number or a
/// list) if the file has one, else `fallback` (the config's).
pub fn stop_ids(model_dir: &std::path::Path, fallback: &[u32]) -> Vec<u32> {
    let from_gen = std::fs::read_to_string(model_dir.join("generation_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| match v.get("eos_token_id") {
            Some(serde_json::Value::Array(a)) => Some(
                a.iter()
                    .filter_map(|x| x.as_u64().map(|n| n as u32))
                    .collect(),
            ),
            Some(x) => x.as_u64().map(|n| vec![n as u32]),
            None => None,
        });
    from_gen
        .filter(|v: &Vec<u32>| !v.is_empty())
        .unwrap_or_else(|| fallback.to_vec())
}

/// Replaces the rows of `embeds` at positions where `ids == image_token_id` with the rows
/// of `features`, in order. The counts must match.
pub fn merge_image_features(
    embeds: &mut Array2<f32>,
    ids: &[u32],
    image_token_id: u32,
    features: &Array2<f32>,
) -> Result<(), BackendError> {
    let positions: Vec<usize> = ids
        .iter()
        .enumerate()
        .filter(|(_, t)| **t == image_token_id)
        .map(|(i, _)| i)
        .collect();
    if positions.len() != features.nrows() {
        return Err(BackendError::Invalid(format!(
            "the prompt has {} image tokens (id {image_token_id}) but the vision encoder produced {} features",
            positions.len(),
            features.nrows()
        )));
    }
    if features.ncols() != embeds.ncols() {
        return Err(BackendError::Invalid(format!(
            "image features have width {}, token embeddings {}",
            features.ncols(),
            embeds.ncols()
        )));
    }
    for (row, pos) in positions.into_iter().enumerate() {
        embeds.row_mut(pos).assign(&features.row(row));
    }
    Ok(())
}

/// `log Σ exp(logits)`, accumulated in float64 after subtracting the maximum.
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    max + logits
        .iter()
        .map(|v| (*v as f64 - max).exp())
        .sum::<f64>()
        .ln()
}

/// Index of the largest logit (the first one on ties, as `torch.argmax`) and the `k` most
/// likely tokens with their log-probabilities, most likely first.
pub fn argmax_and_top_k(logits: &[f32], k: usize) -> (u32, Vec<TokenLogprob>) {
    let mut best = 0usize;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    if k == 0 {
        return (best as u32, Vec::new());
    }
    let lse = log_sum_exp(logits);
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    let k = k.min(logits.len());
    idx.select_nth_unstable_by(k - 1, |a, b| {
        logits[*b].total_cmp(&logits[*a]).then(a.cmp(b))
    });
    idx.truncate(k);
    idx.sort_by(|a, b| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b)));
    let top = idx
        .into_iter()
        .map(|i| TokenLogprob {
            id: i as u32,
            logprob: (logits[i] as f64 - lse) as f32,
        })
        .collect();
    (best as u32, top)
}

/// Greedy decoding of `prompt_ids` with optional image features merged in.
pub fn generate_greedy<B: Backend>(
    backend: &mut B,
    prompt_ids: &[u32],
    image_token_id: u32,
    image_features: Option<&Array2<f32>>,
    opts: &GreedyOptions,
) -> Result<Generation, BackendError> {
    let mut embeds = backend.embed(prompt_ids)?;
    if let Some(f) = image_features {
        merge_image_features(&mut embeds, prompt_ids, image_token_id, f)?;
    }
    let mut out = Generation {
        token_ids: Vec::new(),
        logprobs: Vec::new(),
        top_logprobs: Vec::new(),
        finish_reason: FinishReason::Length,
    };
    if opts.max_new_tokens == 0 {
        return Ok(out);
    }
    let (mut logits, mut cache) = backend.forward(embeds, None)?;
    loop {
        let (next, top) = argmax_and_top_k(&logits, opts.top_logprobs);
        out.token_ids.push(next);
        if opts.top_logprobs > 0 {
            out.top_logprobs.push(top);
        }
        if !opts.ignore_eos && opts.stop_ids.contains(&next) {
            out.finish_reason = FinishReason::Stop;
            break;
        }
        if out.token_ids.len() >= opts.max_new_tokens {
            break;
        }
        let e = backend.embed(&[next])?;
        let (l, c) = backend.forward(e, Some(cache))?;
        logits = l;
        cache = c;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_is_sorted_and_normalised() {
        let logits = [1.0f32, 3.0, 3.0, -2.0, 0.5];
        let (best, top) = argmax_and_top_k(&logits, 3);
        assert_eq!(best, 1, "first maximum wins ties");
        assert_eq!(top.iter().map(|t| t.id).collect::<Vec<_>>(), vec![1, 2, 0]);
        let z: f64 = logits.iter().map(|v| (*v as f64).exp()).sum();
        assert!((top[0].logprob as f64 - (3.0 - z.ln())).abs() < 1e-6);
    }

    /// A fake model whose next token is (last input token + 1) mod vocab, counting calls.
    struct Counter {
        vocab: usize,
        forwards: usize,
    }

    impl Backend for Counter {
        type Cache = usize;
        fn hidden_size(&self) -> usize {
            1
        }
        fn encode_image(&mut self, _: &ndarray::Array4<f32>) -> Result<Array2<f32>, BackendError> {
            unreachable!()
        }
        fn embed(&mut self, ids: &[u32]) -> Result<Array2<f32>, BackendError> {
            Ok(Array2::from_shape_fn((ids.len(), 1), |(i, _)| {
                ids[i] as f32
            }))
        }
        fn forward(
            &mut self,
            e: Array2<f32>,
            cache: Option<usize>,
        ) -> Result<(Vec<f32>, usize), BackendError> {
            self.forwards += 1;
            let last = e[[e.nrows() - 1, 0]] as usize;
            let mut l = vec![0.0; self.vocab];
            l[(last + 1) % self.vocab] = 5.0;
            Ok((l, cache.unwrap_or(0) + e.nrows()))
        }
    }

    #[test]
    fn greedy_stops_on_stop_ids_unless_ignored() {
        let mut b = Counter {
            vocab: 10,
            forwards: 0,
        };
        let mut opts = GreedyOptions {
            max_new_tokens: 20,
            top_logprobs: 2,
            stop_ids: vec![7],
            ignore_eos: false,
        };
        let g = generate_greedy(&mut b, &[3, 4], 99, None, &opts).unwrap();
        assert_eq!(g.token_ids, vec![5, 6, 7]);
        assert_eq!(g.finish_reason, FinishReason::Stop);
        assert_eq!(g.top_logprobs.len(), 3);
        assert_eq!(b.forwards, 3);
        opts.ignore_eos = true;
        opts.max_new_tokens = 5;
        let g = generate_greedy(&mut b, &[3, 4], 99, None, &opts).unwrap();
        assert_eq!(g.token_ids, vec![5, 6, 7, 8, 9]);
        assert_eq!(g.finish_reason, FinishReason::Length);
    }

    #[test]
    fn image_rows_are_replaced_in_order_and_counts_checked() {
        let mut e = Array2::zeros((4, 2));
        let f = Array2::from_shape_vec((2, 2), vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        merge_image_features(&mut e, &[5, 9, 9, 6], 9, &f).unwrap();
        assert_eq!(e.row(1).to_vec(), vec![1.0, 2.0]);
        assert_eq!(e.row(2).to_vec(), vec![3.0, 4.0]);
        assert_eq!(e.row(0).to_vec(), vec![0.0, 0.0]);
        let err = merge_image_features(&mut e, &[9, 1, 1, 1], 9, &f).unwrap_err();
        assert!(err.to_string().contains("1 image tokens"), "{err}");
    }
}
