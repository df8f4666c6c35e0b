//! The `ocrctl` commands, one module each (`export`, `ocr`, `eval`, `bench`, `profiles`,
//! `serve`, `doctor`, `verify`, `build-engines`), over the library; [`common`] holds the runtime flags they share
//! (`--profile`, `--precision`, `--providers`, …) and error reporting, [`ocr_output`] the
//! in-order writing of `ocrctl ocr`, [`ocr_outcome`] its page-outcome flags and exit codes,
//! [`ocr_open`] its documents, [`ocr_post`] its `--figures` and `--tables`, [`pdf_limits`] the PDF worker limits of `ocr`
//! and `serve`.

pub mod bench;
pub mod build_engines;
pub mod common;
pub mod doctor;
pub mod eval;
pub mod eval_truth;
pub mod export;
pub mod hub_fetch;
pub mod logging;
pub mod malloc;
pub mod ocr;
pub mod ocr_open;
pub mod ocr_outcome;
pub mod ocr_output;
pub mod ocr_post;
pub mod pdf_limits;
pub mod profiles;
pub mod serve;
pub mod verify;
