//! The engine over a paged KV cache (the fake's block pool): admission by blocks, growth,
//! preemption by recompute, and no block lost.

use super::*;
use crate::generation::sampling::SamplingParams;
use crate::runtime::fake::{image, FakeBackend};
use std::collections::HashMap;

const VOCAB: usize = 97;

/// A greedy request whose prompt is `prompt` after one image `w` pixels wide (its one
/// feature is `w`), or text only.
fn request(prompt: Vec<u32>, w: Option<usize>, max: usize) -> GenRequest {
    let image_ids = w.map(|_| 9u32);
    GenRequest {
        prompt_ids: image_ids.into_iter().chain(prompt).collect(),
        images: w.map(image).into_iter().collect(),
        params: SamplingParams::greedy(),
        max_new_tokens: max,
        stop_ids: vec![],
        ignore_eos: true,
        logprobs: false,
        top_logprobs: 0,
    }
}

/// What [`FakeBackend::sum`] generates for `r` alone: each token is the sum of every input
/// row so far (image rows are their widths) modulo the vocabulary.
fn expected(r: &GenRequest) -> Vec<u32> {
    let mut rows: Vec<u64> = r.prompt_ids.iter().map(|t| *t as u64).collect();
    if let (Some(first), Some(p)) = (rows.first_mut(), r.images.first()) {
        *first = p.width() as u64;
    }
    let mut out = Vec::new();
    while out.len() < r.max_new_tokens {
        let t = (rows.iter().sum::<u64>() % VOCAB as u64) as u32;
        out.push(t);
        rows.push(t as u64);
    }
    out
}

fn ids(r: &[Result<Generation, EngineError>]) -> Vec<Vec<u32>> {
    r.iter()
        .map(|g| {
            g.as_ref()
                .expect("every request finishes")
                .token_ids
                .clone()
        })
        .collect()
}

/// A pool too small for every page at once: pages are preempted and recomputed, and each
/// ends with the greedy ids it has alone; every block comes back.
#[test]
fn preempted_pages_resume_with_the_ids_they_would_have_had() {
    for stage in [false, true] {
        let reqs: Vec<GenRequest> = (0..8)
            .map(|i| request(vec![1, 10 + i], Some(3 + i as usize), 20 + 3 * i as usize))
            .collect();
        // 12 blocks of 4: each page needs 6-11 blocks at its end, 8 pages at once need ~70.
        let mut b = FakeBackend::sum(VOCAB).blocks(12, 4);
        if stage {
            b = b.with_image_encoder();
        }
        let mut e = Engine::new(b, 8, 9);
        let out = e.run(reqs.clone(), &mut |_| {});
        let want: Vec<Vec<u32>> = reqs.iter().map(expected).collect();
        assert_eq!(ids(&out), want, "stage {stage}");
        assert!(
            e.stats.preemptions > 0,
            "the pool was never short (stage {stage})"
        );
        assert_eq!(e.backend.taken_blocks(), 0, "blocks leaked (stage {stage})");
    }
}

/// A decode step that fails on a stream-capture collision loses no page: its pages are
/// recomputed and end with their own ids, at most twice each; any other failure, a third
/// collision, or a slot cache fails the step's pages as before.
#[test]
fn pages_of_a_step_lost_to_a_capture_collision_are_recomputed() {
    const COLLISION: &str = "CUDA failure 900: operation not permitted when stream is capturing";
    let reqs: Vec<GenRequest> = (0..4)
        .map(|i| request(vec![1, 10 + i], Some(3 + i as usize), 12))
        .collect();
    let want: Vec<Vec<u32>> = reqs.iter().map(expected).collect();
    for stage in [false, true] {
        let mut b = FakeBackend::sum(VOCAB)
            .blocks(64, 4)
            .fail_steps(&[3, 7], COLLISION);
        if stage {
            b = b.with_image_encoder();
        }
        let mut e = Engine::new(b, 4, 9);
        let out = e.run(reqs.clone(), &mut |_| {});
        assert_eq!(ids(&out), want, "stage {stage}");
        assert!(e.stats.requeued >= 2, "stage {stage}: {:?}", e.stats);
        assert_eq!(e.backend.taken_blocks(), 0, "blocks leaked (stage {stage})");
    }
    let fails = |b: FakeBackend| {
        let mut e = Engine::new(b, 4, 9);
        let out = e.run(reqs.clone(), &mut |_| {});
        out.iter().filter(|r| r.is_err()).count()
    };
    let other = FakeBackend::sum(VOCAB)
        .blocks(64, 4)
        .fail_steps(&[3], "out of memory");
    assert!(fails(other) > 0, "another error fails its pages");
    let every = FakeBackend::sum(VOCAB)
        .blocks(64, 4)
        .fail_steps(&(1..100).collect::<Vec<_>>(), COLLISION);
    assert_eq!(fails(every), 4, "a page is recomputed at most twice");
    let slots = FakeBackend::sum(VOCAB).slots(4).fail_steps(&[3], COLLISION);
    assert!(fails(slots) > 0, "slot caches are not recomputed");
}

/// A page that needs the whole pool runs (alone); one that needs more fails alone, as too
/// long, naming the pool's positions.
#[test]
fn a_page_that_fits_the_pool_never_fails_and_one_that_does_not_fails_alone() {
    let fits = request(vec![1, 2, 3], None, 6 * 4 - 3 + 1);
    let too_long = request(vec![1, 2, 3], None, 6 * 4 - 3 + 2);
    let reqs = vec![fits.clone(), too_long, fits.clone(), fits];
    let mut e = Engine::new(FakeBackend::sum(VOCAB).blocks(6, 4), 4, 9);
    let out = e.run(reqs.clone(), &mut |_| {});
    assert_eq!(out[0].as_ref().unwrap().token_ids, expected(&reqs[0]));
    assert_eq!(out[2].as_ref().unwrap().token_ids, expected(&reqs[2]));
    assert_eq!(out[3].as_ref().unwrap().token_ids, expected(&reqs[3]));
    match &out[1] {
        Err(EngineError::TooLong { need, cap, .. }) => assert_eq!((*need, *cap), (25, 24)),
        other => panic!("expected TooLong, got {other:?}"),
    }
    assert_eq!(e.backend.taken_blocks(), 0);
}

/// While pages hold blocks, a page whose prompt's blocks are not free waits in the batch
/// (has_room says no more) instead of failing, and starts when blocks come back.
#[test]
fn a_page_waits_for_blocks_and_starts_when_they_come_back() {
    let mut e = Engine::new(FakeBackend::sum(VOCAB).blocks(4, 4), 8, 9);
    let mut batch = Batch::new();
    let mut done = HashMap::new();
    let mut rec = |ev: Event| {
        if let Event::Done { index, result } = ev {
            done.insert(index, result.clone());
        }
        Flow::Continue
    };
    // 10 prompt positions: 3 blocks of 4; the second page's 3 are not free beside them.
    let a = request((10..20).collect(), None, 4);
    e.admit(&mut batch, 0, a.clone(), &mut rec);
    assert_eq!((batch.decoding(), batch.queued()), (1, 0));
    e.admit(&mut batch, 1, a.clone(), &mut rec);
    assert_eq!((batch.decoding(), batch.queued()), (1, 1));
    assert!(!e.has_room(&batch), "a queued page keeps new ones out");
    while !batch.is_empty() {
        e.step(&mut batch, &mut rec);
    }
    assert_eq!(done.len(), 2);
    for i in 0..2 {
        assert_eq!(done[&i].as_ref().unwrap().token_ids, expected(&a));
    }
    assert_eq!(e.backend.taken_blocks(), 0);
}

/// 10 000 random joins, steps and cancels over a small pool: pages are preempted, every
/// request ends exactly once, finished pages have their greedy ids, and no block is lost.
#[test]
fn random_joins_finishes_cancels_and_preemptions_leak_no_block() {
    for stage in [false, true] {
        random_run(stage);
    }
}

fn random_run(stage: bool) {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut b = FakeBackend::sum(VOCAB).blocks(24, 4);
    if stage {
        b = b.with_image_encoder();
    }
    let mut e = Engine::new(b, 6, 9);
    let mut batch = Batch::new();
    let mut reqs: Vec<GenRequest> = Vec::new();
    let mut ended: HashMap<usize, Option<Vec<u32>>> = HashMap::new();
    let mut cancelled = 0usize;
    let record = |ev: Event, ended: &mut HashMap<usize, Option<Vec<u32>>>| {
        if let Event::Done { index, result } = ev {
            let ids = match result {
                Ok(g) => Some(g.token_ids.clone()),
                Err(err) => panic!("request {index} failed: {err}"),
            };
            assert!(ended.insert(index, ids).is_none(), "{index} ended twice");
        }
        Flow::Continue
    };
    for _ in 0..10_000 {
        match next(3) {
            0 if e.has_room(&batch) => {
                let w = (next(2) == 0).then(|| 1 + next(40) as usize);
                let prompt = (0..1 + next(16)).map(|_| next(90) as u32 + 10).collect();
                let r = request(prompt, w, 1 + next(40) as usize);
                reqs.push(r.clone());
                e.admit(&mut batch, reqs.len() - 1, r, &mut |ev| {
                    record(ev, &mut ended)
                });
            }
            1 if !batch.is_empty() && next(4) == 0 => {
                let ids = batch.indices();
                let victim = ids[next(ids.len() as u64) as usize];
                assert!(batch.remove(victim).is_some());
                assert!(ended.insert(victim, None).is_none());
                cancelled += 1;
            }
            _ => e.step(&mut batch, &mut |ev| record(ev, &mut ended)),
        }
        assert!(e.backend.taken_blocks() <= 24);
    }
    while !batch.is_empty() {
        e.step(&mut batch, &mut |ev| record(ev, &mut ended));
    }
    // Results of pages cancelled on the stage are taken back (and dropped) by has_room.
    while e.vision.as_ref().is_some_and(|v| v.outstanding() > 0) {
        e.has_room(&batch);
        std::thread::yield_now();
    }
    assert_eq!(ended.len(), reqs.len());
    let finished = ended.values().filter(|v| v.is_some()).count();
    for (i, ids) in &ended {
        if let Some(ids) = ids {
            assert_eq!(ids, &expected(&reqs[*i]), "request {i} (stage {stage})");
        }
    }
    assert!(
        reqs.len() > 500 && cancelled > 50 && finished > 300,
        "{} joined, {cancelled} cancelled, {finished} finished",
        reqs.len()
    );
    assert!(
        e.stats.preemptions > 20,
        "{} preemptions",
        e.stats.preemptions
    );
    assert_eq!(e.backend.taken_blocks(), 0, "blocks leaked (stage {stage})");
}
