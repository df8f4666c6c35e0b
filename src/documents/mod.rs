//! Where pages come from: [`inputs`] (files, folders and patterns → documents of pages,
//! `--shard`, lazy page loading) and [`pdf`] (pdfium: finding, loading, rendering pages).

pub mod inputs;
pub mod pdf;
