//! `POST /v1/ocr`: a multipart upload (an image or a PDF and optional sampling fields) to
//! markdown, JSON pages or a text stream; pages that did not finish are retried and marked
//! ([`super::ocr_pages`]).

use super::ocr_figures;
use super::ocr_pages::{self, OutcomeFields, PageJob};
use super::*;

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
/// `pages`, `retries` and `accept_length` fields.
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
    let max_tokens = form.overrides.max_tokens(&st)?;
    let params = form.overrides.sampling(&st)?;
    if q.figures && (q.stream || !json_out) {
        return Err(ApiError::bad(
            "figures",
            "figures=true returns the crops in JSON: use it with format=json, without stream",
        ));
    }
    // `Bytes`: the clone shares the upload, read again only for pages with boxed figures.
    let figures_src = q.figures.then(|| (bytes.clone(), name.clone()));
    let client = ClientAlive::new();
    let doc = Upload {
        name,
        bytes,
        prompt: form.prompt,
        ranges: form.ranges,
    };
    let pages = prepare_pages(st.clone(), doc, permit, client.flag()).await?;
    let mut jobs = Vec::with_capacity(pages.len());
    let mut queued = Vec::with_capacity(pages.len());
    let upload = new_id("ocr");
    for (i, (number, page)) in pages.into_iter().enumerate() {
        check_length(&st, page.prompt_ids.len(), max_tokens)?;
        let id = format!("{upload}-p{}", i + 1);
        let req = st
            .pipeline
            .request_with(page, page_params(&params, i), max_tokens);
        let (j, page) = queue_page(&st, id, number, req, policy, accepted);
        jobs.push(j);
        queued.push(page);
    }
    st.shared.submit_all(jobs)?;
    if q.stream {
        return Ok(ocr_pages::stream(st.clone(), queued, policy));
    }
    let mut results = ocr_pages::run_pages(&st, queued, policy, accepted).await?;
    drop(client);
    let figures = match figures_src {
        Some((bytes, name)) => {
            Some(ocr_figures::crop_results(&st, bytes, name, &mut results).await?)
        }
        None => None,
    };
    Ok(ocr_pages::respond(&st, &results, json_out, figures))
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

/// A document to read: the upload, the prompt its pages get and the pages asked for.
pub(super) struct Upload {
    pub name: String,
    pub bytes: Bytes,
    pub prompt: Option<String>,
    pub ranges: Option<crate::documents::ranges::PageRanges>,
}

/// Every page of `doc` rendered or decoded and prepared (`/v1/ocr` holds them all until they
/// are queued), under the decode budget; stops when `alive` turns false.
async fn prepare_pages(
    st: Arc<AppState>,
    doc: Upload,
    permit: Option<Extension<super::super::front::BodyPermit>>,
    alive: Arc<AtomicBool>,
) -> Result<Vec<(usize, crate::generation::pipeline::PreparedPage)>, ApiError> {
    tokio::task::spawn_blocking(move || {
        // The body's share of the memory for bodies, given back with the upload's bytes.
        let _body = permit;
        let is_alive = || alive.load(Ordering::Relaxed);
        // The render or decode and every preprocessed page, until they are queued.
        let pre = &st.pipeline.preprocess;
        let cost = images::plan([&doc.bytes[..]], st.cfg.max_images, pre).bytes;
        let _permit = st
            .decode_budget
            .acquire(cost, &is_alive)
            .ok_or_else(client_gone)?;
        let pages = images::document_pages(
            &st.pdf,
            &doc.bytes,
            &doc.name,
            st.cfg.max_pixels,
            st.cfg.max_images,
            doc.ranges.as_ref(),
        )?;
        let mut out = Vec::with_capacity(pages.len());
        for (number, img) in pages {
            if !is_alive() {
                return Err(client_gone());
            }
            out.push((number, prepare_page(&st, &img, doc.prompt.as_deref())?));
        }
        Ok::<_, ApiError>(out)
    })
    .await
    .map_err(|e| ApiError::Engine(format!("preprocessing task failed: {e}")))?
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
