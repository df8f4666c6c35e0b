//! `/v1/ocr?figures=true`: the bbox models' boxed figures cropped from the upload's pages at
//! full resolution ([`crate::output::figures`]) and returned as PNG data URLs.
//!
//! Only pages whose text holds a boxed reference are loaded again: a PDF page rendered at
//! 200 DPI without the model's 1540-px cap (within the server's pixel budget), an image
//! decoded as it was (EXIF orientation applied). Each reference becomes
//! `![alt](page-P-figure-N.png)`, the name under which the page's `figures` carry the crop.

use super::ocr_pages::{Figures, PageResult};
use super::AppState;
use crate::documents::pdf;
use crate::documents::pdf::sandbox::{OpenPdf, PdfReader};
use crate::model::preprocess;
use crate::output::figures;
use crate::output::figures::boxes::Adjustment;
use crate::output::figures::Figure;
use crate::server::error::ApiError;
use base64::Engine as _;
use serde::Serialize;

/// A figure of a page's `figures`: the [`Figure`]'s fields with, when it was cropped, the
/// crop as a PNG data URL and the name its link now points to. Fields are in alphabetical
/// order, as `serde_json`'s map wrote them when this was built as one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FigureEntry {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub adjusted: Vec<Adjustment>,
    #[serde(rename = "box", skip_serializing_if = "Option::is_none")]
    pub pixels: Option<[u32; 4]>,
    pub box_1000: [f64; 4],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub figure: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    pub source: String,
}

impl FigureEntry {
    /// `f`'s entry, its crop (if any) as a data URL named `file`.
    fn new(f: Figure, png: Option<Vec<u8>>, file: String) -> FigureEntry {
        let data_url = png.map(|png| {
            let b64 = base64::engine::general_purpose::STANDARD.encode(png);
            format!("data:image/png;base64,{b64}")
        });
        FigureEntry {
            adjusted: f.adjusted,
            pixels: f.pixels,
            box_1000: f.box_1000,
            file: if data_url.is_some() {
                Some(file)
            } else {
                f.file
            },
            data_url,
            error: f.error,
            figure: f.figure,
            source: f.source,
        }
    }
}

/// Crops the figures of an upload's `results` off the async runtime (rendering a page is
/// blocking work) and rewrites their texts; one `figures` array per page, in order.
pub(super) async fn crop_results(
    st: &AppState,
    bytes: bytes::Bytes,
    name: String,
    results: &mut [PageResult],
) -> Result<Figures, ApiError> {
    let numbers: Vec<usize> = results.iter().map(|r| r.number).collect();
    let mut texts: Vec<String> = results
        .iter_mut()
        .map(|r| std::mem::take(&mut r.text))
        .collect();
    let max_pixels = st.cfg.max_pixels;
    let reader = st.pdf.clone();
    let (texts, figs) = tokio::task::spawn_blocking(move || {
        let figs = crop_pages(&reader, &bytes, &name, &numbers, &mut texts, max_pixels);
        (texts, figs)
    })
    .await
    .map_err(|e| ApiError::Engine(format!("figures task failed: {e}")))?;
    for (r, t) in results.iter_mut().zip(texts) {
        r.text = t;
    }
    figs
}

/// Rewrites `texts` (one per page read; `numbers` their 1-based page numbers in the upload
/// `bytes`, named `name`, a PDF read by `reader`) and returns each page's `figures` array
/// (empty for a page without boxes).
pub fn crop_pages(
    reader: &PdfReader,
    bytes: &[u8],
    name: &str,
    numbers: &[usize],
    texts: &mut [String],
    max_pixels: u64,
) -> Result<Figures, ApiError> {
    let mut doc: Option<OpenPdf> = None;
    let mut out = Vec::with_capacity(texts.len());
    for (text, &number) in texts.iter_mut().zip(numbers) {
        if !figures::has_figures(text) {
            out.push(Vec::new());
            continue;
        }
        let page = if pdf::is_pdf(bytes) {
            if doc.is_none() {
                doc = Some(reader.open(bytes.to_vec(), name).map_err(engine_error)?);
            }
            let d = doc.as_mut().expect("opened above");
            d.render_page_full(number - 1, max_pixels)
                .map_err(engine_error)?
        } else {
            preprocess::decode_image_bytes(bytes, name, max_pixels)
                .map_err(|e| ApiError::bad("file", e.to_string()))?
        };
        let got = figures::crop_figures(text, &page, |n| figures::file_name(number, n));
        let mut figs = Vec::with_capacity(got.figures.len());
        for mut f in got.figures {
            let png = match f.crop.take() {
                Some(crop) => Some(
                    figures::png_bytes(&crop)
                        .map_err(|e| ApiError::Engine(format!("{name}: encoding a figure: {e}")))?,
                ),
                None => None,
            };
            let file = figures::file_name(number, f.figure);
            figs.push(FigureEntry::new(f, png, file));
        }
        *text = got.text;
        out.push(figs);
    }
    Ok(out)
}

/// The upload was read once already: a failure now is the server's.
fn engine_error(e: pdf::PdfError) -> ApiError {
    ApiError::Engine(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{Rgb, RgbImage};
    use serde_json::json;

    fn in_process() -> PdfReader {
        PdfReader::InProcess(None)
    }

    #[test]
    fn an_uploaded_image_gives_its_figure_pixel_exact_as_a_data_url() {
        let mut img = RgbImage::from_pixel(2000, 1500, Rgb([255, 255, 255]));
        for y in 300..1200 {
            for x in 500..1200 {
                img.put_pixel(x, y, Rgb([0, 0, 255]));
            }
        }
        let png = figures::png_bytes(&img).unwrap();
        let mut texts = vec!["A ![image](image_1.png) 250,200,600,800 b".to_string()];
        let figs = crop_pages(&in_process(), &png, "page.png", &[1], &mut texts, 1 << 30).unwrap();
        let figs = serde_json::to_value(figs).unwrap();
        assert_eq!(texts[0], "A ![image](page-1-figure-1.png) b");
        let f = &figs[0][0];
        assert_eq!(f["box"], json!([500, 300, 1200, 1200]));
        assert_eq!(f["file"], "page-1-figure-1.png");
        let url = f["data_url"].as_str().unwrap();
        let b64 = url.strip_prefix("data:image/png;base64,").unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        let crop = image::load_from_memory(&bytes).unwrap().to_rgb8();
        assert_eq!(crop.dimensions(), (700, 900));
        assert!(crop.pixels().all(|p| p.0 == [0, 0, 255]));
        // A page without boxes is neither loaded nor changed.
        let mut plain = vec!["no figures".to_string()];
        let figs = crop_pages(&in_process(), b"", "x", &[1], &mut plain, 1).unwrap();
        assert_eq!(serde_json::to_value(figs).unwrap(), json!([[]]));
        assert_eq!(plain[0], "no figures");
    }

    /// The bytes of an entry, as they were when built as a `serde_json` map.
    #[test]
    fn entries_keep_their_bytes() {
        let f = Figure {
            figure: 1,
            source: "image_1.png".into(),
            box_1000: [1.0, 2.0, 3.5, 4.0],
            pixels: Some([1, 2, 3, 4]),
            adjusted: vec![Adjustment::Clamped],
            error: None,
            file: None,
            crop: None,
        };
        let name = || figures::file_name(1, 1);
        let cropped = FigureEntry::new(f.clone(), Some(b"x".to_vec()), name());
        assert_eq!(
            serde_json::to_string(&cropped).unwrap(),
            r#"{"adjusted":["clamped"],"box":[1,2,3,4],"box_1000":[1.0,2.0,3.5,4.0],"data_url":"data:image/png;base64,eA==","figure":1,"file":"page-1-figure-1.png","source":"image_1.png"}"#
        );
        let failed = Figure {
            pixels: None,
            adjusted: vec![],
            error: Some("no area".into()),
            ..f
        };
        assert_eq!(
            serde_json::to_string(&FigureEntry::new(failed, None, name())).unwrap(),
            r#"{"box_1000":[1.0,2.0,3.5,4.0],"error":"no area","figure":1,"source":"image_1.png"}"#
        );
    }
}
