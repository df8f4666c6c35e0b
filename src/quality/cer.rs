//! Character and word error rates (CER, WER) of OCR output against its expected text.
//!
//! Both texts are first [`normalise`]d: Unicode NFC (so `é` written as `e` + U+0301 equals
//! the precomposed `é`), every run of whitespace (spaces, tabs, newlines, any Unicode
//! `White_Space` character) replaced by one space, leading and trailing whitespace removed.
//! Nothing else is changed: case, punctuation and markdown markup all count.
//!
//! The CER is the Levenshtein distance (insertions, deletions and substitutions, each of
//! cost 1) between the two normalised texts counted in Unicode scalar values (`char`s),
//! divided by the length of the expected text; the WER is the same over words (the
//! normalised text split at spaces). Rates over several pages divide the summed distances by
//! the summed lengths, so long pages weigh more. An empty expected text has a rate of 0 when
//! the output is empty too, else 1 (its distance, the output's length, still adds to sums).
//!
//! ```
//! use ocrctl::quality::cer::score;
//! let s = score("Hello  wrld\n", "Hello world");
//! assert_eq!((s.chars.errors, s.chars.len), (1, 11));
//! assert_eq!((s.words.errors, s.words.len), (1, 2));
//! assert_eq!(s.words.rate(), 0.5);
//! ```

use serde::Serialize;

/// What [`normalise`] does, in one line (for help texts and JSON reports).
pub const NORMALISATION: &str =
    "Unicode NFC, every run of whitespace as one space, no leading or trailing whitespace";

/// `text` in NFC with whitespace collapsed (see the module documentation).
pub fn normalise(text: &str) -> String {
    // The tokenizer crate's NFC (already a dependency), rather than another Unicode crate.
    let mut n = tokenizers::NormalizedString::from(text);
    n.nfc();
    n.get().split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Levenshtein distance between `a` and `b` (unit costs), in O(len(a)·len(b)) time and
/// O(len(b)) memory.
pub fn edit_distance<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    // row[j]: distance between the prefix of `a` read so far and b[..j].
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for x in a {
        let mut diagonal = row[0];
        row[0] += 1;
        for (j, y) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(x != y);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

/// Errors (edit distance) and length of the expected text, in characters or words.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Edit distance between output and expected text.
    pub errors: usize,
    /// Length of the expected text.
    pub len: usize,
}

impl Counts {
    /// `errors / len`; for an empty expected text 0 when there are no errors, else 1.
    pub fn rate(&self) -> f64 {
        match (self.errors, self.len) {
            (0, _) => 0.0,
            (_, 0) => 1.0,
            (e, n) => e as f64 / n as f64,
        }
    }
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.errors += o.errors;
        self.len += o.len;
    }
}

/// Character and word counts of one page, or summed over pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Score {
    pub chars: Counts,
    pub words: Counts,
}

impl std::ops::AddAssign for Score {
    fn add_assign(&mut self, o: Score) {
        self.chars += o.chars;
        self.words += o.words;
    }
}

/// Scores `output` against `expected`, both normalised first.
pub fn score(output: &str, expected: &str) -> Score {
    let (out, exp) = (normalise(output), normalise(expected));
    let (oc, ec): (Vec<char>, Vec<char>) = (out.chars().collect(), exp.chars().collect());
    let (ow, ew): (Vec<&str>, Vec<&str>) = (words(&out), words(&exp));
    Score {
        chars: Counts {
            errors: edit_distance(&oc, &ec),
            len: ec.len(),
        },
        words: Counts {
            errors: edit_distance(&ow, &ew),
            len: ew.len(),
        },
    }
}

/// The words of a normalised text (none for an empty one).
fn words(normalised: &str) -> Vec<&str> {
    normalised.split(' ').filter(|w| !w.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chars(s: &str) -> Vec<char> {
        s.chars().collect()
    }

    #[test]
    fn distances_of_known_pairs() {
        let d = |a: &str, b: &str| edit_distance(&chars(a), &chars(b));
        assert_eq!(d("kitten", "sitting"), 3);
        assert_eq!(d("sitting", "kitten"), 3, "symmetric");
        assert_eq!(d("flaw", "lawn"), 2);
        assert_eq!(d("", ""), 0);
        assert_eq!(d("", "abc"), 3);
        assert_eq!(d("abc", ""), 3);
        assert_eq!(d("abc", "abc"), 0);
        assert_eq!(d("abc", "acb"), 2, "a transposition is two edits");
        assert_eq!(d("intention", "execution"), 5);
    }

    #[test]
    fn characters_are_unicode_scalars_after_nfc() {
        // "é" as e + combining acute (2 scalars) equals the precomposed é (1 scalar).
        let s = score("caf\u{65}\u{301}", "caf\u{e9}");
        assert_eq!(s.chars, Counts { errors: 0, len: 4 });
        // A multi-byte character is one character, not its UTF-8 bytes.
        let s = score("naïve 東京", "naive 東都");
        assert_eq!(s.chars, Counts { errors: 2, len: 8 });
        assert_eq!(s.words, Counts { errors: 2, len: 2 });
        assert_eq!(normalise("A\u{30a}"), "\u{c5}");
    }

    #[test]
    fn whitespace_is_collapsed_and_trimmed_but_nothing_else_changes() {
        assert_eq!(normalise("  a\t\tb\n\n c\u{a0}d \r\n"), "a b c d");
        assert_eq!(
            score("a  b\n", "a b"),
            Score {
                chars: Counts { errors: 0, len: 3 },
                words: Counts { errors: 0, len: 2 }
            }
        );
        // Case and punctuation count.
        assert_eq!(score("Hello, world", "hello world").chars.errors, 2);
        assert_eq!(normalise(" \n\t "), "");
    }

    #[test]
    fn an_empty_truth_rates_zero_only_against_an_empty_output() {
        let s = score("", "  \n");
        assert_eq!(s.chars, Counts { errors: 0, len: 0 });
        assert_eq!((s.chars.rate(), s.words.rate()), (0.0, 0.0));
        let s = score("abc de", "");
        assert_eq!(s.chars, Counts { errors: 6, len: 0 });
        assert_eq!(s.words, Counts { errors: 2, len: 0 });
        assert_eq!((s.chars.rate(), s.words.rate()), (1.0, 1.0));
        // An empty output deletes every expected character.
        let s = score("", "abcd");
        assert_eq!(s.chars.rate(), 1.0);
    }

    #[test]
    fn wer_counts_whole_words() {
        let s = score("the quick brown fox", "the quick brown dog jumps");
        assert_eq!(s.words, Counts { errors: 2, len: 5 });
        assert_eq!(s.words.rate(), 0.4);
        // One wrong letter makes the whole word wrong.
        let s = score("the qiuck fox", "the quick fox");
        assert_eq!(s.words, Counts { errors: 1, len: 3 });
        assert_eq!(s.chars, Counts { errors: 2, len: 13 });
    }

    #[test]
    fn rates_over_pages_weigh_by_length() {
        let mut total = Score::default();
        total += score("abcd", "abcx"); // 1 / 4
        total += score("", "0123456789012345"); // 16 / 16
        assert_eq!(
            total.chars,
            Counts {
                errors: 17,
                len: 20
            }
        );
        assert!((total.chars.rate() - 0.85).abs() < 1e-12);
    }
}
