//! [`Pixels`]: a page's `pixel_values`, held compactly from preprocessing until the vision
//! encoder takes them.
//!
//! Normalised float32 pixels take 12 bytes a pixel (19 MiB for an A4 page at 1092×1540); they
//! are a function of the resized 8-bit RGB image (3 bytes a pixel) through one 256-entry table
//! per channel ([`super::normalisation_table`]). A request keeps the 8-bit image and the tables
//! while it is queued, and the float32 values are written where they are used: into the encoder's
//! page-locked upload buffer on CUDA, or into one array for the run otherwise. The values are
//! the same bits either way.

use ndarray::Array4;

/// Elements per thread below which [`Pixels::write_nchw`] and [`copy_parallel`] use fewer
/// threads.
const CHUNK: usize = 1 << 20;

/// The vision encoder's input for one image: `[1, 3, height, width]` float32 values, kept as the
/// 8-bit image they come from ([`Pixels::from_rgb`]) or as given ([`Pixels::dense`]).
#[derive(Debug, Clone)]
pub struct Pixels {
    repr: Repr,
}

#[derive(Debug, Clone)]
enum Repr {
    /// Interleaved 8-bit RGB rows and the normalised value of each channel's 256 levels.
    Rgb {
        rgb: Vec<u8>,
        height: usize,
        width: usize,
        lut: Box<[[f32; 256]; 3]>,
    },
    /// Float32 values as given (the reference's own pixels, tests).
    Dense(Array4<f32>),
}

impl Pixels {
    /// An 8-bit RGB image of `height × width` (`rgb`: interleaved rows, 3 bytes a pixel)
    /// normalised through `lut` (channel, level → value).
    pub fn from_rgb(rgb: Vec<u8>, height: usize, width: usize, lut: [[f32; 256]; 3]) -> Pixels {
        assert_eq!(
            rgb.len(),
            3 * height * width,
            "RGB bytes of {height}×{width}"
        );
        Pixels {
            repr: Repr::Rgb {
                rgb,
                height,
                width,
                lut: Box::new(lut),
            },
        }
    }

    /// Float32 `pixel_values [1, 3, H, W]` as they are.
    pub fn dense(values: Array4<f32>) -> Pixels {
        Pixels {
            repr: Repr::Dense(values),
        }
    }

    /// `[1, 3, height, width]`.
    pub fn shape(&self) -> [usize; 4] {
        match &self.repr {
            Repr::Rgb { height, width, .. } => [1, 3, *height, *width],
            Repr::Dense(a) => {
                let s = a.shape();
                [s[0], s[1], s[2], s[3]]
            }
        }
    }

    /// Height in pixels.
    pub fn height(&self) -> usize {
        self.shape()[2]
    }

    /// Width in pixels.
    pub fn width(&self) -> usize {
        self.shape()[3]
    }

    /// Float32 values (`1 · 3 · height · width`).
    pub fn len(&self) -> usize {
        self.shape().iter().product()
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held: 3 a pixel from [`Pixels::from_rgb`], 12 from [`Pixels::dense`].
    pub fn held_bytes(&self) -> usize {
        match &self.repr {
            Repr::Rgb { rgb, .. } => rgb.len(),
            Repr::Dense(a) => a.len() * 4,
        }
    }

    /// The values in NCHW order when they are held as float32 already (to lend as they lie).
    pub fn as_slice(&self) -> Option<&[f32]> {
        match &self.repr {
            Repr::Dense(a) => a.as_slice(),
            Repr::Rgb { .. } => None,
        }
    }

    /// Writes the values in NCHW order into `out` (`self.len()` long) on up to `threads`
    /// threads.
    pub fn write_nchw(&self, out: &mut [f32], threads: usize) {
        assert_eq!(out.len(), self.len(), "output length");
        match &self.repr {
            Repr::Dense(a) => match a.as_slice() {
                Some(s) => copy_parallel(out, s, threads),
                None => out.iter_mut().zip(a.iter()).for_each(|(o, v)| *o = *v),
            },
            Repr::Rgb {
                rgb,
                height,
                width,
                lut,
            } => {
                // One pass over the pixels writes the three planes; each thread takes a run of
                // pixels (the same run of every plane).
                let plane = height * width;
                let (r, rest) = out.split_at_mut(plane);
                let (g, b) = rest.split_at_mut(plane);
                let fill = |first: usize, r: &mut [f32], g: &mut [f32], b: &mut [f32]| {
                    let src = rgb[first * 3..].chunks_exact(3);
                    let planes = r.iter_mut().zip(g.iter_mut()).zip(b.iter_mut());
                    for (((r, g), b), px) in planes.zip(src) {
                        *r = lut[0][usize::from(px[0])];
                        *g = lut[1][usize::from(px[1])];
                        *b = lut[2][usize::from(px[2])];
                    }
                };
                let threads = threads.max(1).min((3 * plane).div_ceil(CHUNK)).max(1);
                if threads == 1 {
                    fill(0, r, g, b);
                    return;
                }
                let chunk = plane.div_ceil(threads).max(1);
                std::thread::scope(|scope| {
                    let parts = r
                        .chunks_mut(chunk)
                        .zip(g.chunks_mut(chunk))
                        .zip(b.chunks_mut(chunk));
                    for (k, ((r, g), b)) in parts.enumerate() {
                        let fill = &fill;
                        scope.spawn(move || fill(k * chunk, r, g, b));
                    }
                });
            }
        }
    }

    /// The values as an array `[1, 3, height, width]`.
    pub fn to_array(&self) -> Array4<f32> {
        if let Repr::Dense(a) = &self.repr {
            return a.clone();
        }
        let mut v = vec![0f32; self.len()];
        self.write_nchw(&mut v, 1);
        let [n, c, h, w] = self.shape();
        Array4::from_shape_vec((n, c, h, w), v).expect("len() values")
    }
}

/// `dst.copy_from_slice(src)` on up to `threads` threads. A single core copies an A4 page's
/// 19 MiB in ~2 ms; a few cores share the memory's bandwidth.
fn copy_parallel(dst: &mut [f32], src: &[f32], threads: usize) {
    let threads = threads.max(1);
    let chunk = src.len().div_ceil(threads).max(CHUNK);
    if chunk >= src.len() {
        dst.copy_from_slice(src);
        return;
    }
    std::thread::scope(|scope| {
        for (d, s) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
            scope.spawn(move || d.copy_from_slice(s));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lut() -> [[f32; 256]; 3] {
        let mut t = [[0f32; 256]; 3];
        for (c, row) in t.iter_mut().enumerate() {
            for (v, x) in row.iter_mut().enumerate() {
                *x = (v as f32 - 128.0) / (c as f32 + 1.0);
            }
        }
        t
    }

    /// Every way of writing gives the same values, NCHW, as a plain loop over the image.
    #[test]
    fn rgb_pixels_write_the_table_values_in_nchw_order_on_any_threads() {
        for (h, w) in [(1, 1), (3, 5), (28, 56), (1100, 1000)] {
            let rgb: Vec<u8> = (0..3 * h * w).map(|i| (i * 7 % 251) as u8).collect();
            let p = Pixels::from_rgb(rgb.clone(), h, w, lut());
            let mut want = vec![0f32; 3 * h * w];
            for y in 0..h {
                for x in 0..w {
                    for c in 0..3 {
                        want[c * h * w + y * w + x] =
                            lut()[c][usize::from(rgb[(y * w + x) * 3 + c])];
                    }
                }
            }
            for threads in [0, 1, 3, 4] {
                let mut out = vec![f32::NAN; p.len()];
                p.write_nchw(&mut out, threads);
                assert_eq!(out, want, "{h}×{w}, {threads} threads");
            }
            assert_eq!(p.to_array().as_slice().unwrap(), &want[..]);
            assert_eq!(p.shape(), [1, 3, h, w]);
            assert_eq!(p.held_bytes(), 3 * h * w);
        }
    }

    #[test]
    fn dense_pixels_are_lent_and_copied_as_they_are() {
        let a = Array4::from_shape_fn((1, 3, 4, 6), |(_, c, y, x)| (c * 100 + y * 10 + x) as f32);
        let p = Pixels::dense(a.clone());
        assert_eq!(p.as_slice(), a.as_slice());
        let mut out = vec![0f32; p.len()];
        p.write_nchw(&mut out, 4);
        assert_eq!(&out[..], a.as_slice().unwrap());
        assert_eq!(p.to_array(), a);
        assert_eq!(
            (p.height(), p.width(), p.held_bytes()),
            (4, 6, 3 * 4 * 6 * 4)
        );
    }

    #[test]
    fn copy_parallel_copies_every_element_in_order() {
        for len in [0, 5, CHUNK, 3 * CHUNK + 7] {
            let src: Vec<f32> = (0..len).map(|i| i as f32).collect();
            for threads in [0, 1, 4] {
                let mut dst = vec![-1.0; len];
                copy_parallel(&mut dst, &src, threads);
                assert_eq!(dst, src, "length {len}, {threads} threads");
            }
        }
    }
}
