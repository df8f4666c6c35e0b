//! `POST /v1/ocr`: a multipart upload (an image or a PDF and optional sampling fields) to
//! markdown, JSON pages or a text stream; pages that did not finish are retried and marked
//! ([`super::ocr_pages`]).

use super::ocr_figures;
use super::ocr_pages::{self, OutcomeFields, PageJob};
use super::ocr_window::{self, First, Plan};
use super::*;
use std::ops::ControlFlow;

/// Query of `/v1/ocr`.
#[derive(Debug, serde::Deserialize, Default)]
pub struct OcrQuery {
    /// `markdown` (default) or `json`.
    format: Option<String>,
    /// Stream the markdown as it is generated (chunked `text/markdown`).
    #[serde(default)]
    stream: bool,
    /// Crop the bbox models' boxed figures, returned as data URLs (`format=json`).
    #[serde(default)]
    figures: bool,
}

pub(crate) fn field_num<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, ApiError> {
    v.trim()
        .parse()
        .map_err(|_| ApiError::bad(name, format!("{name} must be a number, got {v:?}")))
}

/// The form's `logit_bias` field: the same JSON object as a chat request's.
fn form_logit_bias(text: &str) -> Result<Vec<(u32, f32)>, ApiError> {
    let map = serde_json::from_str(text).map_err(|e| {
        ApiError::bad(
            "logit_bias",
            format!("logit_bias must be a JSON object of token ids to numbers: {e}"),
        )
    })?;
    crate::server::openai::request::parse_logit_bias(map)
}

/// `POST /v1/ocr`: multipart with a `file` (image or PDF) and optional `max_tokens`,
/// `temperature`, `top_p`, `top_k`, `repetition_penalty`, `presence_penalty`,
/// `frequency_penalty`, `logit_bias` (a JSON object, as in a chat request), `seed`, `prompt`,
/// `pages`, `retries` and `accept_length` fields. The pages are read through
/// [`ocr_window`]: a few rendered, queued or running at a time, up to `max_pages_per_request`.
pub async fn ocr(
    State(st): St,
    Query(q): Query<OcrQuery>,
    permit: Option<Extension<super::super::front::BodyPermit>>,
    mp: Result<Multipart, MultipartRejection>,
) -> Result<Response, ApiError> {
    let accepted = Instant::now();
    let json_out = json_format(q.format.as_deref())?;
    let form = read_form(&st, mp).await?;
    let policy = form.outcome.policy(q.stream)?;
    let (name, bytes) = form.file()?;
    check_text_bytes(&st, form.prompt.as_ref().map_or(0, String::len), "prompt")?;
    st.ready()?;
    let plan = Plan {
        max_tokens: form.overrides.max_tokens(&st)?,
        params: form.overrides.sampling(&st)?,
        policy,
        prompt: form.prompt,
    };
    if q.figures && (q.stream || !json_out) {
        return Err(ApiError::bad(
            "figures",
            "figures=true returns the crops in JSON: use it with format=json, without stream",
        ));
    }
    // `Bytes`: the clone shares the upload, read again only for pages with boxed figures.
    let figures_src = q.figures.then(|| (bytes.clone(), name.clone()));
    let doc = Upload {
        name,
        bytes,
        ranges: form.ranges,
    };
    let mut doc = ocr_window::open(st.clone(), doc, page_limit(&st)).await?;
    // The body's share of the memory for bodies, given back once every page is rendered.
    doc.body = permit.map(|Extension(p)| p);
    let total = doc.pages();
    let first = First::Refuse { since: accepted };
    let mut rx = ocr_window::queue_pages(st.clone(), doc, Arc::new(plan), new_id("ocr"), first);
    if q.stream {
        // The first page's error (a prompt too long, a full queue) is the request's.
        let Some(mut first) = rx.recv().await else {
            return Ok(ocr_pages::respond(&st, &[], false, None));
        };
        if let Some(e) = first.take_error() {
            return Err(e);
        }
        return Ok(ocr_pages::stream(st.clone(), first, rx, policy, total));
    }
    let mut results = all_pages(&st, rx, policy).await?;
    let figures = match figures_src {
        Some((bytes, name)) => {
            Some(ocr_figures::crop_results(&st, bytes, name, &mut results).await?)
        }
        None => None,
    };
    Ok(ocr_pages::respond(&st, &results, json_out, figures))
}

/// `/v1/ocr`'s page limit: the profile's `max_pages_per_request` or the flag's.
fn page_limit(st: &AppState) -> ocr_window::PageLimit {
    ocr_window::PageLimit {
        max: st.cfg.max_pages,
        per: "per request (serve --max-pages-per-request, the profile's max_pages_per_request)",
    }
}

/// Every page of `rx` run to its end, in the document's order; the first error fails the
/// request (its other pages are cancelled).
async fn all_pages(
    st: &AppState,
    rx: tokio::sync::mpsc::Receiver<ocr_window::Queued>,
    policy: crate::generation::outcome::RetryPolicy,
) -> Result<Vec<ocr_pages::PageResult>, ApiError> {
    let mut results = Vec::new();
    let mut failure = None;
    ocr_window::run_window(st, rx, policy, |index, _, r| match r {
        Ok(r) => {
            results.push((index, r));
            ControlFlow::Continue(())
        }
        Err(e) => {
            failure = Some(e);
            ControlFlow::Break(())
        }
    })
    .await;
    if let Some(e) = failure {
        return Err(e);
    }
    results.sort_by_key(|(index, _)| *index);
    Ok(results.into_iter().map(|(_, r)| r).collect())
}

/// `?format=`: `markdown` (the default, also `md`) or `json`; anything else is a 400 naming
/// `format`. Whether the answer is JSON.
pub(super) fn json_format(format: Option<&str>) -> Result<bool, ApiError> {
    match format {
        None | Some("markdown") | Some("md") => Ok(false),
        Some("json") => Ok(true),
        Some(other) => Err(ApiError::bad(
            "format",
            format!("format must be markdown or json, got {other:?}"),
        )),
    }
}

/// The fields of an OCR upload form (`/v1/ocr`, `/v1/ocr/jobs`), read and checked one by one.
#[derive(Default)]
pub(super) struct Form {
    file: Option<(String, Bytes)>,
    pub overrides: Overrides,
    pub prompt: Option<String>,
    pub ranges: Option<crate::documents::ranges::PageRanges>,
    pub outcome: OutcomeFields,
}

impl Form {
    /// The uploaded file's name and bytes: a 400 naming `file` when it is missing or empty.
    pub fn file(&self) -> Result<(String, Bytes), ApiError> {
        let (name, bytes) = self
            .file
            .clone()
            .ok_or_else(|| ApiError::bad("file", "missing the `file` field (an image or PDF)"))?;
        if bytes.is_empty() {
            return Err(ApiError::bad(
                "file",
                format!("{name}: the upload is empty"),
            ));
        }
        Ok((name, bytes))
    }
}

/// Reads the multipart form: one `file`, the sampling fields, `prompt`, `pages` and the page
/// outcome fields; an unknown or malformed field is a 400 naming it.
pub(super) async fn read_form(
    st: &AppState,
    mp: Result<Multipart, MultipartRejection>,
) -> Result<Form, ApiError> {
    let mut mp = mp.map_err(|e| {
        ApiError::invalid(format!(
            "expected a multipart/form-data upload with a `file` field: {}",
            e.body_text()
        ))
    })?;
    let mut f = Form::default();
    loop {
        let field = match mp.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return Err(body_error(e.status(), st, e.body_text())),
        };
        let name = field.name().unwrap_or("").to_string();
        let fname = field.file_name().map(str::to_string);
        let bytes = field
            .bytes()
            .await
            .map_err(|e| body_error(e.status(), st, e.body_text()))?;
        if name == "file" {
            if f.file.is_some() {
                return Err(ApiError::bad(
                    "file",
                    "more than one `file` field; send one document per request",
                ));
            }
            f.file = Some((fname.unwrap_or_else(|| "upload".into()), bytes));
            continue;
        }
        f.read_field(&name, &String::from_utf8_lossy(&bytes))?;
    }
    Ok(f)
}

impl Form {
    /// One text field of the form.
    fn read_field(&mut self, name: &str, text: &str) -> Result<(), ApiError> {
        let o = &mut self.overrides;
        match name {
            "max_tokens" => o.max_tokens = Some(field_num(name, text)?),
            "temperature" => o.sampling.temperature = Some(field_num(name, text)?),
            "top_p" => o.sampling.top_p = Some(field_num(name, text)?),
            "top_k" => o.sampling.top_k = Some(field_num(name, text)?),
            "repetition_penalty" => o.sampling.repetition_penalty = Some(field_num(name, text)?),
            "presence_penalty" => o.sampling.presence_penalty = Some(field_num(name, text)?),
            "frequency_penalty" => o.sampling.frequency_penalty = Some(field_num(name, text)?),
            "logit_bias" => o.sampling.logit_bias = Some(form_logit_bias(text)?),
            "seed" => o.sampling.seed = Some(field_num(name, text)?),
            "prompt" => self.prompt = Some(text.to_string()).filter(|t| !t.trim().is_empty()),
            "pages" => {
                let r = text
                    .parse()
                    .map_err(|e| ApiError::bad("pages", format!("pages: {e}")))?;
                self.ranges = Some(r);
            }
            other if self.outcome.read(other, text)? => {}
            other => {
                return Err(ApiError::bad(
                    other,
                    format!("unknown form field {other:?}"),
                ))
            }
        }
        Ok(())
    }
}

/// A document to read: the upload and the pages asked for.
pub(super) struct Upload {
    pub name: String,
    pub bytes: Bytes,
    pub ranges: Option<crate::documents::ranges::PageRanges>,
}

/// One page's prompt and pixels; a prompt the template refuses is a 400 naming `prompt`.
pub(super) fn prepare_page(
    st: &AppState,
    img: &image::RgbImage,
    prompt: Option<&str>,
) -> Result<crate::generation::pipeline::PreparedPage, ApiError> {
    st.pipeline
        .prepare_with(img, prompt)
        .map_err(|e| ApiError::bad("prompt", e.to_string()))
}

/// Page `i`'s sampling: pages of one upload get distinct but reproducible seeds.
pub(super) fn page_params(params: &SamplingParams, i: usize) -> SamplingParams {
    let mut params = params.clone();
    if let Some(s) = params.seed.as_mut() {
        *s = s.wrapping_add(i as u64);
    }
    params
}

/// The engine job of page `number`'s first attempt (queued by the caller) and what
/// [`ocr_pages`] needs to follow it and retry it.
pub(super) fn queue_page(
    st: &AppState,
    id: String,
    number: usize,
    req: GenRequest,
    policy: crate::generation::outcome::RetryPolicy,
    accepted: Instant,
) -> (Job, PageJob) {
    let again = (policy.retries > 0).then(|| req.clone());
    let prompt_tokens = req.prompt_ids.len();
    let (j, rx) = job(st, id.clone(), req, vec![], accepted);
    let page = PageJob {
        number,
        again,
        prompt_tokens,
        id,
        rx,
    };
    (j, page)
}
