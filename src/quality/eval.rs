//! Teacher-forced comparison of two models on the same prompt (`ocrctl eval`).
//!
//! The reference decodes greedily for `steps` tokens (end-of-sequence ignored); the
//! candidate is fed the reference's tokens at every step, so both see the same prefixes.
//! Per image this gives: first-token top-1 agreement, per-step top-1 agreement, mean
//! KL(reference ‖ candidate) per step, the greedy agreement length (steps until the
//! candidate's argmax first differs, which equals the common prefix of the two free-running
//! greedy decodes), and the cosine similarity of the image features.

use crate::generation::generate::prefill;
use crate::model::preprocess::Pixels;
use crate::runtime::backend::{Backend, BackendError};
use serde::Serialize;

/// Agreement figures for one image.
#[derive(Debug, Clone, Serialize)]
pub struct ImageEval {
    pub steps: usize,
    pub first_token_agrees: bool,
    pub top1_agreement: f64,
    pub mean_kl: f64,
    pub greedy_agreement: usize,
    pub feature_cosine: f64,
}

/// Log-softmax in float64.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let lse = crate::generation::generate::log_sum_exp(logits);
    logits.iter().map(|v| *v as f64 - lse).collect()
}

/// KL(p ‖ q) from log-probabilities.
pub fn kl(logp: &[f64], logq: &[f64]) -> f64 {
    logp.iter()
        .zip(logq)
        .map(|(p, q)| p.exp() * (p - q))
        .sum::<f64>()
        .max(0.0)
}

/// Cosine similarity of two equally long vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        return if na == nb { 1.0 } else { 0.0 };
    }
    dot / (na * nb)
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

/// Compares `candidate` against `reference` on one preprocessed image.
pub fn compare<R: Backend, C: Backend>(
    reference: &mut R,
    candidate: &mut C,
    pixel_values: &Pixels,
    prompt: &[u32],
    image_token_id: u32,
    steps: usize,
) -> Result<ImageEval, BackendError> {
    let rf = reference.encode_image(pixel_values)?;
    let cf = candidate.encode_image(pixel_values)?;
    if rf.shape() != cf.shape() {
        return Err(BackendError::Invalid(format!(
            "image features differ in shape: reference {:?}, candidate {:?}",
            rf.shape(),
            cf.shape()
        )));
    }
    let (a, b): (Vec<f32>, Vec<f32>) = (rf.iter().copied().collect(), cf.iter().copied().collect());
    let feature_cosine = cosine(&a, &b);
    let (mut rl, mut rc) = prefill(reference, prompt, image_token_id, std::slice::from_ref(&rf))?;
    let (mut cl, mut cc) = prefill(candidate, prompt, image_token_id, std::slice::from_ref(&cf))?;
    let (mut agree, mut kl_sum, mut greedy) = (0usize, 0f64, None);
    let mut first = false;
    for step in 0..steps {
        let token = argmax(&rl);
        let same = argmax(&cl) == token;
        if step == 0 {
            first = same;
        }
        if same {
            agree += 1;
        } else if greedy.is_none() {
            greedy = Some(step);
        }
        kl_sum += kl(&log_softmax(&rl), &log_softmax(&cl));
        if step + 1 == steps {
            break;
        }
        let re = reference.embed(&[token as u32])?;
        let ce = candidate.embed(&[token as u32])?;
        let (l, c) = reference.forward(re, Some(rc))?;
        (rl, rc) = (l, c);
        let (l, c) = candidate.forward(ce, Some(cc))?;
        (cl, cc) = (l, c);
    }
    Ok(ImageEval {
        steps,
        first_token_agrees: first,
        top1_agreement: agree as f64 / steps.max(1) as f64,
        mean_kl: kl_sum / steps.max(1) as f64,
        greedy_agreement: greedy.unwrap_or(steps),
        feature_cosine,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_and_cosine_basics() {
        let p = log_softmax(&[1.0, 2.0, 3.0]);
        assert!(kl(&p, &p).abs() < 1e-12);
        let q = log_softmax(&[3.0, 2.0, 1.0]);
        assert!(kl(&p, &q) > 0.5);
        assert!((p.iter().map(|x| x.exp()).sum::<f64>() - 1.0).abs() < 1e-12);
        assert!((cosine(&[1.0, 0.0], &[2.0, 0.0]) - 1.0).abs() < 1e-12);
        assert!(cosine(&[1.0, 0.0], &[0.0, 1.0]).abs() < 1e-12);
    }
}
