//! Continuous batching over any [`Backend`]: requests join and leave a decode batch.
//!
//! Each step admits waiting requests while fewer than `max_batch` are active (prefill: image
//! features, embeddings with the image rows replaced, decoder over the prompt, batch 1 —
//! images differ in size), then picks one token per active request with its own
//! [`Sampler`], retires finished ones (stop id, `max_new_tokens`, or the loop guard), and
//! runs one padded decoder step for all the rest ([`Backend::decode_batch`]). Log-probabilities
//! are those of the raw model distribution (before penalties and temperature), as vLLM
//! reports them. A request that fails during its prefill fails alone.

use crate::backend::{Backend, BackendError};
use crate::generate::{
    argmax_and_top_k, merge_image_features, FinishReason, Generation, TokenLogprob,
};
use crate::sampling::{Sampler, SamplingParams};
use ndarray::Array4;

/// One generation request.
#[derive(Debug, Clone)]
pub struct GenRequest {
    pub prompt_ids: Vec<u32>,
    /// `[1, 3, H, W]` pixel values of the request's image, if any.
    pub pixel_values: Option<Array4<f32>>,
    pub params: SamplingParams,
    pub max_new_tokens: usize,
    pub stop_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Top log-probabilities recorded per step (0 = none).
    pub top_logprobs: usize,
}

/// Something that happened to request `index` (its position in the submitted list).
#[derive(Debug, Clone)]
pub enum Event<'a> {
    /// A token was generated.
    Token {
        index: usize,
        id: u32,
        top: &'a [TokenLogprob],
    },
    /// The request finished (successfully or not).
    Done {
        index: usize,
        result: &'a Result<Generation, String>,
    },
}

struct Active<C> {
    index: usize,
    req: GenRequest,
    sampler: Sampler,
    logits: Vec<f32>,
    cache: C,
    out: Generation,
}

/// The scheduler. `max_batch` bounds how many requests decode together.
pub struct Engine<B: Backend> {
    pub backend: B,
    pub max_batch: usize,
    pub image_token_id: u32,
}

impl<B: Backend> Engine<B> {
    fn prefill(&mut self, req: &GenRequest) -> Result<(Vec<f32>, B::Cache), BackendError> {
        let mut e = self.backend.embed(&req.prompt_ids)?;
        if let Some(p) = &req.pixel_values {
            let f = self.backend.encode_image(p)?;
            merge_image_features(&mut e, &req.prompt_ids, self.image_token_id, &f)?;
        }
        self.backend.forward(e, None)
    }

    /// Runs all `requests` to completion, pulling them lazily (at most `max_batch` are
    /// held at once); `on_event` sees every token and completion. Results are in request
    /// order.
    pub fn run(
        &mut self,
        requests: impl IntoIterator<Item = GenRequest>,
        on_event: &mut dyn FnMut(Event),
    ) -> Vec<Result<Generation, String>> {
        let mut results: Vec<Option<Result<Generation, String>>> = Vec::new();
        let mut pending = requests.into_iter().enumerate().peekable();
        let mut active: Vec<Active<B::Cache>> = Vec::new();
        let max_batch = self.max_batch.max(1);
        let finish = |results: &mut Vec<Option<Result<Generation, String>>>,
                      index: usize,
                      r: Result<Generation, String>,
                      on_event: &mut dyn FnMut(Event)| {
            on_event(Event::Done { index, result: &r });
            if results.len() <= index {
                results.resize_with(index + 1, || None);
            }
            results[index] = Some(r);
        };
        while pending.peek().is_some() || !active.is_empty() {
            while active.len() < max_batch {
                let Some((index, req)) = pending.next() else {
                    break;
                };
                if results.len() <= index {
                    results.resize_with(index + 1, || None);
                }
                let sampler = match Sampler::new(req.params.clone()) {
                    Ok(s) => s,
                    Err(e) => {
                        finish(&mut results, index, Err(e.to_string()), on_event);
                        continue;
                    }
                };
                if req.max_new_tokens == 0 {
                    let g = Generation {
                        token_ids: vec![],
                        top_logprobs: vec![],
                        finish_reason: FinishReason::Length,
                    };
                    finish(&mut results, index, Ok(g), on_event);
                    continue;
                }
                match self.prefill(&req) {
                    Ok((logits, cache)) => active.push(Active {
                        index,
                        req,
                        sampler,
                        logits,
                        cache,
                        out: Generation {
                            token_ids: vec![],
                            top_logprobs: vec![],
                            finish_reason: FinishReason::Length,
                        },
                    }),
                    Err(e) => finish(&mut results, index, Err(e.to_string()), on_event),
                }
            }
            if active.is_empty() {
                continue;
            }
            // Choose a token for every active request; retire the finished ones.
            let mut keep = Vec::with_capacity(active.len());
            for mut a in active.drain(..) {
                let (_, top) = argmax_and_top_k(&a.logits, a.req.top_logprobs);
                let id = a.sampler.next(&mut a.logits, &a.out.token_ids);
                a.out.token_ids.push(id);
                on_event(Event::Token {
                    index: a.index,
                    id,
                    top: &top,
                });
                if a.req.top_logprobs > 0 {
                    a.out.top_logprobs.push(top);
                }
                let stop = !a.req.ignore_eos && a.req.stop_ids.contains(&id);
                if stop {
                    a.out.finish_reason = FinishReason::Stop;
                } else if a.sampler.loop_detected(&a.out.token_ids) {
                    a.out.finish_reason = FinishReason::Repetition;
                }
                if stop
                    || a.out.finish_reason == FinishReason::Repetition
                    || a.out.token_ids.len() >= a.req.max_new_tokens
                {
                    let out = std::mem::replace(
                        &mut a.out,
                        Generation {
                            token_ids: vec![],
                            top_logprobs: vec![],
                            finish_reason: FinishReason::Length,
                        },
                    );
                    finish(&mut results, a.index, Ok(out), on_event);
                } else {
                    keep.push(a);
                }
            }
            if keep.is_empty() {
                continue;
            }
            let tokens: Vec<u32> = keep
                .iter()
                .map(|a| *a.out.token_ids.last().expect("one token chosen"))
                .collect();
            let mut metas = Vec::with_capacity(keep.len());
            let mut caches = Vec::with_capacity(keep.len());
            for a in keep {
                caches.push(a.cache);
                metas.push((a.index, a.req, a.sampler, a.out));
            }
            match self.backend.decode_batch(&tokens, caches) {
                Ok((logits, caches)) => {
                    for ((m, l), c) in metas.into_iter().zip(logits).zip(caches) {
                        active.push(Active {
                            index: m.0,
                            req: m.1,
                            sampler: m.2,
                            logits: l,
                            cache: c,
                            out: m.3,
                        });
                    }
                }
                Err(e) => {
                    for m in metas {
                        finish(&mut results, m.0, Err(e.to_string()), on_event);
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err("request was never scheduled".into())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    /// Next token = (sum of the sequence so far) mod vocab: depends on the whole history,
    /// so any mix-up between batched sequences changes the output.
    struct SumModel {
        vocab: usize,
        max_batch_seen: usize,
    }

    impl Backend for SumModel {
        type Cache = u64;
        fn hidden_size(&self) -> usize {
            1
        }
        fn encode_image(&mut self, p: &Array4<f32>) -> Result<Array2<f32>, BackendError> {
            Ok(Array2::from_elem((1, 1), p.shape()[3] as f32))
        }
        fn embed(&mut self, ids: &[u32]) -> Result<Array2<f32>, BackendError> {
            Ok(Array2::from_shape_fn((ids.len(), 1), |(i, _)| {
                ids[i] as f32
            }))
        }
        fn forward(
            &mut self,
            e: Array2<f32>,
            cache: Option<u64>,
        ) -> Result<(Vec<f32>, u64), BackendError> {
            let sum = cache.unwrap_or(0) + e.iter().map(|x| *x as u64).sum::<u64>();
            let mut l = vec![0.0; self.vocab];
            l[(sum % self.vocab as u64) as usize] = 10.0;
            Ok((l, sum))
        }
        fn decode_batch(
            &mut self,
            tokens: &[u32],
            caches: Vec<u64>,
        ) -> Result<(Vec<Vec<f32>>, Vec<u64>), BackendError> {
            self.max_batch_seen = self.max_batch_seen.max(tokens.len());
            let mut ls = Vec::new();
            let mut cs = Vec::new();
            for (t, c) in tokens.iter().zip(caches) {
                let (l, c) = self.forward(Array2::from_elem((1, 1), *t as f32), Some(c))?;
                ls.push(l);
                cs.push(c);
            }
            Ok((ls, cs))
        }
    }

    fn req(prompt: Vec<u32>, max: usize, w: usize) -> GenRequest {
        GenRequest {
            prompt_ids: prompt,
            pixel_values: Some(Array4::zeros((1, 3, 1, w))),
            params: SamplingParams::greedy(),
            max_new_tokens: max,
            stop_ids: vec![0],
            ignore_eos: false,
            top_logprobs: 2,
        }
    }

    #[test]
    fn batched_results_equal_one_at_a_time_and_requests_join_and_leave() {
        let reqs: Vec<GenRequest> = (0..7)
            .map(|i| req(vec![1, 99, 2 + i], 3 + i as usize * 2, 5 + i as usize))
            .collect();
        let run = |max_batch| {
            let mut e = Engine {
                backend: SumModel {
                    vocab: 97,
                    max_batch_seen: 0,
                },
                max_batch,
                image_token_id: 99,
            };
            let mut tokens = 0;
            let r = e.run(reqs.clone(), &mut |ev| {
                if let Event::Token { .. } = ev {
                    tokens += 1
                }
            });
            (r, e.backend.max_batch_seen, tokens)
        };
        let (one, seen1, _) = run(1);
        let (four, seen4, tokens) = run(4);
        assert_eq!(seen1, 1);
        assert_eq!(seen4, 4);
        let ids = |r: &Vec<Result<Generation, String>>| {
            r.iter()
                .map(|g| g.as_ref().unwrap().token_ids.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&one), ids(&four));
        assert_eq!(tokens, ids(&four).iter().map(|v| v.len()).sum::<usize>());
        for (i, g) in four.iter().enumerate() {
            assert_eq!(
                g.as_ref().unwrap().token_ids.len(),
                3 + i * 2,
                "request {i} ran to its own max_new_tokens"
            );
        }
    }

    #[test]
    fn invalid_sampling_fails_only_that_request() {
        let mut bad = req(vec![1, 99, 2], 3, 5);
        bad.params.top_p = 2.0;
        let mut e = Engine {
            backend: SumModel {
                vocab: 97,
                max_batch_seen: 0,
            },
            max_batch: 2,
            image_token_id: 99,
        };
        let r = e.run(vec![bad, req(vec![1, 99, 3], 3, 5)], &mut |_| {});
        assert!(r[0].as_ref().unwrap_err().contains("top_p"));
        assert_eq!(r[1].as_ref().unwrap().token_ids.len(), 3);
    }
}
