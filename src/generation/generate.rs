//! What every decoding path shares, over any [`Backend`]: the multimodal [`prefill`] (the
//! prompt's image-token rows of the embeddings replaced by the image features, transformers'
//! `masked_scatter`, then the decoder over the whole prompt), the result types and
//! the greedy choice with its top-K log-probabilities (log-softmax of float32 logits,
//! accumulated in float64). The engine ([`crate::generation::engine`]) decodes with them.

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

/// The multimodal prefill on the engine's thread (a stage's prefill shares its first half,
/// [`prompt_embeds`]): embeds `prompt_ids`, puts the image `features` (one `[N_i, hidden]` block per image, in prompt order) in place of the image
/// tokens and runs the decoder over the whole prompt. Returns the last position's logits and
/// the cache. A prompt with image tokens and no features is an error naming both counts.
pub fn prefill<B: Backend>(
    backend: &mut B,
    prompt_ids: &[u32],
    image_token_id: u32,
    features: &[Array2<f32>],
) -> Result<(Vec<f32>, B::Cache), BackendError> {
    prefill_resumed(backend, prompt_ids, image_token_id, features, &[])
}

/// [`prefill`] of a request that had generated `generated` before its cache was taken from
/// it (a paged cache's preemption by recompute): the prompt as [`prefill`] makes it, then the
/// generated tokens' embeddings (never image rows, whatever their ids), in one decoder run.
/// The logits are those the next decode step would have given.
pub fn prefill_resumed<B: Backend>(
    backend: &mut B,
    prompt_ids: &[u32],
    image_token_id: u32,
    features: &[Array2<f32>],
    generated: &[u32],
) -> Result<(Vec<f32>, B::Cache), BackendError> {
    let mut e = prompt_embeds(
        |ids| backend.embed(ids),
        prompt_ids,
        image_token_id,
        features,
    )?;
    if !generated.is_empty() {
        let g = backend.embed(generated)?;
        e = ndarray::concatenate(ndarray::Axis(0), &[e.view(), g.view()])
            .map_err(|err| BackendError::Invalid(format!("resumed prompt: {err}")))?;
    }
    backend.forward(e, None)
}

/// The decoder's input for a prompt: `embed` of the prompt's text ids, with the images'
/// features (all images' rows, in order) at the positions of the image tokens, as one
/// `[S, hidden]` array. Only the text ids are embedded (a page's prompt is a few dozen of
/// them beside thousands of image tokens, whose embeddings would be overwritten), and each
/// row is copied once. The counts and widths must match; errors name both.
pub fn prompt_embeds(
    embed: impl FnOnce(&[u32]) -> Result<Array2<f32>, BackendError>,
    prompt_ids: &[u32],
    image_token_id: u32,
    features: &[Array2<f32>],
) -> Result<Array2<f32>, BackendError> {
    let text: Vec<u32> = prompt_ids
        .iter()
        .copied()
        .filter(|t| *t != image_token_id)
        .collect();
    let image_rows = prompt_ids.len() - text.len();
    let feature_rows: usize = features.iter().map(|f| f.nrows()).sum();
    if image_rows != feature_rows {
        return Err(BackendError::Invalid(format!(
            "the prompt has {image_rows} image tokens (id {image_token_id}) but the vision encoder produced {feature_rows} features"
        )));
    }
    let text = match text.is_empty() {
        true => None,
        false => Some(embed(&text)?),
    };
    let width = match (&text, features.first()) {
        (Some(t), _) => t.ncols(),
        (None, Some(f)) => f.ncols(),
        (None, None) => 0,
    };
    if let Some(f) = features.iter().find(|f| f.ncols() != width) {
        return Err(BackendError::Invalid(format!(
            "image features have width {}, token embeddings {width}",
            f.ncols()
        )));
    }
    let mut data = Vec::with_capacity(prompt_ids.len() * width);
    let mut text_rows = text.iter().flat_map(|t| t.rows());
    let mut image_rows = features.iter().flat_map(|f| f.rows());
    for id in prompt_ids {
        // Both iterators hold exactly the rows counted above.
        let row = match *id == image_token_id {
            true => image_rows.next(),
            false => text_rows.next(),
        };
        match row.as_ref().and_then(|r| r.as_slice()) {
            Some(r) => data.extend_from_slice(r),
            None => data.extend(row.iter().flatten()),
        }
    }
    Array2::from_shape_vec((prompt_ids.len(), width), data)
        .map_err(|e| BackendError::Invalid(format!("prompt embeddings: {e}")))
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

    #[test]
    fn prompt_embeds_embed_the_text_ids_only_and_place_every_images_rows_in_order() {
        // Embedding of id t: [t, 10 t]; two images of 2 and 1 rows, image token 9.
        let asked = std::cell::RefCell::new(Vec::new());
        let embed = |ids: &[u32]| {
            asked.borrow_mut().extend_from_slice(ids);
            let d = ids
                .iter()
                .flat_map(|t| [*t as f32, *t as f32 * 10.0])
                .collect();
            Ok(Array2::from_shape_vec((ids.len(), 2), d).unwrap())
        };
        let a = Array2::from_shape_vec((2, 2), vec![-1.0, -2.0, -3.0, -4.0]).unwrap();
        let b = Array2::from_shape_vec((1, 2), vec![-5.0, -6.0]).unwrap();
        let ids = [1, 9, 9, 2, 9, 3];
        let e = prompt_embeds(embed, &ids, 9, &[a.clone(), b.clone()]).unwrap();
        assert_eq!(*asked.borrow(), vec![1, 2, 3]);
        let rows: Vec<Vec<f32>> = e.rows().into_iter().map(|r| r.to_vec()).collect();
        assert_eq!(
            rows,
            [
                [1., 10.],
                [-1., -2.],
                [-3., -4.],
                [2., 20.],
                [-5., -6.],
                [3., 30.]
            ]
        );
        // What merge_image_features gives on the whole prompt's embeddings.
        let mut whole = embed(&ids).unwrap();
        let all = ndarray::concatenate(ndarray::Axis(0), &[a.view(), b.view()]).unwrap();
        merge_image_features(&mut whole, &ids, 9, &all).unwrap();
        assert_eq!(e, whole);
        // Counts and widths are checked, naming both.
        let err = prompt_embeds(embed, &ids, 9, std::slice::from_ref(&a)).unwrap_err();
        assert!(err.to_string().contains("3 image tokens (id 9)"), "{err}");
        assert!(err.to_string().contains("produced 2 features"), "{err}");
        let wide = Array2::zeros((1, 3));
        let err = prompt_embeds(embed, &ids, 9, &[a, wide]).unwrap_err();
        assert!(
            err.to_string().contains("width 3, token embeddings 2"),
            "{err}"
        );
        // No image tokens and no features: the text's embeddings as they are.
        assert_eq!(
            prompt_embeds(embed, &[4, 5], 9, &[]).unwrap(),
            embed(&[4, 5]).unwrap()
        );
    }
}
