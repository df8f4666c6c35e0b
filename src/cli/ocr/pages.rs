//! One `ocr` run's engines: each takes the next page while it has room, retries what did
//! not finish, and hands results to the shared output in input order.

use super::*;

/// What the engine threads of one run share: the pages still to read (taken in input order
/// by whichever engine has room), the page loader, the model's prompt inputs and the output.
struct Pages<'a, 'd, I> {
    a: &'a OcrArgs,
    docs: &'a [Document],
    out: &'a Mutex<Output<'d>>,
    units: Mutex<I>,
    loader: Mutex<PageLoader>,
    pipeline: PagePipeline,
    params: &'a SamplingParams,
    max_tokens: usize,
    policy: RetryPolicy,
    post: crate::cli::ocr_post::Post,
}

/// Runs every page of `docs` through one engine per device of `engines` (load options of
/// each), writing to `out`. An engine that fails to load is reported and the others read all
/// pages; when none loads, the first error is returned.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_pages<'a, 'd>(
    a: &'a OcrArgs,
    docs: &'a [Document],
    out: &'a Mutex<Output<'d>>,
    params: &'a SamplingParams,
    batch_size: usize,
    max_tokens: usize,
    engines: Vec<(String, ocrctl::runtime::ortmodel::LoadOptions)>,
    pipeline: PagePipeline,
    post: crate::cli::ocr_post::Post,
) -> anyhow::Result<()> {
    let units = docs
        .iter()
        .enumerate()
        .flat_map(|(d, doc)| (0..doc.pages()).map(move |p| (d, p)))
        .enumerate();
    let pages = Pages {
        a,
        docs,
        out,
        units: Mutex::new(units),
        loader: Mutex::new(PageLoader::with_reader(
            a.pdf.reader(a.pdfium_lib.clone()),
            a.max_pixels,
        )),
        pipeline,
        params,
        max_tokens,
        policy: a.outcome.policy(),
        post,
    };
    let n = engines.len();
    let errors: Vec<anyhow::Error> = std::thread::scope(|s| {
        let handles: Vec<_> = engines
            .into_iter()
            .map(|(label, opts)| {
                let pages = &pages;
                s.spawn(move || pages.load_and_run(&label, &opts, n, batch_size))
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| match h.join() {
                Ok(r) => r.err(),
                Err(p) => Some(anyhow::anyhow!(
                    "an engine thread panicked: {}",
                    ocrctl::generation::engine::panic_message(p.as_ref())
                )),
            })
            .collect()
    });
    match errors.into_iter().next() {
        // No engine ran (one device that failed, or every one): nothing was read.
        Some(e)
            if n == 1
                || pages
                    .units
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .next()
                    .is_some() =>
        {
            Err(e)
        }
        _ => Ok(()),
    }
}

impl<'d, I: Iterator<Item = (usize, (usize, usize))>> Pages<'_, 'd, I> {
    /// Loads the model with `opts` (on device `label`, one of `engines`) and reads pages with
    /// it until none is left. A failed load is said at once when other engines read the
    /// pages.
    fn load_and_run(
        &self,
        label: &str,
        opts: &ocrctl::runtime::ortmodel::LoadOptions,
        engines: usize,
        batch_size: usize,
    ) -> anyhow::Result<()> {
        let model = OrtModel::open(self.pipeline.export(), opts)
            .with_context(|| format!("loading the model on {label}"));
        let model = match model {
            Ok(m) => m,
            Err(e) if engines > 1 => {
                let e = crate::cli::common::describe(&e);
                eprintln!("error: {e}; the other engines read the pages");
                return Err(anyhow::anyhow!(e));
            }
            Err(e) => return Err(e),
        };
        self.run_engine(model, batch_size);
        Ok(())
    }

    /// The next page as a request: loaded and preprocessed when the engine admits it. A page
    /// that fails is reported and skipped.
    fn next_request(&self) -> Option<(Meta, GenRequest)> {
        loop {
            let (unit, (d, page)) = self
                .units
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .next()?;
            match self.prepare(unit, d, page) {
                Ok(r) => return Some(r),
                Err(e) => {
                    let msg = self.failed_page(d, page, &e);
                    self.out().finish(unit, PageResult::error(msg, 1));
                }
            }
        }
    }

    fn out(&self) -> std::sync::MutexGuard<'_, Output<'d>> {
        self.out.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The message of page `page` of document `d` failing with `e`, naming both.
    fn failed_page(&self, d: usize, page: usize, e: &anyhow::Error) -> String {
        let name = self.out().page_name(d, page);
        named(&name, &self.docs[d].path, crate::cli::common::describe(e))
    }

    /// Page `page` of document `d` (run unit `unit`), loaded and preprocessed, as a request.
    fn prepare(&self, unit: usize, d: usize, page: usize) -> anyhow::Result<(Meta, GenRequest)> {
        let doc = &self.docs[d];
        let img = {
            let mut loader = self.loader.lock().unwrap_or_else(|e| e.into_inner());
            let img = loader.load(doc, page)?;
            if page + 1 == doc.pages() {
                loader.close();
            }
            img
        };
        let p = self.pipeline.prepare(&img)?;
        drop(img);
        let m = Meta {
            unit,
            prompt_tokens: p.prompt_ids.len(),
            size: [p.height, p.width],
            image_tokens: p.image_tokens,
        };
        let req = GenRequest {
            ignore_eos: self.a.ignore_eos,
            top_logprobs: self.a.top_logprobs,
            ..self
                .pipeline
                .request_with(p, self.params.clone(), self.max_tokens)
        };
        Ok((m, req))
    }

    /// The request of a page to try again (rendered and preprocessed again rather than
    /// kept: a page's pixels are megabytes, retries are rare).
    fn again(&self, m: &Meta) -> Result<GenRequest, String> {
        let (d, page) = self.out().locate(m.unit);
        self.prepare(m.unit, d, page)
            .map(|(_, req)| req)
            .map_err(|e| self.failed_page(d, page, &e))
    }

    /// One engine's loop: takes pages while it has room until none are left; a page that
    /// did not finish goes again ([`outcome::run_with_retries`]).
    fn run_engine(&self, model: OrtModel, batch_size: usize) {
        let mut engine = Engine::new(model, batch_size, self.pipeline.image_token_id());
        outcome::run_with_retries(
            &mut engine,
            &self.policy,
            || self.next_request(),
            |m| self.again(m),
            &mut |ev| match ev {
                PageEvent::Token(_) => self.out().token(),
                PageEvent::Retry { .. } => {}
                PageEvent::Done {
                    key: m,
                    outcome,
                    result,
                } => {
                    let text = self.page_result(&m, result);
                    let outcome = match (&text, outcome.reason) {
                        (Err(_), None) => PageOutcome::failed(FailReason::Error, outcome.attempts),
                        _ => outcome,
                    };
                    self.out().finish(m.unit, PageResult { text, outcome });
                }
            },
        );
    }

    /// A finished page's text and, with `--json`, its object (without its outcome's fields,
    /// which [`Output`] adds); or the error, naming the page.
    fn page_result(
        &self,
        m: &Meta,
        result: Result<&ocrctl::generation::generate::Generation, String>,
    ) -> Result<(String, Option<serde_json::Value>), String> {
        let (a, docs) = (self.a, self.docs);
        let json = a.json && a.out.is_none();
        let (d, page) = self.out().locate(m.unit);
        let name = self.out().page_name(d, page);
        let g = result.map_err(|e| format!("{name}: {e}"))?;
        let text_ids: &[u32] = match g
            .token_ids
            .iter()
            .position(|t| self.pipeline.stop_ids().contains(t))
        {
            Some(i) if !a.ignore_eos => &g.token_ids[..i],
            _ => &g.token_ids,
        };
        let text = self
            .pipeline
            .prompter()
            .decode(text_ids, true)
            .map_err(|e| format!("{name}: {e}"))?;
        let (text, post_fields) = self.post.apply(&docs[d], page, &name, text)?;
        let v = json.then(|| {
            json!({
                "file": docs[d].path.display().to_string(),
                "page": docs[d].page_number(page),
                "text": text,
                "token_ids": g.token_ids,
                "top_logprobs": g.top_logprobs,
                "finish_reason": g.finish_reason,
                "prompt_tokens": m.prompt_tokens,
                "image_tokens": m.image_tokens,
                "image_size": m.size,
            })
        });
        let v = v.map(|mut v| {
            if let (Some(o), Some(Value::Object(f))) = (v.as_object_mut(), post_fields) {
                o.extend(f);
            }
            v
        });
        Ok((text, v))
    }
}
