//! Unit tests of page outcomes (`src/generation/outcome.rs`): the ladder, the verdicts, the
//! markers, and the retry loop over the fake backend.

use super::*;
use crate::runtime::fake::FakeBackend;
use serde_json::json;
use std::collections::HashMap;

fn sampled(t: f32, seed: Option<u64>) -> SamplingParams {
    SamplingParams {
        temperature: t,
        top_p: 0.9,
        seed,
        ..SamplingParams::greedy()
    }
}

#[test]
fn retries_climb_the_temperature_ladder_with_a_new_seed_each() {
    let p = RetryPolicy::default();
    let base = sampled(0.2, Some(5));
    assert_eq!(
        p.params(&base, 0),
        base,
        "the first attempt is the caller's"
    );
    let temps: Vec<f32> = (0..5).map(|a| p.params(&base, a).temperature).collect();
    assert_eq!(temps, [0.2, 0.5, 0.8, 1.0, 1.0]);
    let seeds: Vec<u64> = (0..4).map(|a| p.params(&base, a).seed.unwrap()).collect();
    let mut unique = seeds.clone();
    unique.dedup();
    assert_eq!(unique.len(), 4, "{seeds:?}");
    assert_eq!(
        p.params(&base, 2).seed,
        p.params(&base, 2).seed,
        "reproducible"
    );
    assert_eq!(p.params(&base, 1).top_p, 0.9, "the other fields are kept");
    // Hotter than the ladder: kept; no seed: a fresh one per attempt (None).
    assert_eq!(p.params(&sampled(0.9, None), 1).temperature, 0.9);
    assert_eq!(p.params(&sampled(0.0, None), 1).seed, None);
    assert_eq!(p.params(&sampled(0.0, None), 1).temperature, 0.5);
}

#[test]
fn length_and_loops_are_faults_unless_length_was_asked_for() {
    let p = RetryPolicy::default();
    assert_eq!(p.fault(FinishReason::Stop, false), None);
    assert_eq!(
        p.fault(FinishReason::Length, false),
        Some(FailReason::Length)
    );
    assert_eq!(p.fault(FinishReason::Length, true), None, "ignore_eos");
    assert_eq!(
        p.fault(FinishReason::Repetition, true),
        Some(FailReason::Loop)
    );
    let accept = RetryPolicy {
        accept_length: true,
        ..p
    };
    assert_eq!(accept.fault(FinishReason::Length, false), None);
    assert_eq!(
        accept.fault(FinishReason::Repetition, false),
        Some(FailReason::Loop)
    );
}

#[test]
fn faults_are_retried_until_the_last_attempt_and_errors_never() {
    let p = RetryPolicy::default();
    let len = Some(FailReason::Length);
    assert_eq!(p.after(0, len), Next::Retry(FailReason::Length));
    assert_eq!(
        p.after(1, Some(FailReason::Loop)),
        Next::Retry(FailReason::Loop)
    );
    assert_eq!(
        p.after(2, len),
        Next::Done(PageOutcome::failed(FailReason::Length, 3))
    );
    assert_eq!(p.after(0, None), Next::Done(PageOutcome::finished(1)));
    assert_eq!(
        p.after(2, None),
        Next::Done(PageOutcome {
            status: PageStatus::Retried,
            attempts: 3,
            reason: None
        })
    );
    assert_eq!(
        p.after(0, Some(FailReason::Error)),
        Next::Done(PageOutcome::failed(FailReason::Error, 1))
    );
    let none = RetryPolicy { retries: 0, ..p };
    assert_eq!(
        none.after(0, len),
        Next::Done(PageOutcome::failed(FailReason::Length, 1))
    );
}

#[test]
fn outcomes_serialise_as_the_json_fields() {
    assert_eq!(
        json!(PageOutcome::failed(FailReason::Loop, 3)),
        json!({"status": "failed", "attempts": 3, "reason": "loop"})
    );
    assert_eq!(
        json!(PageOutcome::finished(1)),
        json!({"status": "ok", "attempts": 1})
    );
    assert_eq!(
        json!(PageOutcome::finished(2)),
        json!({"status": "retried", "attempts": 2})
    );
}

#[test]
fn a_document_is_complete_partial_or_failed_by_its_failed_fraction() {
    assert_eq!(verdict(0, 5, 0.0), DocVerdict::Complete);
    assert_eq!(verdict(1, 5, 0.0), DocVerdict::Failed);
    assert_eq!(verdict(1, 5, 0.2), DocVerdict::Partial);
    assert_eq!(verdict(2, 5, 0.2), DocVerdict::Failed);
    assert_eq!(verdict(1, 1, 1.0), DocVerdict::Partial);
    assert_eq!(verdict(3, 3, 1.0), DocVerdict::Partial);
}

#[test]
fn failed_markers_are_written_and_recognised() {
    let m = failed_marker(2, FailReason::Length);
    assert_eq!(m, "<!-- page 2 failed: length -->");
    assert!(has_failed_marker(&format!("a\n\n<!-- page 2 -->\n\n{m}\n")));
    assert!(has_failed_marker(&failed_marker(13, FailReason::Error)));
    assert!(!has_failed_marker("a\n\n<!-- page 2 -->\n\nb\n"));
    assert!(!has_failed_marker("<!-- page x failed: length -->"));
    assert!(!has_failed_marker("<!-- page  failed: loop -->"));
}

/// The end of each page of a run: key → (outcome, finish reason or error), and the retries
/// seen (key, attempt, reason).
type Ends = (
    HashMap<u32, (PageOutcome, Result<FinishReason, String>)>,
    Vec<(u32, usize, FailReason)>,
);

/// Runs `pages` (key, request) through the fake backend under `policy` at batch 2; a retry
/// of key 4 cannot be made.
fn drive(policy: RetryPolicy, pages: Vec<(u32, GenRequest)>) -> Ends {
    // Token 1 scores 1, token 0 scores 0: greedy never writes 0; at temperature 0.5 token 0
    // comes with probability 1 / (1 + e^2) ≈ 0.12 per step.
    let b = FakeBackend::new(2, |_| 1).peak(1.0);
    let mut e = Engine::new(b, 2, 99);
    let copies: HashMap<u32, GenRequest> = pages.iter().cloned().collect();
    let mut pending = pages.into_iter();
    let (mut ends, mut retries) = (HashMap::new(), Vec::new());
    run_with_retries(
        &mut e,
        &policy,
        || pending.next(),
        |k| match k {
            4 => Err("page 4 is gone".into()),
            k => Ok(copies[k].clone()),
        },
        &mut |ev| match ev {
            PageEvent::Token(_) => {}
            PageEvent::Retry {
                key,
                attempt,
                reason,
            } => retries.push((*key, attempt, reason)),
            PageEvent::Done {
                key,
                outcome,
                result,
            } => {
                let r = result.map(|g| g.finish_reason);
                assert!(ends.insert(key, (outcome, r)).is_none(), "one end per page");
            }
        },
    );
    (ends, retries)
}

fn page(stop_ids: Vec<u32>, params: SamplingParams) -> GenRequest {
    GenRequest {
        stop_ids,
        params,
        ..GenRequest::text(vec![5, 6], 64)
    }
}

#[test]
fn the_retry_loop_retries_faults_and_reports_each_page_once() {
    let greedy = || SamplingParams {
        seed: Some(7),
        ..SamplingParams::greedy()
    };
    let guard = SamplingParams {
        loop_guard: Some(crate::generation::sampling::LoopGuard {
            window: 2,
            max_repeats: 2,
        }),
        ..greedy()
    };
    let pages = vec![
        // Stops at once (its stop id is the greedy token).
        (0, page(vec![1], greedy())),
        // Greedy never stops; sampled at 0.5 it does, early.
        (1, page(vec![0], greedy())),
        // Never stops: length three times.
        (2, page(vec![], greedy())),
        // Repeats itself: the loop guard, three times.
        (3, page(vec![], guard)),
        // Length, then its retry cannot be made.
        (4, page(vec![], greedy())),
    ];
    let (ends, retries) = drive(RetryPolicy::default(), pages.clone());
    let get = |k: u32| ends[&k].clone();
    assert_eq!(get(0), (PageOutcome::finished(1), Ok(FinishReason::Stop)));
    assert_eq!(get(1), (PageOutcome::finished(2), Ok(FinishReason::Stop)));
    assert_eq!(
        get(2),
        (
            PageOutcome::failed(FailReason::Length, 3),
            Ok(FinishReason::Length)
        )
    );
    assert_eq!(
        get(3),
        (
            PageOutcome::failed(FailReason::Loop, 3),
            Ok(FinishReason::Repetition)
        )
    );
    assert_eq!(
        get(4),
        (
            PageOutcome::failed(FailReason::Error, 2),
            Err("page 4 is gone".into())
        )
    );
    let mut r = retries;
    r.sort_by_key(|x| (x.0, x.1));
    use FailReason::{Length, Loop};
    assert_eq!(
        r,
        [
            (1, 0, Length),
            (2, 0, Length),
            (2, 1, Length),
            (3, 0, Loop),
            (3, 1, Loop),
            (4, 0, Length)
        ]
    );

    // Accepting length: nothing is retried but the loop.
    let (ends, retries) = drive(
        RetryPolicy {
            retries: 1,
            accept_length: true,
        },
        pages,
    );
    assert_eq!(
        ends[&2],
        (PageOutcome::finished(1), Ok(FinishReason::Length))
    );
    assert_eq!(ends[&1].0, PageOutcome::finished(1));
    assert_eq!(ends[&3].0, PageOutcome::failed(FailReason::Loop, 2));
    assert_eq!(retries, [(3, 0, Loop)]);
}
