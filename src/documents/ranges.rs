//! Page ranges: `--pages 1-3,7` (and the `pages` form field of `/v1/ocr`).
//!
//! A list of 1-based pages and ranges separated by commas: `7`, `1-3`, `5-` (page 5 to the
//! end), `-3` (pages 1 to 3); spaces around items are allowed. Page 0 and reversed ranges
//! (`5-3`) are refused when the list is parsed; a page past the end of a document is refused
//! when the list is applied to it ([`PageRanges::select`]), naming the document and its page
//! count. Pages are read in document order and each once: overlapping ranges and repeated
//! pages are merged.

use std::fmt;

/// One item of a page list: `first..=last` (1-based), `last` open for `N-`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    first: usize,
    last: Option<usize>,
}

/// A parsed page list (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRanges {
    spans: Vec<Span>,
    text: String,
}

/// Errors parsing or applying a page list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// The list is empty or an item is not a page number or a range.
    #[error("{item:?} is not a page or a range of pages (expected e.g. 1-3,7 or 5-)")]
    Syntax {
        /// The item at fault (or the whole list when it is empty).
        item: String,
    },
    /// Page 0: pages are numbered from 1.
    #[error("{item:?}: pages are numbered from 1")]
    Zero {
        /// The item at fault.
        item: String,
    },
    /// A range whose end comes before its start.
    #[error("{item:?}: the range is reversed (write {last}-{first})")]
    Reversed {
        /// The item at fault.
        item: String,
        /// Its start.
        first: usize,
        /// Its end.
        last: usize,
    },
    /// A page past the end of the document the list is applied to.
    #[error("{name}: pages {list}: page {page} is past the end (the document has {count} page{})",
        if *count == 1 { "" } else { "s" })]
    OutOfRange {
        /// The document.
        name: String,
        /// The list as given.
        list: String,
        /// The first page past the end.
        page: usize,
        /// The document's page count.
        count: usize,
    },
}

fn page_number(item: &str, s: &str) -> Result<usize, RangeError> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RangeError::Syntax { item: item.into() });
    }
    // All digits: too large only on overflow, which is past the end of any document.
    let n = s.parse().unwrap_or(usize::MAX);
    if n == 0 {
        return Err(RangeError::Zero { item: item.into() });
    }
    Ok(n)
}

fn span(item: &str) -> Result<Span, RangeError> {
    let t = item.trim();
    let Some((a, b)) = t.split_once('-') else {
        let n = page_number(item, t)?;
        return Ok(Span {
            first: n,
            last: Some(n),
        });
    };
    if a.trim().is_empty() && b.trim().is_empty() {
        return Err(RangeError::Syntax { item: item.into() });
    }
    let first = if a.trim().is_empty() {
        1
    } else {
        page_number(item, a)?
    };
    let last = if b.trim().is_empty() {
        None
    } else {
        Some(page_number(item, b)?)
    };
    if let Some(last) = last.filter(|l| *l < first) {
        return Err(RangeError::Reversed {
            item: t.into(),
            first,
            last,
        });
    }
    Ok(Span { first, last })
}

impl std::str::FromStr for PageRanges {
    type Err = RangeError;

    fn from_str(s: &str) -> Result<Self, RangeError> {
        if s.trim().is_empty() {
            return Err(RangeError::Syntax { item: s.into() });
        }
        let spans = s.split(',').map(span).collect::<Result<_, _>>()?;
        Ok(Self {
            spans,
            text: s.trim().into(),
        })
    }
}

impl fmt::Display for PageRanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PageRanges {
    /// The selected pages of a document of `count` pages, as 0-based indices in document
    /// order, each once; `name` names the document in the error for a page past its end.
    pub fn select(&self, count: usize, name: &str) -> Result<Vec<usize>, RangeError> {
        let mut wanted = vec![false; count];
        for s in &self.spans {
            let last = s.last.unwrap_or(count);
            let past = if s.first > count {
                Some(s.first)
            } else {
                (last > count).then_some(count + 1)
            };
            if let Some(page) = past {
                return Err(RangeError::OutOfRange {
                    name: name.into(),
                    list: self.text.clone(),
                    page,
                    count,
                });
            }
            wanted[s.first - 1..last].iter_mut().for_each(|w| *w = true);
        }
        Ok((0..count).filter(|i| wanted[*i]).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(list: &str, count: usize) -> Result<Vec<usize>, RangeError> {
        list.parse::<PageRanges>()?.select(count, "scan.pdf")
    }

    #[test]
    fn pages_and_ranges_select_zero_based_indices() {
        assert_eq!(sel("1-3,7", 10).unwrap(), [0, 1, 2, 6]);
        assert_eq!(sel("4", 4).unwrap(), [3]);
        assert_eq!(sel(" 2 - 3 , 1 ", 5).unwrap(), [0, 1, 2]);
        assert_eq!(sel("1-1", 1).unwrap(), [0]);
    }

    #[test]
    fn open_ends_reach_the_first_or_last_page() {
        assert_eq!(sel("5-", 7).unwrap(), [4, 5, 6]);
        assert_eq!(sel("-3", 7).unwrap(), [0, 1, 2]);
        assert_eq!(sel("7-", 7).unwrap(), [6]);
        assert_eq!(sel("1-", 2).unwrap(), [0, 1]);
    }

    #[test]
    fn duplicates_and_overlaps_are_read_once_in_document_order() {
        assert_eq!(sel("7,1-3,2,3-4,7", 8).unwrap(), [0, 1, 2, 3, 6]);
        assert_eq!(sel("2-,1-3", 4).unwrap(), [0, 1, 2, 3]);
    }

    #[test]
    fn pages_past_the_end_name_the_document_and_its_page_count() {
        let e = sel("1-3,9", 5).unwrap_err();
        assert_eq!(
            e.to_string(),
            "scan.pdf: pages 1-3,9: page 9 is past the end (the document has 5 pages)"
        );
        let e = sel("2-8", 5).unwrap_err();
        assert!(
            matches!(
                e,
                RangeError::OutOfRange {
                    page: 6,
                    count: 5,
                    ..
                }
            ),
            "{e}"
        );
        let e = sel("3-", 2).unwrap_err();
        assert_eq!(
            e.to_string(),
            "scan.pdf: pages 3-: page 3 is past the end (the document has 2 pages)"
        );
        assert!(sel("2", 1)
            .unwrap_err()
            .to_string()
            .ends_with("(the document has 1 page)"));
        let huge = sel("99999999999999999999999", 3).unwrap_err();
        assert!(matches!(huge, RangeError::OutOfRange { .. }), "{huge}");
    }

    #[test]
    fn zero_reversed_and_malformed_lists_are_refused() {
        for zero in ["0", "0-3", "1,0", "2-0"] {
            let e = zero.parse::<PageRanges>().unwrap_err();
            assert!(matches!(e, RangeError::Zero { .. }), "{zero}: {e}");
            assert!(e.to_string().contains("numbered from 1"), "{e}");
        }
        let e = "1,5-3".parse::<PageRanges>().unwrap_err();
        assert_eq!(
            e,
            RangeError::Reversed {
                item: "5-3".into(),
                first: 5,
                last: 3
            }
        );
        assert!(e.to_string().contains("write 3-5"), "{e}");
        for bad in [
            "", " ", "1,,2", "a", "1-2-3", "-", "1.5", "+2", "1;2", "3-x", "1,",
        ] {
            let e = bad.parse::<PageRanges>().unwrap_err();
            assert!(matches!(e, RangeError::Syntax { .. }), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_list_displays_as_given() {
        let r: PageRanges = " 1-3,7 ".parse().unwrap();
        assert_eq!(r.to_string(), "1-3,7");
    }
}
