//! Measuring an export against its reference: [`eval`] (`ocrctl eval`: logits and tokens of
//! one precision against another) and [`calibrate`] (activation statistics for AWQ-style int4).

pub mod calibrate;
pub mod eval;
