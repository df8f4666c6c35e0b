//! Fuzzes the sampler: parameters and logits straight from the fuzzer's bytes. Whatever
//! `validate` accepts must give an id inside the vocabulary and a log-probability that is not
//! NaN, and never panic (issue 10.1: one request's parameters once killed the engine thread).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ocrctl::generation::sampling::{Sampler, SamplingParams};

fn f32_at(data: &[u8], i: usize) -> f32 {
    let b: [u8; 4] = std::array::from_fn(|k| data.get(i * 4 + k).copied().unwrap_or(0));
    f32::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 24 {
        return;
    }
    let params = SamplingParams {
        temperature: f32_at(data, 0),
        top_p: f32_at(data, 1),
        top_k: u16::from_le_bytes([data[8], data[9]]) as usize,
        repetition_penalty: f32_at(data, 3),
        seed: Some(u64::from(data[16])),
        loop_guard: None,
    };
    let Ok(mut s) = Sampler::new(params) else {
        return;
    };
    let rest = &data[20..];
    let mut logits: Vec<f32> = (0..rest.len() / 4).map(|i| f32_at(rest, i)).collect();
    if logits.is_empty() {
        return;
    }
    let history: Vec<u32> = rest.iter().take(16).map(|&b| u32::from(b)).collect();
    let t = s.next_with_logprob(&mut logits, &history);
    assert!((t.id as usize) < logits.len());
    assert!(!t.logprob.is_nan());
});
