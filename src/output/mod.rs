//! The model's Markdown made into what users keep: [`figures`] (the bbox models' image
//! references with boxes cropped from the full-resolution page, the links rewritten to the
//! crops) and [`tables`] (HTML tables as Markdown pipe tables where they fit, `--tables`).
//! Both take a page's text as the model wrote it and leave everything else untouched.

pub mod figures;
pub mod tables;
