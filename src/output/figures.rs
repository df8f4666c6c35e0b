//! Figures from the bbox models: each image reference with a box ([`boxes`]) is cropped from
//! the full-resolution page and its link rewritten to the crop.
//!
//! The model saw the page resized (stretched to multiples of 28 px, never padded), so a box
//! in thousandths of that image is the same fraction of the page at any resolution: the crop
//! comes from the original image (after its EXIF orientation) or the PDF page rendered at the
//! document's DPI, not from the 1540-px copy the model read. [`crop_figures`] is what
//! `ocrctl ocr --figures` and `/v1/ocr?figures=true` run on each page's text.

pub mod boxes;

use boxes::{Adjustment, BoxedImage};
use image::RgbImage;

/// One boxed image reference of a page and its crop.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Figure {
    /// 1-based number among the page's boxed references, in text order.
    pub figure: usize,
    /// The link target the model wrote (`image_1.png`).
    pub source: String,
    /// The box as written, `x1, y1, x2, y2` in thousandths of the page.
    pub box_1000: [f64; 4],
    /// The box in page pixels, `[left, top, right, bottom]` (right and bottom exclusive);
    /// absent when it could not be cropped.
    #[serde(rename = "box", skip_serializing_if = "Option::is_none")]
    pub pixels: Option<[u32; 4]>,
    /// What was changed to make the written box usable.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub adjusted: Vec<Adjustment>,
    /// Why the box could not be cropped (its text is then left as written).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Where the caller put the crop (a file, a data URL); set by the caller.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The cropped pixels.
    #[serde(skip)]
    pub crop: Option<RgbImage>,
}

/// A page's text with its figures' links rewritten, and the figures.
#[derive(Debug, Clone)]
pub struct PageFigures {
    /// The text, each cropped reference now `![alt](link)` without its box.
    pub text: String,
    /// Every boxed reference, cropped or not (see [`Figure::error`]).
    pub figures: Vec<Figure>,
}

/// Whether `text` holds an image reference with a box (then the page is worth loading).
pub fn has_figures(text: &str) -> bool {
    !boxes::find(text).is_empty()
}

/// Crops every boxed image reference of `text` from `page` (the full-resolution page) and
/// rewrites each to `![alt](LINK)`, `LINK` being `link(n)` for the n-th (1-based) figure,
/// written `<…>` when it holds spaces or parentheses (CommonMark). A box with no area within
/// the page is reported in its [`Figure::error`] and its text left as written. Everything
/// else in `text` is kept byte for byte.
pub fn crop_figures(
    text: &str,
    page: &RgbImage,
    mut link: impl FnMut(usize) -> String,
) -> PageFigures {
    let mut out = String::with_capacity(text.len());
    let mut figures = Vec::new();
    let mut copied = 0;
    for (i, b) in boxes::find(text).into_iter().enumerate() {
        let n = i + 1;
        out.push_str(&text[copied..b.span.start]);
        copied = b.span.end;
        let fig = crop_one(&b, n, page);
        if fig.crop.is_some() {
            out.push_str(&format!("![{}]({})", b.alt, link_target(&link(n))));
        } else {
            out.push_str(&text[b.span.clone()]);
        }
        figures.push(fig);
    }
    out.push_str(&text[copied..]);
    PageFigures { text: out, figures }
}

/// Figure `n` of reference `b`, cropped from `page` when its box has an area.
fn crop_one(b: &BoxedImage<'_>, n: usize, page: &RgbImage) -> Figure {
    let mut fig = Figure {
        figure: n,
        source: b.target.to_string(),
        box_1000: b.written,
        pixels: None,
        adjusted: Vec::new(),
        error: None,
        file: None,
        crop: None,
    };
    match boxes::normalise(b.written) {
        Ok((norm, adjusted)) => {
            let [l, t, r, btm] = boxes::to_pixels(norm, page.width(), page.height());
            fig.crop = Some(image::imageops::crop_imm(page, l, t, r - l, btm - t).to_image());
            fig.pixels = Some([l, t, r, btm]);
            fig.adjusted = adjusted;
        }
        Err(e) => fig.error = Some(e.to_string()),
    }
    fig
}

/// `link` as a Markdown link destination: in `<…>` when it holds a space or parenthesis.
fn link_target(link: &str) -> String {
    if link.contains([' ', '(', ')', '\t']) {
        format!("<{link}>")
    } else {
        link.to_string()
    }
}

/// `page-P-figure-N.png`: the file name of figure `n` of page `page` (1-based, in the file).
pub fn file_name(page: usize, n: usize) -> String {
    format!("page-{page}-figure-{n}.png")
}

/// `crop` as PNG bytes.
pub fn png_bytes(crop: &RgbImage) -> Result<Vec<u8>, image::ImageError> {
    let mut buf = std::io::Cursor::new(Vec::new());
    crop.write_to(&mut buf, image::ImageFormat::Png)?;
    Ok(buf.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::Rgb;

    /// A white `w × h` page with a red rectangle over `[l, t, r, b)` and a blue pixel at each
    /// of its inner corners (so an off-by-one crop differs).
    fn page_with_rect(w: u32, h: u32, [l, t, r, b]: [u32; 4]) -> RgbImage {
        let mut img = RgbImage::from_pixel(w, h, Rgb([255, 255, 255]));
        for y in t..b {
            for x in l..r {
                img.put_pixel(x, y, Rgb([200, 30, 30]));
            }
        }
        for (x, y) in [(l, t), (r - 1, t), (l, b - 1), (r - 1, b - 1)] {
            img.put_pixel(x, y, Rgb([0, 0, 255]));
        }
        img
    }

    #[test]
    fn a_drawn_rectangle_is_cropped_pixel_exact_and_its_link_rewritten() {
        // 2000 × 1500 px: the box 250,200,600,800 is x 500..1200, y 300..1200.
        let rect = [500, 300, 1200, 1200];
        let page = page_with_rect(2000, 1500, rect);
        let text = "# Title\n\nSome text.\n\n![image](image_1.png) 250,200,600,800\n\nAfter.";
        let got = crop_figures(text, &page, |n| format!("scan/page-1-figure-{n}.png"));
        assert_eq!(
            got.text,
            "# Title\n\nSome text.\n\n![image](scan/page-1-figure-1.png)\n\nAfter."
        );
        assert_eq!(got.figures.len(), 1);
        let f = &got.figures[0];
        assert_eq!(f.pixels, Some(rect));
        assert_eq!(f.source, "image_1.png");
        let crop = f.crop.as_ref().unwrap();
        let expected = image::imageops::crop_imm(&page, 500, 300, 700, 900).to_image();
        assert_eq!(crop.dimensions(), (700, 900));
        assert!(crop == &expected);
        // Every pixel of the crop is the rectangle: no white border, blue corners in place.
        assert!(crop.pixels().all(|p| p.0 != [255, 255, 255]));
        assert_eq!(crop.get_pixel(0, 0).0, [0, 0, 255]);
        assert_eq!(crop.get_pixel(699, 899).0, [0, 0, 255]);
    }

    #[test]
    fn several_figures_unusable_boxes_and_the_text_around_them() {
        let page = page_with_rect(1000, 1000, [0, 0, 10, 10]);
        let text = "a ![image](image_1.png)100,100,200,200 b\n![image](image_2.png) 5,5,5,9 \
                    c ![image](image_3.png) 900,900,1200,-50 ![plain](x.png) d";
        let got = crop_figures(text, &page, |n| format!("my scan/f{n}.png"));
        assert_eq!(
            got.text,
            "a ![image](<my scan/f1.png>) b\n![image](image_2.png) 5,5,5,9 \
             c ![image](<my scan/f3.png>) ![plain](x.png) d"
        );
        let f = &got.figures;
        assert_eq!(f.len(), 3);
        assert_eq!(f[0].pixels, Some([100, 100, 200, 200]));
        assert!(f[1].crop.is_none() && f[1].pixels.is_none());
        assert!(
            f[1].error.as_deref().unwrap().contains("no area"),
            "{:?}",
            f[1].error
        );
        assert_eq!(f[2].pixels, Some([900, 0, 1000, 900]));
        assert_eq!(
            f[2].adjusted,
            vec![Adjustment::Clamped, Adjustment::Swapped]
        );
        let v = serde_json::to_value(&f[2]).unwrap();
        assert_eq!(v["box"], serde_json::json!([900, 0, 1000, 900]));
        assert_eq!(v["adjusted"], serde_json::json!(["clamped", "swapped"]));
        assert_eq!(
            v["box_1000"],
            serde_json::json!([900.0, 900.0, 1200.0, -50.0])
        );
    }

    #[test]
    fn text_without_boxes_is_kept_byte_for_byte() {
        let page = RgbImage::new(4, 4);
        let text = "![image](image_1.png)\n| a | b |\n![x](y) 1,2,3";
        assert!(!has_figures(text));
        let got = crop_figures(text, &page, |_| unreachable!());
        assert_eq!(got.text, text);
        assert!(got.figures.is_empty());
    }

    #[test]
    fn crops_encode_as_png() {
        let crop = page_with_rect(6, 4, [1, 1, 5, 3]);
        let png = png_bytes(&crop).unwrap();
        let back = image::load_from_memory(&png).unwrap().to_rgb8();
        assert!(back == crop);
    }
}
