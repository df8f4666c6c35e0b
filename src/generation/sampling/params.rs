//! A request's sampling parameters ([`SamplingParams`]): their defaults, their ranges
//! ([`SamplingParams::validate`], errors naming the parameter) and how a model's
//! `generation_config.json` sets them.

use super::LoopGuard;
use serde::Serialize;
use serde_json::Value;

/// A sampling parameter of a request that is out of range or of the wrong type. Each
/// variant names the request parameter at fault (see [`SamplingError::param`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("temperature must be a finite number >= 0 (0 = greedy), got {got}")]
    Temperature { got: String },
    #[error("top_p must be a number in (0, 1], got {got}")]
    TopP { got: String },
    #[error("top_k must be an integer >= 0 (0 = off), got {got}")]
    TopK { got: String },
    #[error("repetition_penalty must be a finite number > 0 (1 = off), got {got}")]
    RepetitionPenalty { got: String },
    #[error("presence_penalty must be a number in [-2, 2] (0 = off), got {got}")]
    PresencePenalty { got: String },
    #[error("frequency_penalty must be a number in [-2, 2] (0 = off), got {got}")]
    FrequencyPenalty { got: String },
    #[error("logit_bias values must be numbers in [-100, 100], got {got} for token {id}")]
    LogitBias { id: u32, got: String },
    #[error("logit_bias names token {id}, outside the vocabulary of {vocab} ids")]
    LogitBiasToken { id: u32, vocab: usize },
    #[error("do_sample must be true or false, got {got}")]
    DoSample { got: String },
    #[error("loop_guard.{field} must be {expected}, got {got}")]
    LoopGuard {
        field: &'static str,
        expected: &'static str,
        got: usize,
    },
}

impl SamplingError {
    /// The request parameter at fault, e.g. `"top_p"` or `"loop_guard.window"`.
    pub fn param(&self) -> &'static str {
        match self {
            SamplingError::Temperature { .. } => "temperature",
            SamplingError::TopP { .. } => "top_p",
            SamplingError::TopK { .. } => "top_k",
            SamplingError::RepetitionPenalty { .. } => "repetition_penalty",
            SamplingError::PresencePenalty { .. } => "presence_penalty",
            SamplingError::FrequencyPenalty { .. } => "frequency_penalty",
            SamplingError::LogitBias { .. } | SamplingError::LogitBiasToken { .. } => "logit_bias",
            SamplingError::DoSample { .. } => "do_sample",
            SamplingError::LoopGuard { field, .. } => match *field {
                "window" => "loop_guard.window",
                _ => "loop_guard.max_repeats",
            },
        }
    }
}

/// How one request chooses its tokens. Build with [`SamplingParams::greedy`],
/// [`SamplingParams::from_generation_config`] or a struct literal, then check with
/// [`SamplingParams::validate`] (which [`Sampler::new`](super::Sampler::new) also does).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SamplingParams {
    /// `0` = greedy; otherwise logits are divided by it. Finite, `>= 0`.
    pub temperature: f32,
    /// Nucleus mass in `(0, 1]`; `1` = off.
    pub top_p: f32,
    /// Keep the `top_k` largest logits (ties at the boundary kept); `0` = off.
    pub top_k: usize,
    /// Repetition penalty, `> 0`; `1` = off. Applied in greedy mode too.
    pub repetition_penalty: f32,
    /// OpenAI's presence penalty in `[-2, 2]`: subtracted once from the logit of every id of
    /// the history; `0` = off. Applied in greedy mode too.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty in `[-2, 2]`: subtracted from an id's logit once per
    /// occurrence in the history; `0` = off. Applied in greedy mode too.
    pub frequency_penalty: f32,
    /// OpenAI's `logit_bias`: `(id, bias)` pairs, sorted by id, one per id, each bias in
    /// `[-100, 100]`, added to the id's raw logit before the penalties (vLLM's order);
    /// empty = off. Applied in greedy mode too. Build it with [`logit_bias`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of the request's generator; `None` picks a fresh one (see [`Sampler::seed`](super::Sampler::seed)).
    pub seed: Option<u64>,
    /// Stop runaway repetition (see [`LoopGuard`]); `None` = off.
    pub loop_guard: Option<LoopGuard>,
}

impl Default for SamplingParams {
    /// [`SamplingParams::greedy`].
    fn default() -> Self {
        SamplingParams::greedy()
    }
}

impl SamplingParams {
    /// Plain greedy decoding: temperature 0, no top-k/top-p, no penalty, no loop guard (what
    /// the parity tests against the reference use).
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
            loop_guard: None,
        }
    }

    /// Whether tokens are chosen by argmax (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Whether any penalty (repetition, presence, frequency) changes the logits of the
    /// history's ids.
    pub fn penalises(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// Whether anything changes the raw logits before temperature, top-k and top-p: a
    /// penalty or a logit bias (the device's argmax alone cannot choose then).
    pub fn modifies_logits(&self) -> bool {
        self.penalises() || !self.logit_bias.is_empty()
    }

    /// Checks that every id of `logit_bias` is below `vocab` (the model's vocabulary
    /// size, which [`SamplingParams::validate`] does not know).
    pub fn check_vocab(&self, vocab: usize) -> Result<(), SamplingError> {
        match self.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
            Some(&(id, _)) => Err(SamplingError::LogitBiasToken { id, vocab }),
            None => Ok(()),
        }
    }

    /// Checks every parameter; the error names the first one out of range.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(SamplingError::Temperature { got: t.to_string() });
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(SamplingError::TopP { got: p.to_string() });
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(SamplingError::RepetitionPenalty { got: r.to_string() });
        }
        let x = self.presence_penalty;
        if !(-2.0..=2.0).contains(&x) {
            return Err(SamplingError::PresencePenalty { got: x.to_string() });
        }
        let x = self.frequency_penalty;
        if !(-2.0..=2.0).contains(&x) {
            return Err(SamplingError::FrequencyPenalty { got: x.to_string() });
        }
        if let Some(&(id, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-100.0..=100.0).contains(b))
        {
            return Err(SamplingError::LogitBias {
                id,
                got: b.to_string(),
            });
        }
        if let Some(g) = &self.loop_guard {
            g.validate()?;
        }
        Ok(())
    }

    /// The sampling defaults of the model in `dir` (an export or a checkpoint): its
    /// `generation_config.json` as [`SamplingParams::from_generation_config`] reads it, or
    /// greedy when it has none — what `serve` and `ocr` both start from (requests and flags
    /// override single fields), as vLLM does. Errors name the file.
    pub fn model_defaults(dir: &std::path::Path) -> Result<Self, String> {
        let path = dir.join("generation_config.json");
        match std::fs::read_to_string(&path) {
            Ok(t) => {
                let v: Value = serde_json::from_str(&t)
                    .map_err(|e| format!("{}: invalid JSON: {e}", path.display()))?;
                SamplingParams::defaults_of(Some(&v), &path)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(SamplingParams::greedy()),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// The sampling defaults of a `generation_config.json` already read (`None`: the model
    /// has none, so greedy), as [`SamplingParams::model_defaults`] gives them; errors name
    /// `path`, the file it came from.
    pub fn defaults_of(json: Option<&Value>, path: &std::path::Path) -> Result<Self, String> {
        match json {
            Some(v) => SamplingParams::from_generation_config(v)
                .map_err(|e| format!("{}: {e}", path.display())),
            None => Ok(SamplingParams::greedy()),
        }
    }

    /// Reads a `generation_config.json` with transformers' semantics: `do_sample` false or
    /// absent → greedy (temperature, top-p and top-k are then ignored, as transformers
    /// does); otherwise `temperature` (default 1), `top_p` (default 1) and `top_k` (default
    /// 50 when absent, off when `0` or `null`). `repetition_penalty` (default 1) is read in
    /// both modes, since transformers applies it to greedy search too. A sampled config with
    /// `temperature: 0` becomes greedy (vLLM's reading; transformers rejects it). `seed` and
    /// `loop_guard` are `None`. The result is validated.
    pub fn from_generation_config(json: &Value) -> Result<Self, SamplingError> {
        let do_sample = match json.get("do_sample") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => return Err(SamplingError::DoSample { got: v.to_string() }),
        };
        let repetition_penalty = number(json, "repetition_penalty", 1.0, |got| {
            SamplingError::RepetitionPenalty { got }
        })?;
        let mut params = SamplingParams {
            repetition_penalty,
            ..SamplingParams::greedy()
        };
        if do_sample {
            params.temperature = number(json, "temperature", 1.0, |got| {
                SamplingError::Temperature { got }
            })?;
            params.top_p = number(json, "top_p", 1.0, |got| SamplingError::TopP { got })?;
            params.top_k = match json.get("top_k") {
                None => 50,
                Some(Value::Null) => 0,
                Some(v) => integer(v).ok_or_else(|| SamplingError::TopK { got: v.to_string() })?,
            };
        }
        params.validate()?;
        Ok(params)
    }
}

/// A `logit_bias` as [`SamplingParams::logit_bias`] holds it: sorted by id, the last bias
/// given for an id winning (as a JSON object's last duplicate key does).
pub fn logit_bias(pairs: impl IntoIterator<Item = (u32, f32)>) -> Vec<(u32, f32)> {
    let mut v: Vec<(u32, f32)> = pairs.into_iter().collect();
    // Stable: equal ids keep their order, so the last one given is the last of its run.
    v.sort_by_key(|p| p.0);
    let mut out: Vec<(u32, f32)> = Vec::with_capacity(v.len());
    for p in v {
        match out.last_mut() {
            Some(last) if last.0 == p.0 => *last = p,
            _ => out.push(p),
        }
    }
    out
}

/// A JSON number field as `f32`: `default` when absent or null, the error otherwise.
fn number(
    json: &Value,
    key: &str,
    default: f32,
    err: impl Fn(String) -> SamplingError,
) -> Result<f32, SamplingError> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| err(v.to_string())),
    }
}

/// A non-negative integer (an integral float such as `50.0` too).
fn integer(v: &Value) -> Option<usize> {
    if let Some(u) = v.as_u64() {
        return usize::try_from(u).ok();
    }
    let f = v.as_f64()?;
    (f >= 0.0 && f.fract() == 0.0 && f <= usize::MAX as f64).then_some(f as usize)
}

#[cfg(test)]
mod tests {
    use super::super::Sampler;
    use super::*;

    #[test]
    fn model_defaults_come_from_generation_config_or_are_greedy() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            SamplingParams::model_defaults(d.path()).unwrap(),
            SamplingParams::greedy()
        );
        let f = d.path().join("generation_config.json");
        std::fs::write(
            &f,
            r#"{"do_sample": true, "temperature": 0.2, "top_p": 0.9, "top_k": 0}"#,
        )
        .unwrap();
        let p = SamplingParams::model_defaults(d.path()).unwrap();
        assert_eq!((p.temperature, p.top_p, p.top_k), (0.2, 0.9, 0));
        std::fs::write(&f, "{").unwrap();
        let e = SamplingParams::model_defaults(d.path()).unwrap_err();
        assert!(e.contains("generation_config.json: invalid JSON"), "{e}");
    }

    #[test]
    fn validation_names_the_parameter() {
        let ok = SamplingParams::greedy();
        assert!(ok.validate().is_ok());
        let cases: Vec<(SamplingParams, &str)> = vec![
            (
                SamplingParams {
                    temperature: -0.1,
                    ..ok.clone()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    temperature: f32::INFINITY,
                    ..ok.clone()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    top_p: 0.0,
                    ..ok.clone()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    top_p: 1.5,
                    ..ok.clone()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    top_p: f32::NAN,
                    ..ok.clone()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..ok.clone()
                },
                "repetition_penalty",
            ),
            (
                SamplingParams {
                    loop_guard: Some(LoopGuard {
                        window: 0,
                        max_repeats: 8,
                    }),
                    ..ok.clone()
                },
                "loop_guard.window",
            ),
            (
                SamplingParams {
                    loop_guard: Some(LoopGuard {
                        window: 64,
                        max_repeats: 1,
                    }),
                    ..ok.clone()
                },
                "loop_guard.max_repeats",
            ),
        ];
        for (p, name) in cases {
            let e = p.validate().unwrap_err();
            assert_eq!(e.param(), name);
            assert!(e.to_string().starts_with(name), "{e}");
            assert_eq!(Sampler::new(p).unwrap_err(), e);
        }
        let e = SamplingParams { top_p: 1.5, ..ok }.validate().unwrap_err();
        assert_eq!(e.to_string(), "top_p must be a number in (0, 1], got 1.5");
    }

    #[test]
    fn generation_config_follows_transformers() {
        use serde_json::json;
        let greedy = SamplingParams::greedy();
        let read = |v: Value| SamplingParams::from_generation_config(&v);
        // LightOnOCR's config has no sampling keys: greedy.
        assert_eq!(
            read(json!({"bos_token_id": 2, "eos_token_id": 1})).unwrap(),
            greedy
        );
        assert_eq!(
            read(json!({"do_sample": false, "temperature": 0.7, "top_k": 5})).unwrap(),
            greedy
        );
        let p = read(json!({"do_sample": true, "temperature": 0.2, "top_p": 0.9})).unwrap();
        assert_eq!((p.temperature, p.top_p, p.top_k), (0.2, 0.9, 50));
        let p = read(json!({"do_sample": true})).unwrap();
        assert_eq!((p.temperature, p.top_p, p.top_k), (1.0, 1.0, 50));
        assert_eq!(
            read(json!({"do_sample": true, "top_k": 0})).unwrap().top_k,
            0
        );
        assert_eq!(
            read(json!({"do_sample": true, "top_k": null}))
                .unwrap()
                .top_k,
            0
        );
        assert_eq!(
            read(json!({"do_sample": true, "top_k": 20.0}))
                .unwrap()
                .top_k,
            20
        );
        let p = read(json!({"repetition_penalty": 1.15})).unwrap();
        assert!(p.is_greedy());
        assert_eq!(p.repetition_penalty, 1.15);
        let err = |v: Value| read(v).unwrap_err().param();
        assert_eq!(err(json!({"do_sample": true, "top_k": -1})), "top_k");
        assert_eq!(err(json!({"do_sample": true, "top_k": 2.5})), "top_k");
        assert_eq!(
            err(json!({"do_sample": true, "temperature": "hot"})),
            "temperature"
        );
        assert_eq!(
            err(json!({"do_sample": true, "temperature": -1})),
            "temperature"
        );
        assert_eq!(err(json!({"do_sample": true, "top_p": 0})), "top_p");
        assert_eq!(err(json!({"do_sample": "yes"})), "do_sample");
        assert_eq!(err(json!({"repetition_penalty": -1})), "repetition_penalty");
    }
}
