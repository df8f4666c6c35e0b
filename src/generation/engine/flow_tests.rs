//! Requests flowing through the engine (`src/generation/engine.rs`) on a successor fake:
//! images merged in prompt order, finish and cancel leaving the batch, the chosen
//! log-probability reported outside the top list.

use super::*;
use crate::runtime::fake::{image, FakeBackend};

/// Next token = (last input + 1) mod 50; an image contributes its width as a feature, so
/// merged image rows are visible in the output.
fn engine() -> Engine<FakeBackend> {
    Engine::new(FakeBackend::successor(50).peak(3.0), 4, 9)
}

#[test]
fn images_are_merged_in_prompt_order() {
    let mut r = GenRequest::text(vec![1, 9, 9], 2);
    r.images = vec![image(20), image(30)];
    let out = engine().run(vec![r], &mut |_| {});
    // The last prompt row is the second image's feature (30) → 31, 32.
    assert_eq!(out[0].as_ref().unwrap().token_ids, vec![31, 32]);
    let mut bad = GenRequest::text(vec![1, 9, 9], 2);
    bad.images = vec![image(20)];
    let out = engine().run(vec![bad], &mut |_| {});
    assert!(
        out[0]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("2 image tokens"),
        "{out:?}"
    );
}

#[test]
fn finish_and_cancel_leave_the_batch_and_others_continue() {
    let mut e = engine();
    let mut batch = Batch::new();
    let mut done: Vec<(usize, Result<Generation, EngineError>)> = Vec::new();
    let mut seen = [0usize; 3];
    for i in 0..3 {
        e.admit(
            &mut batch,
            i,
            GenRequest::text(vec![10 * i as u32], 6),
            &mut |_| Flow::Continue,
        );
    }
    assert_eq!(batch.indices(), vec![0, 1, 2]);
    while !batch.is_empty() {
        e.step(&mut batch, &mut |ev| match ev {
            Event::Token { index, .. } => {
                seen[index] += 1;
                match (index, seen[index]) {
                    (0, 2) => Flow::Finish,
                    (1, 3) => Flow::Cancel,
                    _ => Flow::Continue,
                }
            }
            Event::Done { index, result } => {
                done.push((index, result.clone()));
                Flow::Continue
            }
        });
    }
    done.sort_by_key(|d| d.0);
    let g0 = done[0].1.as_ref().unwrap();
    assert_eq!(g0.token_ids, vec![1, 2]);
    assert_eq!(g0.finish_reason, FinishReason::Stop);
    assert_eq!(done[1].1.as_ref().unwrap_err(), &EngineError::Cancelled);
    let g2 = done[2].1.as_ref().unwrap();
    assert_eq!(g2.token_ids, vec![21, 22, 23, 24, 25, 26]);
    assert_eq!(g2.finish_reason, FinishReason::Length);
}

#[test]
fn chosen_logprob_is_reported_even_outside_the_top_k() {
    let mut r = GenRequest::text(vec![4], 1);
    r.logprobs = true;
    r.params.temperature = 50.0; // nearly uniform: usually not the argmax
    r.params.seed = Some(3);
    let out = engine().run(vec![r], &mut |_| {});
    let g = out[0].as_ref().unwrap();
    let mut l = vec![0.0f32; 50];
    l[5] = 3.0;
    assert_eq!(g.logprobs.len(), 1);
    assert!((g.logprobs[0] - logprob_of(&l, g.token_ids[0])).abs() < 1e-6);
    let z: f64 = l.iter().map(|v| (*v as f64).exp()).sum();
    assert!((logprob_of(&l, 5) as f64 - (3.0 - z.ln())).abs() < 1e-6);
}
