//! The loop guard: stop a request whose generated tokens end in one block repeated back to
//! back (see [`LoopGuard`] for the rule and its defaults).

use super::SamplingError;
use serde::Serialize;

/// Stops generation when the end of the generated tokens is one block repeated back to back.
///
/// A block of `L` tokens (`1 <= L <= window`) counts as a loop once it has repeated
/// `required_repeats(L) = max(max_repeats, ceil(window / L))` times in a row: the repeated
/// run must be at least `max_repeats` copies **and** cover at least `window` tokens. Short
/// blocks therefore need many copies (with the defaults one token must repeat 64 times, a
/// 2-token block 32 times) and long ones few (a 20-token line 8 times, 160 tokens). The
/// defaults ([`LoopGuard::default`]: window 64, max_repeats 8) are deliberately conservative:
/// an OCR page legitimately repeats a little (dot leaders, empty table cells, a few blank
/// form rows), while a real loop runs to `max_new_tokens`, so catching it after a few
/// hundred tokens still saves most of the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LoopGuard {
    /// Longest block length considered, in tokens (>= 1); also the shortest loop span.
    pub window: usize,
    /// Fewest consecutive copies of a block that count as a loop (>= 2).
    pub max_repeats: usize,
}

impl Default for LoopGuard {
    /// Window 64 tokens, 8 repeats (see [`LoopGuard`]).
    fn default() -> Self {
        LoopGuard {
            window: 64,
            max_repeats: 8,
        }
    }
}

impl LoopGuard {
    /// Checks the fields; errors name `loop_guard.window` or `loop_guard.max_repeats`.
    pub fn validate(&self) -> Result<(), SamplingError> {
        if self.window == 0 {
            return Err(SamplingError::LoopGuard {
                field: "window",
                expected: ">= 1",
                got: self.window,
            });
        }
        if self.max_repeats < 2 {
            return Err(SamplingError::LoopGuard {
                field: "max_repeats",
                expected: ">= 2",
                got: self.max_repeats,
            });
        }
        Ok(())
    }

    /// How many consecutive copies of a block of `period` tokens count as a loop:
    /// `max(max_repeats, ceil(window / period))`.
    pub fn required_repeats(&self, period: usize) -> usize {
        self.max_repeats.max(self.window.div_ceil(period.max(1)))
    }
}

/// A repetition loop found at the end of a generated sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopMatch {
    /// Length of the repeated block, in tokens (the shortest one that qualifies).
    pub period: usize,
    /// Whole consecutive copies of the block at the end of the sequence.
    pub repeats: usize,
    /// Index where the first of those copies starts; `generated[start..start + period]` is
    /// the block, and truncating at `start + period` keeps a single copy.
    pub start: usize,
}

/// Whether `generated` ends in a repetition loop under `guard` (see [`LoopGuard`]).
pub fn detect_loop(generated: &[u32], guard: &LoopGuard) -> bool {
    find_loop(generated, guard).is_some()
}

/// The loop at the end of `generated`, if any, with the shortest qualifying block.
///
/// Cheap enough to call after every token: each block length is rejected at its first
/// mismatch (usually the last token), so a step costs about `window` comparisons on normal
/// text and `O(window · max_repeats · window)` at worst. Returns `None` for an invalid guard.
pub fn find_loop(generated: &[u32], guard: &LoopGuard) -> Option<LoopMatch> {
    if guard.validate().is_err() {
        return None;
    }
    let n = generated.len();
    // Every loop covers at least `window` tokens.
    if n < guard.window {
        return None;
    }
    let g = generated;
    for period in 1..=guard.window {
        let span = guard.required_repeats(period) * period;
        if guard.max_repeats * period > n {
            break; // longer blocks need even more tokens
        }
        if span > n || g[n - 1] != g[n - 1 - period] {
            continue;
        }
        // The last `span` tokens have period `period` iff g[j] == g[j + period] over them.
        let periodic = (n - span..n - period).rev().all(|j| g[j] == g[j + period]);
        if !periodic {
            continue;
        }
        let mut first = n - span;
        while first > 0 && g[first - 1] == g[first - 1 + period] {
            first -= 1;
        }
        let repeats = (n - first) / period;
        return Some(LoopMatch {
            period,
            repeats,
            start: n - repeats * period,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::sampling::{Sampler, SamplingParams, Xoshiro256};

    #[test]
    fn loop_guard_thresholds() {
        let g = LoopGuard::default();
        assert_eq!(g.required_repeats(1), 64);
        assert_eq!(g.required_repeats(2), 32);
        assert_eq!(g.required_repeats(3), 22);
        assert_eq!(g.required_repeats(8), 8);
        assert_eq!(g.required_repeats(20), 8);
        assert_eq!(g.required_repeats(64), 8);
    }

    #[test]
    fn loop_detection_catches_repeated_blocks() {
        let g = LoopGuard::default();
        let text: Vec<u32> = (1000..1040).collect();
        // "x x x ...": fires at the 64th copy, not before.
        let mut s = text.clone();
        s.extend(std::iter::repeat_n(7, 63));
        assert!(!detect_loop(&s, &g));
        s.push(7);
        let m = find_loop(&s, &g).unwrap();
        assert_eq!(
            m,
            LoopMatch {
                period: 1,
                repeats: 64,
                start: 40
            }
        );
        // "a b c a b c ...": 22 copies needed (66 tokens ≥ window 64).
        let mut s = text.clone();
        for _ in 0..21 {
            s.extend([1, 2, 3]);
        }
        assert!(!detect_loop(&s, &g));
        s.extend([1, 2, 3]);
        let m = find_loop(&s, &g).unwrap();
        assert_eq!((m.period, m.repeats, m.start), (3, 22, 40));
        assert_eq!(&s[m.start..m.start + m.period], &[1, 2, 3]);
        // A 20-token line repeated 8 times, ending mid-line: caught with the line's period.
        let line: Vec<u32> = (500..520).collect();
        let mut s = text.clone();
        for _ in 0..8 {
            s.extend(&line);
        }
        s.extend(&line[..5]);
        let m = find_loop(&s, &g).unwrap();
        assert_eq!((m.period, m.repeats), (20, 8));
        // Seven copies plus a partial eighth is not enough.
        let mut s = text.clone();
        for _ in 0..7 {
            s.extend(&line);
        }
        s.extend(&line[..19]);
        assert!(!detect_loop(&s, &g));
        // A loop whose block is longer than the window is not looked for.
        let long: Vec<u32> = (0..70).collect();
        let s: Vec<u32> = long.iter().cycle().take(70 * 10).copied().collect();
        assert!(!detect_loop(&s, &g));
        assert!(detect_loop(
            &s,
            &LoopGuard {
                window: 70,
                max_repeats: 8
            }
        ));
    }

    #[test]
    fn loop_detection_ignores_normal_text_with_repeats() {
        let g = LoopGuard::default();
        // Words from a small vocabulary (many repeats), a few short runs, a dot leader.
        let mut r = Xoshiro256::from_seed(3);
        let mut s: Vec<u32> = Vec::new();
        for step in 0..5000 {
            s.push((r.next_u64() % 40) as u32);
            if step % 500 == 0 {
                s.extend([9, 9, 9, 9, 9, 9, 9, 9, 9, 9]);
                s.extend([5, 6, 5, 6, 5, 6, 5, 6]);
                for _ in 0..4 {
                    s.extend([11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]);
                }
            }
            assert!(
                find_loop(&s, &g).is_none(),
                "fired at {}: {:?}",
                s.len(),
                &s[s.len() - 20..]
            );
        }
        // Short sequences and invalid guards never fire.
        assert!(!detect_loop(&[1, 1, 1], &g));
        assert!(!detect_loop(
            &[1; 100],
            &LoopGuard {
                window: 0,
                max_repeats: 8
            }
        ));
        // The sampler's guard is off unless set.
        let s1 = Sampler::new(SamplingParams::greedy()).unwrap();
        assert!(!s1.loop_detected(&[1; 100]));
        let s2 = Sampler::new(SamplingParams {
            loop_guard: Some(g),
            ..SamplingParams::greedy()
        })
        .unwrap();
        assert!(s2.loop_detected(&[1; 100]));
    }
}
