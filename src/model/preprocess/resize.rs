//! Pillow-exact bicubic resampling (22-bit fixed-point weights, two separable passes). Written
//! here rather than taken from a crate because the reference preprocesses with Pillow and its
//! integer arithmetic decides the bytes: this port matches Pillow 13.0 byte for byte on the
//! fixtures in `tests/fixtures/resize/` (the tests in `preprocess.rs`), which no float
//! resampler is built to do.

use super::*;

/// Fixed-point precision of Pillow's 8-bit resampling weights: `32 − 8 − 2`.
pub(crate) const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Pillow's bicubic kernel with `a = −0.5`, support 2.
pub(crate) fn bicubic_kernel(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// Per-output-pixel source window and fixed-point weights for one axis.
pub(crate) struct Coefficients {
    /// Maximum number of taps per output pixel (row stride of `weights`).
    ksize: usize,
    /// `(first source index, number of taps)` per output pixel.
    bounds: Vec<(usize, usize)>,
    /// `out_size · ksize` weights scaled by `2^PRECISION_BITS`.
    weights: Vec<i32>,
}

/// Pillow's `precompute_coeffs` + `normalize_coeffs_8bpc` for the box `[0, in_size)`.
pub(crate) fn precompute_coefficients(in_size: u32, out_size: u32) -> Coefficients {
    const SUPPORT: f64 = 2.0;
    // Pillow passes the box as C floats; `in1 - in0` is computed in float, then widened.
    let scale = f64::from(in_size as f32 - 0.0f32) / f64::from(out_size);
    let filterscale = scale.max(1.0);
    let support = SUPPORT * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let out = out_size as usize;
    let mut bounds = Vec::with_capacity(out);
    let mut weights = vec![0i32; out * ksize];
    let mut k = vec![0f64; ksize];
    let ss = 1.0 / filterscale;
    for (xx, row) in weights.chunks_exact_mut(ksize).enumerate() {
        let center = 0.0 + (xx as f64 + 0.5) * scale;
        // C's (int) cast truncates toward zero, as does `as i64`.
        let xmin = ((center - support + 0.5) as i64).max(0);
        let xmax = ((center + support + 0.5) as i64).min(i64::from(in_size));
        let count = (xmax - xmin).clamp(0, ksize as i64) as usize;
        let mut ww = 0.0;
        for (x, kx) in k.iter_mut().enumerate().take(count) {
            let w = bicubic_kernel(((x as i64 + xmin) as f64 - center + 0.5) * ss);
            *kx = w;
            ww += w;
        }
        for (x, slot) in row.iter_mut().enumerate().take(count) {
            let w = if ww != 0.0 { k[x] / ww } else { k[x] };
            let scaled = w * f64::from(1u32 << PRECISION_BITS);
            *slot = if w < 0.0 {
                (-0.5 + scaled) as i32
            } else {
                (0.5 + scaled) as i32
            };
        }
        bounds.push((xmin as usize, count));
    }
    Coefficients {
        ksize,
        bounds,
        weights,
    }
}

/// Pillow's `clip8`: drop the fixed-point fraction and clamp to 0..=255.
#[inline]
pub(crate) fn clip8(acc: i32) -> u8 {
    if acc >= (1 << PRECISION_BITS << 8) {
        255
    } else if acc <= 0 {
        0
    } else {
        (acc >> PRECISION_BITS) as u8
    }
}

/// Resizes an 8-bit RGB image to `width × height` with bicubic interpolation, reproducing
/// Pillow's `Image.resize((width, height), Image.BICUBIC)` byte for byte.
///
/// Like Pillow: a pass whose axis keeps its size is skipped and equal sizes return a copy. When
/// both axes change, the horizontal pass runs first (over only the source rows the vertical pass
/// needs), except that, as in Pillow 13 (python-pillow/Pillow#9549), the vertical pass runs first
/// when the height shrinks by more than twice as many pixels as the width does
/// (`height < in_h && in_h − height > 2 · (in_w − width)`). Pillow ≤ 12 always ran the horizontal
/// pass first; the two orders differ by at most a few levels on some pixels, and only for such
/// tall-image reductions. A zero target side gives an empty image, and an empty source gives a
/// black image of the target size.
pub fn resize_bicubic(img: &RgbImage, width: u32, height: u32) -> RgbImage {
    let (in_w, in_h) = img.dimensions();
    if width == 0 || height == 0 || in_w == 0 || in_h == 0 {
        return RgbImage::new(width, height);
    }
    if (in_w, in_h) == (width, height) {
        return img.clone();
    }
    let out = match (width != in_w, height != in_h) {
        (true, false) => {
            let horiz = precompute_coefficients(in_w, width);
            horizontal_pass(img.as_raw(), in_w as usize, 0, in_h as usize, &horiz)
        }
        (false, _) => {
            let vert = precompute_coefficients(in_h, height);
            vertical_pass(img.as_raw(), in_w as usize, 0, &vert)
        }
        (true, true) => {
            let horiz = precompute_coefficients(in_w, width);
            let vert = precompute_coefficients(in_h, height);
            let vertical_first = height < in_h
                && i64::from(in_h - height) > 2 * (i64::from(in_w) - i64::from(width));
            if vertical_first {
                let tmp = vertical_pass(img.as_raw(), in_w as usize, 0, &vert);
                horizontal_pass(&tmp, in_w as usize, 0, height as usize, &horiz)
            } else {
                // Only source rows [first, last) feed the vertical pass.
                let first = vert.bounds[0].0;
                let (lmin, lcount) = vert.bounds[height as usize - 1];
                let last = lmin + lcount;
                let tmp = horizontal_pass(img.as_raw(), in_w as usize, first, last, &horiz);
                vertical_pass(&tmp, width as usize, first, &vert)
            }
        }
    };
    RgbImage::from_raw(width, height, out).unwrap_or_else(|| RgbImage::new(width, height))
}

/// Horizontal pass over source rows `first..last`; returns `(last − first) × out_w` RGB pixels.
pub(crate) fn horizontal_pass(
    src: &[u8],
    in_w: usize,
    first: usize,
    last: usize,
    c: &Coefficients,
) -> Vec<u8> {
    let out_w = c.bounds.len();
    let mut out = vec![0u8; (last - first) * out_w * 3];
    let half = 1i32 << (PRECISION_BITS - 1);
    for (row_out, y) in out.chunks_exact_mut(out_w * 3).zip(first..last) {
        let row_in = &src[y * in_w * 3..(y + 1) * in_w * 3];
        for (xx, px) in row_out.chunks_exact_mut(3).enumerate() {
            let (xmin, count) = c.bounds[xx];
            let k = &c.weights[xx * c.ksize..xx * c.ksize + count];
            let taps = &row_in[xmin * 3..(xmin + count) * 3];
            let (mut s0, mut s1, mut s2) = (half, half, half);
            for (&w, p) in k.iter().zip(taps.chunks_exact(3)) {
                s0 = s0.wrapping_add(i32::from(p[0]).wrapping_mul(w));
                s1 = s1.wrapping_add(i32::from(p[1]).wrapping_mul(w));
                s2 = s2.wrapping_add(i32::from(p[2]).wrapping_mul(w));
            }
            px[0] = clip8(s0);
            px[1] = clip8(s1);
            px[2] = clip8(s2);
        }
    }
    out
}

/// Vertical pass; `row_offset` is the source row that `src`'s first row corresponds to.
pub(crate) fn vertical_pass(src: &[u8], w: usize, row_offset: usize, c: &Coefficients) -> Vec<u8> {
    let out_h = c.bounds.len();
    let stride = w * 3;
    let mut out = vec![0u8; out_h * stride];
    let half = 1i32 << (PRECISION_BITS - 1);
    let mut acc = vec![0i32; stride];
    for (yy, row_out) in out.chunks_exact_mut(stride).enumerate() {
        let (ymin, count) = c.bounds[yy];
        let k = &c.weights[yy * c.ksize..yy * c.ksize + count];
        acc.fill(half);
        for (i, &wgt) in k.iter().enumerate() {
            let y = ymin + i - row_offset;
            let row_in = &src[y * stride..(y + 1) * stride];
            for (a, &p) in acc.iter_mut().zip(row_in) {
                *a = a.wrapping_add(i32::from(p).wrapping_mul(wgt));
            }
        }
        for (o, &a) in row_out.iter_mut().zip(&acc) {
            *o = clip8(a);
        }
    }
    out
}
