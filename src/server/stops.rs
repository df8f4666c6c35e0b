//! Stop strings found as the text streams in, with work proportional to the new text only.
//!
//! Each stop string gets a Knuth–Morris–Pratt automaton over bytes whose state is the
//! length of the longest suffix of the text so far that is a prefix of the stop string.
//! Appending a piece feeds its bytes through every automaton (amortised O(piece) each),
//! a completed match reports where it starts, and the largest state is exactly how many
//! trailing bytes must be held back because they could still grow into a stop string.
//! The text and the stop strings are UTF-8, so byte matches start and end on character
//! boundaries. (A scan of the recent text per token, as before, cost O(stop length²) on
//! the engine thread and let sixteen 4 MB stop strings stall every client; issue 10.4.)

/// One stop string and its automaton.
#[derive(Debug, Clone)]
struct Kmp {
    pat: Vec<u8>,
    /// `fail[i]`: length of the longest proper prefix of `pat[..=i]` that is also its suffix.
    fail: Vec<usize>,
    state: usize,
}

impl Kmp {
    fn new(pat: &str) -> Kmp {
        let pat = pat.as_bytes().to_vec();
        let mut fail = vec![0; pat.len()];
        let mut k = 0;
        for i in 1..pat.len() {
            while k > 0 && pat[i] != pat[k] {
                k = fail[k - 1];
            }
            if pat[i] == pat[k] {
                k += 1;
            }
            fail[i] = k;
        }
        Kmp {
            pat,
            fail,
            state: 0,
        }
    }

    /// Feeds one byte; true when the whole pattern has just been matched.
    fn feed(&mut self, b: u8) -> bool {
        while self.state > 0 && self.pat[self.state] != b {
            self.state = self.fail[self.state - 1];
        }
        if self.pat[self.state] == b {
            self.state += 1;
        }
        if self.state == self.pat.len() {
            self.state = self.fail[self.state - 1];
            return true;
        }
        false
    }
}

/// The stop strings of one request, matched incrementally against its growing text.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<Kmp>,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored: they would match everywhere).
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops
                .iter()
                .filter(|s| !s.is_empty())
                .map(|s| Kmp::new(s))
                .collect(),
        }
    }

    /// The stop string `i`.
    pub fn stop(&self, i: usize) -> &str {
        std::str::from_utf8(&self.stops[i].pat).expect("built from a str")
    }

    /// Feeds `piece`, which the caller appended to its text at byte `offset`. Returns the
    /// match completed within `piece` that starts first (byte position in the text, index
    /// of the stop string), if any; matches may begin in earlier text.
    pub fn push(&mut self, offset: usize, piece: &str) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize)> = None;
        for (i, k) in self.stops.iter_mut().enumerate() {
            for (j, &b) in piece.as_bytes().iter().enumerate() {
                if k.feed(b) {
                    let start = offset + j + 1 - k.pat.len();
                    if best.is_none_or(|(s, _)| start < s) {
                        best = Some((start, i));
                    }
                    break;
                }
            }
        }
        best
    }

    /// Trailing bytes of the text that could still grow into a stop string (send them only
    /// once they cannot).
    pub fn held_back(&self) -> usize {
        self.stops.iter().map(|k| k.state).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: every stop string searched in the whole text.
    fn naive(text: &str, stops: &[&str]) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize)> = None;
        for (i, s) in stops.iter().enumerate() {
            if let Some(p) = text.find(s) {
                if best.is_none_or(|(b, _)| p < b) {
                    best = Some((p, i));
                }
            }
        }
        best
    }

    fn held_naive(text: &str, stops: &[&str]) -> usize {
        let mut held = 0;
        for s in stops {
            for k in (1..s.len()).rev() {
                if s.is_char_boundary(k) && text.ends_with(&s[..k]) {
                    held = held.max(k);
                    break;
                }
            }
        }
        held
    }

    #[test]
    fn finds_matches_across_pieces_like_a_full_search() {
        let stops = ["aab", "abab", "bé", "ééx", "b"];
        let owned: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        // Deterministic pseudo-random texts over a tiny alphabet (many partial matches).
        let alphabet = ["a", "b", "é", "x", "ab"];
        let mut seed = 7u64;
        for _ in 0..2000 {
            let mut m = StopMatcher::new(&owned[..4]);
            let mut text = String::new();
            let mut hit = None;
            for _ in 0..12 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let piece: String = (0..(seed >> 60) as usize % 3 + 1)
                    .map(|i| alphabet[((seed >> (8 * i + 3)) % 5) as usize])
                    .collect();
                let off = text.len();
                text.push_str(&piece);
                if let Some(h) = m.push(off, &piece) {
                    hit = Some(h);
                    break;
                }
                assert_eq!(m.held_back(), held_naive(&text, &stops[..4]), "{text:?}");
                assert!(text.is_char_boundary(text.len() - m.held_back()));
            }
            assert_eq!(hit, naive(&text, &stops[..4]), "{text:?}");
        }
        let mut m = StopMatcher::new(&owned[4..]);
        assert_eq!(m.push(0, "aaab"), Some((3, 0)));
    }

    #[test]
    fn huge_stop_strings_cost_only_the_new_text() {
        let big = "x".repeat(1 << 20) + "y";
        let mut m = StopMatcher::new(&[big.clone(), "z".into()]);
        let mut text = String::new();
        // 50 000 pieces of 'x': the naive scan did O(stop length) work per piece or worse.
        for _ in 0..50_000 {
            let off = text.len();
            text.push('x');
            assert_eq!(m.push(off, "x"), None);
        }
        assert_eq!(m.held_back(), 50_000);
        assert_eq!(m.stop(1), "z");
        assert_eq!(m.push(text.len(), "z"), Some((50_000, 1)));
    }
}
