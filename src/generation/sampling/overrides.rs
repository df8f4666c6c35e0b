//! The sampling values a caller gives — a chat request's body, `/v1/ocr`'s form fields,
//! `ocrctl ocr`'s flags — and the one rule that applies them to a model's defaults: a value
//! given replaces the default's, a value not given keeps it.

use super::{LoopGuard, SamplingError, SamplingParams};

/// Optional sampling values; `None` keeps the defaults' (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingOverrides {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Replaces the defaults' biases as a whole (sorted by id: [`super::logit_bias`]).
    pub logit_bias: Option<Vec<(u32, f32)>>,
    pub seed: Option<u64>,
    pub loop_guard: Option<LoopGuard>,
}

impl SamplingOverrides {
    /// `defaults` with every value given here in its place, unchecked.
    pub fn apply(&self, defaults: &SamplingParams) -> SamplingParams {
        let d = defaults;
        SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_p: self.top_p.unwrap_or(d.top_p),
            top_k: self.top_k.unwrap_or(d.top_k),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            logit_bias: match &self.logit_bias {
                Some(b) => b.clone(),
                None => d.logit_bias.clone(),
            },
            seed: self.seed.or(d.seed),
            loop_guard: self.loop_guard.or(d.loop_guard),
        }
    }

    /// [`SamplingOverrides::apply`], then checked: every range, and `logit_bias`'s ids
    /// against a vocabulary of `vocab` ids. Errors name the parameter at fault.
    pub fn apply_checked(
        &self,
        defaults: &SamplingParams,
        vocab: usize,
    ) -> Result<SamplingParams, SamplingError> {
        let s = self.apply(defaults);
        s.validate().and_then(|()| s.check_vocab(vocab))?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_given_replaces_the_default_and_one_not_given_keeps_it() {
        let d = SamplingParams {
            temperature: 0.2,
            top_p: 0.9,
            seed: Some(3),
            logit_bias: vec![(1, -100.0)],
            ..SamplingParams::greedy()
        };
        assert_eq!(SamplingOverrides::default().apply(&d), d);
        let o = SamplingOverrides {
            temperature: Some(0.0),
            top_k: Some(5),
            logit_bias: Some(vec![]),
            loop_guard: Some(LoopGuard::default()),
            ..Default::default()
        };
        let s = o.apply(&d);
        assert_eq!(
            (s.temperature, s.top_p, s.top_k, s.seed),
            (0.0, 0.9, 5, Some(3))
        );
        assert!(s.logit_bias.is_empty());
        assert_eq!(s.loop_guard, Some(LoopGuard::default()));
    }

    #[test]
    fn checked_values_name_the_parameter_at_fault() {
        let d = SamplingParams::greedy();
        let bad = |o: SamplingOverrides, vocab| o.apply_checked(&d, vocab).unwrap_err().param();
        let top_p = SamplingOverrides {
            top_p: Some(0.0),
            ..Default::default()
        };
        assert_eq!(bad(top_p, 10), "top_p");
        let bias = SamplingOverrides {
            logit_bias: Some(vec![(10, 1.0)]),
            ..Default::default()
        };
        assert_eq!(bad(bias.clone(), 10), "logit_bias");
        assert!(bias.apply_checked(&d, 11).is_ok());
    }
}
