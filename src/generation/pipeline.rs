//! One page → one generation request: the part of LightOnOCR's recipe every command that
//! reads pages shares (`ocr`, `serve`, `eval`, `bench`, calibration), in one place.
//!
//! A [`PagePipeline`] is made from an opened [`Export`] (which read the prompt builder, the
//! image preprocessing and the stop ids) and adds the sampling defaults of its
//! `generation_config.json`. [`PagePipeline::prepare`] turns a decoded page into its pixels
//! and prompt ids; [`PagePipeline::sampling`] applies a caller's [`SamplingOverrides`] (CLI
//! flags, request fields) to the model's defaults, and [`PagePipeline::request`] (or
//! [`PagePipeline::request_with`] those values) makes the engine's request.
//!
//! ```no_run
//! use ocrctl::generation::pipeline::PagePipeline;
//! use ocrctl::model::export::Export;
//! let export = Export::open(std::path::Path::new("out/tiny"))?;
//! let pipeline = PagePipeline::new(std::sync::Arc::new(export))?;
//! let img = image::open("page.png")?.to_rgb8();
//! let req = pipeline.request(pipeline.prepare(&img)?, 1024);
//! println!("{} prompt tokens", req.prompt_ids.len());
//! # Ok::<(), anyhow::Error>(())
//! ```

use crate::generation::engine::GenRequest;
use crate::generation::sampling::{SamplingError, SamplingOverrides, SamplingParams};
use crate::model::export::Export;
use crate::model::preprocess::{self, Pixels, PreprocessConfig};
use crate::model::prompt::{PromptError, Prompter};
use image::RgbImage;
use std::sync::Arc;

/// Why an export's page recipe could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// `generation_config.json` holds an invalid value.
    #[error("{0}")]
    Defaults(String),
}

/// A page ready for the engine.
#[derive(Debug, Clone)]
pub struct PreparedPage {
    /// The prompt: the chat template around one run of image tokens.
    pub prompt_ids: Vec<u32>,
    /// `[1, 3, height, width]`.
    pub pixel_values: Pixels,
    /// Size after preprocessing, px.
    pub height: u32,
    pub width: u32,
    /// Image tokens in the prompt.
    pub image_tokens: usize,
}

/// What turns pages into requests for one export (see the module documentation).
pub struct PagePipeline {
    export: Arc<Export>,
    /// The export's preprocessing; a server lowers its longest edge to the profile's.
    pub preprocess: PreprocessConfig,
    /// Sampling defaults from `generation_config.json` (greedy when it has none).
    pub defaults: SamplingParams,
}

impl PagePipeline {
    /// The recipe of an opened export: its sampling defaults read from the generation config
    /// it holds (errors name the file).
    pub fn new(export: Arc<Export>) -> Result<PagePipeline, PipelineError> {
        let defaults = SamplingParams::defaults_of(
            export.generation_config.as_ref(),
            &export.generation_config_path(),
        )
        .map_err(PipelineError::Defaults)?;
        Ok(PagePipeline {
            preprocess: export.preprocess.clone(),
            defaults,
            export,
        })
    }

    /// The export this recipe was made from.
    pub fn export(&self) -> &Arc<Export> {
        &self.export
    }

    /// Chat template and tokenizer.
    pub fn prompter(&self) -> &Prompter {
        &self.export.prompter
    }

    /// End-of-sequence ids (`generation_config.json`, else the config's).
    pub fn stop_ids(&self) -> &[u32] {
        &self.export.stop_ids
    }

    /// The id of the placeholder token each image patch takes in a prompt.
    pub fn image_token_id(&self) -> u32 {
        self.export.config().image_token_id
    }

    /// Preprocesses a decoded page and builds its prompt (one image, no text).
    pub fn prepare(&self, img: &RgbImage) -> Result<PreparedPage, PromptError> {
        self.prepare_with(img, None)
    }

    /// [`PagePipeline::prepare`] with the user's `text` after the image, when given.
    pub fn prepare_with(
        &self,
        img: &RgbImage,
        text: Option<&str>,
    ) -> Result<PreparedPage, PromptError> {
        let p = preprocess::preprocess(img, &self.preprocess);
        let prompt_ids = self.prompter().encode(&[p.num_image_tokens], text)?;
        Ok(PreparedPage {
            prompt_ids,
            pixel_values: p.pixel_values,
            height: p.height,
            width: p.width,
            image_tokens: p.num_image_tokens,
        })
    }

    /// The model's defaults with a caller's `overrides` applied, checked (ranges, and
    /// `logit_bias`'s ids against the vocabulary): every caller's sampling goes through here.
    pub fn sampling(&self, overrides: &SamplingOverrides) -> Result<SamplingParams, SamplingError> {
        overrides.apply_checked(&self.defaults, self.export.config().text.vocab_size)
    }

    /// The engine's request for `page`: the model's sampling defaults and stop ids, at most
    /// `max_new_tokens` new tokens.
    pub fn request(&self, page: PreparedPage, max_new_tokens: usize) -> GenRequest {
        self.request_with(page, self.defaults.clone(), max_new_tokens)
    }

    /// [`PagePipeline::request`] sampled with `params` (from [`PagePipeline::sampling`]).
    pub fn request_with(
        &self,
        page: PreparedPage,
        params: SamplingParams,
        max_new_tokens: usize,
    ) -> GenRequest {
        self.prompt_request(
            page.prompt_ids,
            vec![page.pixel_values],
            params,
            max_new_tokens,
        )
    }

    /// The engine's request for a prompt already built (with one run of image tokens per
    /// entry of `images`), sampled with `params`, stopping at the model's stop ids.
    pub fn prompt_request(
        &self,
        prompt_ids: Vec<u32>,
        images: Vec<Pixels>,
        params: SamplingParams,
        max_new_tokens: usize,
    ) -> GenRequest {
        GenRequest {
            prompt_ids,
            images,
            params,
            max_new_tokens,
            stop_ids: self.export.stop_ids.clone(),
            ignore_eos: false,
            logprobs: false,
            top_logprobs: 0,
        }
    }

    /// A page's text from its generated ids, as `ocrctl ocr` prints it: the ids before the
    /// first stop id, special tokens skipped.
    pub fn text(&self, token_ids: &[u32]) -> Result<String, PromptError> {
        let end = token_ids
            .iter()
            .position(|t| self.stop_ids().contains(t))
            .unwrap_or(token_ids.len());
        self.prompter().decode(&token_ids[..end], true)
    }
}

/// A deterministic page-like image: light background with dark horizontal strokes (for
/// benchmarks and the server's warm-up, where any page of a size will do).
pub fn synthetic_page(width: u32, height: u32) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| {
        let line = (y / 18) % 3 != 0
            && (x / 7 + y / 18).wrapping_mul(2654435761u32) % 5 != 0
            && (y % 18) < 10;
        let v = if line {
            30
        } else {
            235 + ((x * 31 + y * 17) % 16) as u8
        };
        image::Rgb([v, v, v])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixture_page_becomes_the_request_the_reference_prompts_with() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("m");
        let opts = ocrctl_exporters::export::ExportOptions::new(
            "tests/fixtures/tiny-lightonocr/checkpoint".into(),
            dir.clone(),
        );
        let cfg = ocrctl_exporters::export::export(&opts, &mut |_| {})
            .unwrap()
            .model;
        let p = PagePipeline::new(Arc::new(Export::open(&dir).unwrap())).unwrap();
        let golden: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string("tests/fixtures/tiny-lightonocr/golden/golden.json").unwrap(),
        )
        .unwrap();
        let im = golden["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["file"].as_str().unwrap().ends_with(".png"))
            .unwrap();
        let img = image::open(
            std::path::Path::new("tests/fixtures/tiny-lightonocr")
                .join(im["file"].as_str().unwrap()),
        )
        .unwrap()
        .to_rgb8();
        let page = p.prepare(&img).unwrap();
        let want: Vec<u32> = im["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(page.prompt_ids, want);
        assert_eq!(
            page.prompt_ids
                .iter()
                .filter(|t| **t == cfg.image_token_id)
                .count(),
            page.image_tokens
        );
        let req = p.request(page, 7);
        assert_eq!(req.max_new_tokens, 7);
        assert_eq!(req.images.len(), 1);
        let gen: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("generation_config.json")).unwrap())
                .unwrap();
        let eos: Vec<u32> = gen["eos_token_id"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(req.stop_ids, eos, "generation_config.json's eos ids");
        assert_eq!(req.params, SamplingParams::model_defaults(&dir).unwrap());
    }
}
