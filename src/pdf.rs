//! Placeholder replaced by the pdfium module.
use std::path::Path;
pub fn is_pdf(bytes: &[u8]) -> bool {
    bytes.starts_with(b"%PDF-")
}
pub fn render_pdf(_: &[u8], name: &str, _: Option<&Path>) -> Result<Vec<image::RgbImage>, String> {
    Err(format!("{name}: PDF support is not built"))
}
