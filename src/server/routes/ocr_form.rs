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
    let mut mp = mp.map_err(|e| {
        ApiError::invalid(format!(
            "expected a multipart/form-data upload with a `file` field: {}",
            e.body_text()
        ))
    })?;
    let json_out = match q.format.as_deref() {
        None | Some("markdown") | Some("md") => false,
        Some("json") => true,
        Some(other) => {
            return Err(ApiError::bad(
                "format",
                format!("format must be markdown or json, got {other:?}"),
            ))
        }
    };
    let mut file: Option<(String, Bytes)> = None;
    let mut o = Overrides::default();
    let mut prompt: Option<String> = None;
    let mut ranges: Option<crate::documents::ranges::PageRanges> = None;
    let mut outcome_fields = OutcomeFields::default();
    loop {
        let field = match mp.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return Err(body_error(e.status(), &st, e.body_text())),
        };
        let name = field.name().unwrap_or("").to_string();
        let fname = field.file_name().map(str::to_string);
        let bytes = field
            .bytes()
            .await
            .map_err(|e| body_error(e.status(), &st, e.body_text()))?;
        let text = || String::from_utf8_lossy(&bytes).to_string();
        match name.as_str() {
            "file" if file.is_some() => {
                return Err(ApiError::bad(
                    "file",
                    "more than one `file` field; send one document per request",
                ))
            }
            "file" => file = Some((fname.unwrap_or_else(|| "upload".into()), bytes.clone())),
            "max_tokens" => o.max_tokens = Some(field_num(&name, &text())?),
            "temperature" => o.sampling.temperature = Some(field_num(&name, &text())?),
            "top_p" => o.sampling.top_p = Some(field_num(&name, &text())?),
            "top_k" => o.sampling.top_k = Some(field_num(&name, &text())?),
            "repetition_penalty" => {
                o.sampling.repetition_penalty = Some(field_num(&name, &text())?)
            }
            "presence_penalty" => o.sampling.presence_penalty = Some(field_num(&name, &text())?),
            "frequency_penalty" => o.sampling.frequency_penalty = Some(field_num(&name, &text())?),
            "logit_bias" => o.sampling.logit_bias = Some(form_logit_bias(&text())?),
            "seed" => o.sampling.seed = Some(field_num(&name, &text())?),
            "prompt" => prompt = Some(text()).filter(|t| !t.trim().is_empty()),
            "pages" => {
                let r = text()
                    .parse()
                    .map_err(|e| ApiError::bad("pages", format!("pages: {e}")))?;
                ranges = Some(r);
            }
            other if outcome_fields.read(other, &text())? => {}
            other => {
                return Err(ApiError::bad(
                    other,
                    format!("unknown form field {other:?}"),
                ))
            }
        }
    }
    let policy = outcome_fields.policy(q.stream)?;
    let (name, bytes) =
        file.ok_or_else(|| ApiError::bad("file", "missing the `file` field (an image or PDF)"))?;
    if bytes.is_empty() {
        return Err(ApiError::bad(
            "file",
            format!("{name}: the upload is empty"),
        ));
    }
    check_text_bytes(&st, prompt.as_ref().map_or(0, String::len), "prompt")?;
    st.ready()?;
    let max_tokens = o.max_tokens(&st)?;
    let params = o.sampling(&st)?;
    if q.figures && (q.stream || !json_out) {
        return Err(ApiError::bad(
            "figures",
            "figures=true returns the crops in JSON: use it with format=json, without stream",
        ));
    }
    // `Bytes`: the clone shares the upload, read again only for pages with boxed figures.
    let figures_src = q.figures.then(|| (bytes.clone(), name.clone()));
    let st2 = st.clone();
    let client = ClientAlive::new();
    let alive = client.flag();
    let pages = tokio::task::spawn_blocking(move || {
        // The body's share of the memory for bodies, given back with the upload's bytes.
        let _body = permit;
        let is_alive = || alive.load(Ordering::Relaxed);
        // The render or decode and every preprocessed page, until they are queued.
        let pre = &st2.pipeline.preprocess;
        let cost = images::plan([&bytes[..]], st2.cfg.max_images, pre).bytes;
        let _permit = st2
            .decode_budget
            .acquire(cost, &is_alive)
            .ok_or_else(client_gone)?;
        let pages = images::document_pages(
            &st2.pdf,
            &bytes,
            &name,
            st2.cfg.max_pixels,
            st2.cfg.max_images,
            ranges.as_ref(),
        )?;
        let mut out = Vec::with_capacity(pages.len());
        for (number, img) in pages {
            if !is_alive() {
                return Err(client_gone());
            }
            let page = st2
                .pipeline
                .prepare_with(&img, prompt.as_deref())
                .map_err(|e| ApiError::bad("prompt", e.to_string()))?;
            out.push((number, page));
        }
        Ok::<_, ApiError>(out)
    })
    .await
    .map_err(|e| ApiError::Engine(format!("preprocessing task failed: {e}")))??;
    let mut jobs = Vec::with_capacity(pages.len());
    let mut queued = Vec::with_capacity(pages.len());
    let upload = new_id("ocr");
    for (i, (number, page)) in pages.into_iter().enumerate() {
        check_length(&st, page.prompt_ids.len(), max_tokens)?;
        let mut params = params.clone();
        // Pages of one upload get distinct but reproducible seeds.
        if let Some(s) = params.seed.as_mut() {
            *s = s.wrapping_add(i as u64);
        }
        let id = format!("{upload}-p{}", i + 1);
        let req = st.pipeline.request_with(page, params, max_tokens);
        let again = (policy.retries > 0).then(|| req.clone());
        let prompt_tokens = req.prompt_ids.len();
        let (j, rx) = job(&st, id.clone(), req, vec![], accepted);
        jobs.push(j);
        queued.push(PageJob {
            number,
            again,
            prompt_tokens,
            id,
            rx,
        });
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
