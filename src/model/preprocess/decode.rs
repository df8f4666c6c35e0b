//! Reading images as the reference does: EXIF orientation applied, decoding limits checked
//! from the header, transparency composited over white.

use super::*;
use image::ImageFormat;

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

/// PNG chunks whose payload is compressed and that decoding does not need: an ICC profile
/// (`iCCP`, not applied) and compressed text (`zTXt`, `iTXt`). The `png` crate inflates them up
/// to its whole allocation limit (a 1 MB PNG whose `iCCP` inflates to 1 GiB added 1 GB per
/// decode, and the header is read once more to plan the decode), and the `image` crate gives
/// no way to skip them.
const PNG_SKIPPED: [&[u8; 4]; 3] = [b"iCCP", b"zTXt", b"iTXt"];

/// `png` without its [`PNG_SKIPPED`] chunks (borrowed when it has none, or is not a PNG).
/// The rest is copied as it is, damaged chunks included, for the decoder to judge.
pub fn without_compressed_metadata(png: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    const SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
    if !png.starts_with(SIGNATURE) {
        return png.into();
    }
    // (start, end) of every chunk, up to the first one whose length runs past the end.
    let mut chunks = Vec::new();
    let mut at = SIGNATURE.len();
    while let Some(head) = png.get(at..at + 8) {
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let end = at.saturating_add(12).saturating_add(len);
        if end > png.len() {
            break;
        }
        chunks.push((at, end));
        at = end;
    }
    let skipped = |&(s, _): &(usize, usize)| PNG_SKIPPED.iter().any(|k| &png[s + 4..s + 8] == *k);
    if !chunks.iter().any(skipped) {
        return png.into();
    }
    let mut out = Vec::with_capacity(png.len());
    out.extend_from_slice(SIGNATURE);
    for c in chunks.iter().filter(|c| !skipped(c)) {
        out.extend_from_slice(&png[c.0..c.1]);
    }
    out.extend_from_slice(&png[at..]);
    out.into()
}

pub(crate) fn decode_reader<R: BufRead + Seek>(
    reader: R,
    what: &str,
    max_pixels: u64,
    path: Option<&Path>,
) -> Result<RgbImage, PreprocessError> {
    let io_err = |source: std::io::Error| match path {
        Some(p) => PreprocessError::Io {
            path: p.to_path_buf(),
            source,
        },
        None => PreprocessError::Decode {
            what: what.to_string(),
            source: image::ImageError::IoError(source),
        },
    };
    let reader = ImageReader::new(reader)
        .with_guessed_format()
        .map_err(io_err)?;
    match reader.format() {
        None => Err(PreprocessError::UnknownFormat {
            what: what.to_string(),
        }),
        // Read whole to leave out the chunks the decoder would inflate for nothing.
        Some(ImageFormat::Png) => {
            let mut bytes = Vec::new();
            reader
                .into_inner()
                .read_to_end(&mut bytes)
                .map_err(io_err)?;
            let png = without_compressed_metadata(&bytes);
            let reader = ImageReader::with_format(Cursor::new(&*png), ImageFormat::Png);
            decode_with(reader, what, max_pixels)
        }
        Some(_) => decode_with(reader, what, max_pixels),
    }
}

/// Decodes what `reader` holds (its format known), as [`decode_reader`] says.
fn decode_with<R: BufRead + Seek>(
    mut reader: ImageReader<R>,
    what: &str,
    max_pixels: u64,
) -> Result<RgbImage, PreprocessError> {
    let decode_err = |source: image::ImageError| PreprocessError::Decode {
        what: what.to_string(),
        source,
    };
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
