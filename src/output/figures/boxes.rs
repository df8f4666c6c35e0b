//! The bbox models' figure references: `![image](image_N.png) x1,y1,x2,y2`, a Markdown image
//! followed by a box in coordinates from 0 to 1000 of the page the model saw (the
//! LightOnOCR-2-1B-bbox card). Some outputs have no space before the numbers, others spaces
//! after the commas; a box in brackets or parentheses is read too. Numbers may be decimals
//! or negative (then clamped). A reference whose box is incomplete is not a figure and its
//! text stays as written.
//!
//! A small hand-written scanner ([`find`]): `![`, the alt text up to `]`, `(`, the target up
//! to `)`, then spaces or tabs and four numbers separated by commas. Nothing crosses a line.

use std::ops::Range;

/// The coordinates' full scale: a box is given in thousandths of the page's sides.
pub const SCALE: f64 = 1000.0;

/// One image reference with a box, as the model wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct BoxedImage<'a> {
    /// Bytes of the whole reference in the text, box included.
    pub span: Range<usize>,
    /// The alt text (`image`).
    pub alt: &'a str,
    /// The link target (`image_1.png`).
    pub target: &'a str,
    /// `x1, y1, x2, y2` as written.
    pub written: [f64; 4],
}

/// What was changed to make a written box usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Adjustment {
    /// A coordinate was outside 0–1000 and was clamped.
    Clamped,
    /// `x1 > x2` or `y1 > y2`: the corners were swapped.
    Swapped,
}

/// Why a box cannot be cropped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BoxError {
    /// After clamping to 0–1000 the box has no width or no height.
    #[error("the box {0:?} has no area within the page (coordinates 0-1000)")]
    Empty([f64; 4]),
}

/// Every image reference with a complete box in `text`, in order.
pub fn find(text: &str) -> Vec<BoxedImage<'_>> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("![") {
        let start = from + i;
        match parse_at(text, start) {
            Some(b) => {
                from = b.span.end;
                found.push(b);
            }
            None => from = start + 2,
        }
    }
    found
}

/// The box as written made usable: clamped to 0–1000, corners ordered; with what was changed.
pub fn normalise(written: [f64; 4]) -> Result<([f64; 4], Vec<Adjustment>), BoxError> {
    let mut adjusted = Vec::new();
    let mut b = written;
    for c in &mut b {
        let clamped = c.clamp(0.0, SCALE);
        if clamped != *c {
            adjusted.push(Adjustment::Clamped);
            *c = clamped;
        }
    }
    adjusted.dedup();
    if b[0] > b[2] || b[1] > b[3] {
        adjusted.push(Adjustment::Swapped);
        b = [
            b[0].min(b[2]),
            b[1].min(b[3]),
            b[0].max(b[2]),
            b[1].max(b[3]),
        ];
    }
    if b[0] == b[2] || b[1] == b[3] {
        return Err(BoxError::Empty(written));
    }
    Ok((b, adjusted))
}

/// A normalised box in the pixels of a `width × height` page: `[left, top, right, bottom]`,
/// right and bottom exclusive, widened outwards to whole pixels (at least one each way).
pub fn to_pixels(b: [f64; 4], width: u32, height: u32) -> [u32; 4] {
    let (w, h) = (f64::from(width), f64::from(height));
    // Multiplying first keeps integer coordinates exact (x · W is an integer, one division).
    let lo = |v: f64, side: f64, max: u32| ((v * side / SCALE).floor() as u32).min(max - 1);
    let hi = |v: f64, side: f64, max: u32, low: u32| {
        ((v * side / SCALE).ceil() as u32).clamp(low + 1, max)
    };
    let (left, top) = (lo(b[0], w, width), lo(b[1], h, height));
    [
        left,
        top,
        hi(b[2], w, width, left),
        hi(b[3], h, height, top),
    ]
}

/// The reference starting at `start` (at `![`), if a complete box follows it.
fn parse_at(text: &str, start: usize) -> Option<BoxedImage<'_>> {
    let mut c = Cursor {
        s: text,
        pos: start,
    };
    c.eat('!').then_some(())?;
    c.eat('[').then_some(())?;
    let alt = c.until(']')?;
    c.eat('(').then_some(())?;
    let target = c.until(')')?;
    c.skip_blanks();
    let close = if c.eat('[') {
        Some(']')
    } else if c.eat('(') {
        Some(')')
    } else {
        None
    };
    let mut written = [0.0; 4];
    for (i, slot) in written.iter_mut().enumerate() {
        if i > 0 {
            c.skip_blanks();
            c.eat(',').then_some(())?;
            c.skip_blanks();
        }
        *slot = c.number()?;
    }
    if let Some(close) = close {
        c.skip_blanks();
        c.eat(close).then_some(())?;
    } else {
        // A fifth number means this is not a box of four.
        let mut more = Cursor {
            s: text,
            pos: c.pos,
        };
        more.skip_blanks();
        if more.eat(',') && {
            more.skip_blanks();
            more.number().is_some()
        } {
            return None;
        }
    }
    Some(BoxedImage {
        span: start..c.pos,
        alt,
        target,
        written,
    })
}

/// A position in the text being scanned.
struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<char> {
        self.s[self.pos..].chars().next()
    }

    /// Consumes `ch` if it is next.
    fn eat(&mut self, ch: char) -> bool {
        let next = self.peek() == Some(ch);
        if next {
            self.pos += ch.len_utf8();
        }
        next
    }

    /// The text up to `stop` (consumed, not returned); `None` at a line end or the end.
    fn until(&mut self, stop: char) -> Option<&'a str> {
        let rest = &self.s[self.pos..];
        let end = rest.find([stop, '\n'])?;
        if !rest[end..].starts_with(stop) {
            return None;
        }
        self.pos += end + stop.len_utf8();
        Some(&rest[..end])
    }

    /// Skips spaces and tabs (never a line end).
    fn skip_blanks(&mut self) {
        while self.eat(' ') || self.eat('\t') {}
    }

    /// A number: an optional `-` or `+`, digits, optionally `.` and digits.
    fn number(&mut self) -> Option<f64> {
        let rest = &self.s[self.pos..];
        let sign = usize::from(rest.starts_with(['-', '+']));
        let digits = |from: usize| {
            rest[from..]
                .find(|ch: char| !ch.is_ascii_digit())
                .unwrap_or(rest.len() - from)
        };
        let int = digits(sign);
        let mut len = sign + int;
        if rest[len..].starts_with('.') {
            let frac = digits(len + 1);
            if frac > 0 {
                len += 1 + frac;
            }
        }
        if int == 0 && len == sign {
            return None;
        }
        let v: f64 = rest[..len].parse().ok()?;
        self.pos += len;
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boxes(text: &str) -> Vec<(String, [f64; 4], String)> {
        find(text)
            .into_iter()
            .map(|b| (b.target.to_string(), b.written, text[b.span].to_string()))
            .collect()
    }

    #[test]
    fn the_cards_format_with_and_without_a_space_and_with_spaces_after_commas() {
        let text =
            "Intro\n![image](image_1.png) 120,80,560,400\nmid ![image](image_2.png)10,20,30,40 \
                    end ![fig](image_3.png)  7 , 8 ,\t9, 10\n";
        let got = boxes(text);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0].0, "image_1.png");
        assert_eq!(got[0].1, [120.0, 80.0, 560.0, 400.0]);
        assert_eq!(got[0].2, "![image](image_1.png) 120,80,560,400");
        assert_eq!(got[1].1, [10.0, 20.0, 30.0, 40.0]);
        assert_eq!(got[1].2, "![image](image_2.png)10,20,30,40");
        assert_eq!(got[2].1, [7.0, 8.0, 9.0, 10.0]);
        assert_eq!(got[2].2, "![fig](image_3.png)  7 , 8 ,\t9, 10");
        assert_eq!(find(text)[2].alt, "fig");
    }

    #[test]
    fn bracketed_decimal_and_negative_boxes_are_read() {
        let got = boxes("![image](image_1.png) [1.5, 2, 999.25, -3] and ![image](i.png)(1,2,3,4)");
        assert_eq!(got[0].1, [1.5, 2.0, 999.25, -3.0]);
        assert_eq!(got[0].2, "![image](image_1.png) [1.5, 2, 999.25, -3]");
        assert_eq!(got[1].1, [1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn references_without_a_complete_box_are_not_figures() {
        for text in [
            "![image](image_1.png)",
            "![image](image_1.png) 1,2,3",
            "![image](image_1.png) 1,2,3,",
            "![image](image_1.png)\n1,2,3,4",
            "![image](image_1.png) 1,2,3,4,5",
            "![image](image_1.png) [1,2,3,4",
            "![ima\nge](image_1.png) 1,2,3,4",
            "![image](image_1.png 1,2,3,4",
            "! [image](image_1.png) 1,2,3,4",
            "![image] (image_1.png) 1,2,3,4",
            "![image](image_1.png) a,b,c,d",
        ] {
            assert!(find(text).is_empty(), "{text:?} gave {:?}", find(text));
        }
        // The text after a broken reference is still read.
        assert_eq!(boxes("![x](y) 1,2 ![image](a.png) 1,2,3,4").len(), 1);
    }

    #[test]
    fn out_of_range_boxes_are_clamped_inverted_ones_swapped_empty_ones_reported() {
        assert_eq!(
            normalise([10.0, 20.0, 30.0, 40.0]),
            Ok(([10.0, 20.0, 30.0, 40.0], vec![]))
        );
        assert_eq!(
            normalise([-5.0, 20.0, 1200.0, 40.0]),
            Ok(([0.0, 20.0, 1000.0, 40.0], vec![Adjustment::Clamped]))
        );
        assert_eq!(
            normalise([300.0, 400.0, 100.0, 200.0]),
            Ok(([100.0, 200.0, 300.0, 400.0], vec![Adjustment::Swapped]))
        );
        assert_eq!(
            normalise([1100.0, 50.0, 900.0, 10.0]),
            Ok((
                [900.0, 10.0, 1000.0, 50.0],
                vec![Adjustment::Clamped, Adjustment::Swapped]
            ))
        );
        for b in [
            [5.0, 5.0, 5.0, 9.0],
            [1001.0, 0.0, 1500.0, 10.0],
            [0.0, -9.0, 10.0, -1.0],
        ] {
            assert_eq!(normalise(b), Err(BoxError::Empty(b)), "{b:?}");
        }
    }

    #[test]
    fn boxes_become_whole_pixels_widened_outwards() {
        assert_eq!(
            to_pixels([250.0, 100.0, 500.0, 400.0], 2000, 1000),
            [500, 100, 1000, 400]
        );
        // 1/3 of 100 px is 33.3: the box grows to cover it.
        assert_eq!(
            to_pixels([1.0, 1.0, 334.0, 999.0], 100, 100),
            [0, 0, 34, 100]
        );
        assert_eq!(to_pixels([0.0, 0.0, 1000.0, 1000.0], 7, 5), [0, 0, 7, 5]);
        // A sliver still covers one pixel, inside the page.
        assert_eq!(to_pixels([999.9, 0.0, 1000.0, 0.1], 10, 10), [9, 0, 10, 1]);
    }
}
