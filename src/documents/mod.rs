//! Where pages come from: [`inputs`] (files, folders and patterns → documents of pages,
//! `--shard`, lazy page loading), [`pdf`] (pdfium: finding, loading, rendering pages) and
//! [`ranges`] (`--pages 1-3,7`).

pub mod inputs;
pub mod pdf;
pub mod ranges;
