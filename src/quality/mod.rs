//! Measuring an export: [`eval`] (`ocrctl eval`: logits and tokens of one precision against
//! another), [`cer`] and [`truth`] (`ocrctl eval --truth`: character and word error rates
//! against expected texts) and [`calibrate`] (activation statistics for AWQ-style int4).

pub mod calibrate;
pub mod cer;
pub mod eval;
pub mod truth;
