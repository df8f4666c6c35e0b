//! `/v1/ocr?figures=true`: the bbox models' boxed figures cropped from the upload's pages at
//! full resolution ([`crate::output::figures`]) and returned as PNG data URLs.
//!
//! Only pages whose text holds a boxed reference are loaded again: a PDF page rendered at
//! 200 DPI without the model's 1540-px cap (within the server's pixel budget), an image
//! decoded as it was (EXIF orientation applied). Each reference becomes
//! `![alt](page-P-figure-N.png)`, the name under which the page's `figures` carry the crop.

use super::ocr_pages::PageResult;
use super::AppState;
use crate::documents::pdf;
use crate::documents::pdf::sandbox::{OpenPdf, PdfReader};
use crate::model::preprocess;
use crate::output::figures;
use crate::server::error::ApiError;
use base64::Engine as _;
use serde_json::{json, Value};

/// Crops the figures of an upload's `results` off the async runtime (rendering a page is
/// blocking work) and rewrites their texts; one `figures` array per page, in order.
pub(super) async fn crop_results(
    st: &AppState,
    bytes: bytes::Bytes,
    name: String,
    results: &mut [PageResult],
) -> Result<Vec<Value>, ApiError> {
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
) -> Result<Vec<Value>, ApiError> {
    let mut doc: Option<OpenPdf> = None;
    let mut out = Vec::with_capacity(texts.len());
    for (text, &number) in texts.iter_mut().zip(numbers) {
        if !figures::has_figures(text) {
            out.push(json!([]));
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
            let crop = f.crop.take();
            let mut v = json!(f);
            if let Some(crop) = crop {
                let png = figures::png_bytes(&crop)
                    .map_err(|e| ApiError::Engine(format!("{name}: encoding a figure: {e}")))?;
                v["file"] = json!(figures::file_name(number, f.figure));
                v["data_url"] = json!(format!(
                    "data:image/png;base64,{}",
                    base64::engine::general_purpose::STANDARD.encode(png)
                ));
            }
            figs.push(v);
        }
        *text = got.text;
        out.push(Value::Array(figs));
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
        assert_eq!(
            crop_pages(&in_process(), b"", "x", &[1], &mut plain, 1).unwrap(),
            vec![json!([])]
        );
        assert_eq!(plain[0], "no figures");
    }
}
