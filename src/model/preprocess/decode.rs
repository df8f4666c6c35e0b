//! Reading images as the reference does: EXIF orientation applied, decoding limits checked
//! from the header, transparency composited over white.

use super::*;

/// Loads an image file as 8-bit RGB, refusing it before decoding when it is empty or has more
/// than `max_pixels` pixels (see [`DEFAULT_MAX_PIXELS`]).
///
/// The format is detected from the content, not the extension. The EXIF orientation is applied
/// and transparency is flattened onto white (see the module documentation). Errors name the
/// file.
pub fn load_image(path: &Path, max_pixels: u64) -> Result<RgbImage, PreprocessError> {
    let what = path.display().to_string();
    let file = File::open(path).map_err(|source| PreprocessError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    decode_reader(BufReader::new(file), &what, max_pixels, Some(path))
}

/// Decodes an in-memory image (for example an HTTP upload) like [`load_image`]; `what` names
/// the image in error messages.
pub fn decode_image_bytes(
    bytes: &[u8],
    what: &str,
    max_pixels: u64,
) -> Result<RgbImage, PreprocessError> {
    decode_reader(Cursor::new(bytes), what, max_pixels, None)
}

pub(crate) fn decode_reader<R: BufRead + Seek>(
    reader: R,
    what: &str,
    max_pixels: u64,
    path: Option<&Path>,
) -> Result<RgbImage, PreprocessError> {
    let decode_err = |source: image::ImageError| PreprocessError::Decode {
        what: what.to_string(),
        source,
    };
    let mut reader =
        ImageReader::new(reader)
            .with_guessed_format()
            .map_err(|source| match path {
                Some(p) => PreprocessError::Io {
                    path: p.to_path_buf(),
                    source,
                },
                None => decode_err(image::ImageError::IoError(source)),
            })?;
    if reader.format().is_none() {
        return Err(PreprocessError::UnknownFormat {
            what: what.to_string(),
        });
    }
    // The pixel budget below is the real guard; this only lifts the decoder's default 512 MiB
    // allocation cap so that a 16-bit RGBA image within the budget still decodes.
    let mut limits = Limits::default();
    limits.max_alloc = Some(max_pixels.saturating_mul(16).max(512 << 20));
    reader.limits(limits);
    // Reads the header only.
    let mut decoder = reader.into_decoder().map_err(decode_err)?;
    let (width, height) = decoder.dimensions();
    if width == 0 || height == 0 {
        return Err(PreprocessError::Empty {
            what: what.to_string(),
            width,
            height,
        });
    }
    let pixels = u64::from(width) * u64::from(height);
    if pixels > max_pixels {
        return Err(PreprocessError::TooLarge {
            what: what.to_string(),
            width,
            height,
            pixels,
            max_pixels,
        });
    }
    // A malformed EXIF block must not make an otherwise good image unreadable.
    let orientation = decoder.orientation().unwrap_or(Orientation::NoTransforms);
    let mut img = DynamicImage::from_decoder(decoder).map_err(decode_err)?;
    img.apply_orientation(orientation);
    Ok(to_rgb_over_white(img))
}

/// Pillow's `DIV255`: `round(x / 255)` for `0 <= x <= 255 · 255`, in integers.
#[inline]
pub(crate) fn div255(x: u32) -> u8 {
    let t = x + 128;
    (((t >> 8) + t) >> 8) as u8
}

/// Pastes a colour value with alpha `a` onto opaque white like Pillow's `paste(im, box, mask)`.
#[inline]
pub(crate) fn over_white(c: u8, a: u8) -> u8 {
    let a = u32::from(a);
    div255(255 * (255 - a) + u32::from(c) * a)
}

/// Converts any decoded image to 8-bit RGB the way the reference does.
///
/// RGB8 is kept as is; grey is replicated; images with alpha are pasted onto white. 16-bit
/// samples keep their high byte (what Pillow does when it opens 16-bit RGB PNGs as "RGB";
/// Pillow opens 16-bit grey as "I;16" and would clip it instead, which is not reproduced).
/// Float images go through the `image` crate's conversion.
pub(crate) fn to_rgb_over_white(img: DynamicImage) -> RgbImage {
    let (w, h) = (img.width(), img.height());
    let from_rgba = |rgba: &[u8]| -> RgbImage {
        let raw = rgba
            .chunks_exact(4)
            .flat_map(|p| {
                let a = p[3];
                [
                    over_white(p[0], a),
                    over_white(p[1], a),
                    over_white(p[2], a),
                ]
            })
            .collect();
        RgbImage::from_raw(w, h, raw).unwrap_or_else(|| RgbImage::new(w, h))
    };
    let from_raw =
        |raw: Vec<u8>| RgbImage::from_raw(w, h, raw).unwrap_or_else(|| RgbImage::new(w, h));
    let hi = |v: u16| (v >> 8) as u8;
    match img {
        DynamicImage::ImageRgb8(i) => i,
        DynamicImage::ImageRgba8(i) => from_rgba(i.as_raw()),
        DynamicImage::ImageLuma8(i) => from_raw(i.as_raw().iter().flat_map(|&l| [l; 3]).collect()),
        DynamicImage::ImageLumaA8(i) => {
            let raw: Vec<u8> = i
                .as_raw()
                .chunks_exact(2)
                .flat_map(|p| [p[0], p[0], p[0], p[1]])
                .collect();
            from_rgba(&raw)
        }
        DynamicImage::ImageRgb16(i) => from_raw(i.as_raw().iter().map(|&v| hi(v)).collect()),
        DynamicImage::ImageRgba16(i) => {
            let raw: Vec<u8> = i.as_raw().iter().map(|&v| hi(v)).collect();
            from_rgba(&raw)
        }
        DynamicImage::ImageLuma16(i) => {
            from_raw(i.as_raw().iter().flat_map(|&l| [hi(l); 3]).collect())
        }
        DynamicImage::ImageLumaA16(i) => {
            let raw: Vec<u8> = i
                .as_raw()
                .chunks_exact(2)
                .flat_map(|p| {
                    let l = hi(p[0]);
                    [l, l, l, hi(p[1])]
                })
                .collect();
            from_rgba(&raw)
        }
        other => from_rgba(other.to_rgba8().as_raw()),
    }
}
