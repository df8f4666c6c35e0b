//! [`OrtModel::load`]: an export's sessions (vision encoder, embeddings, decoder) and the
//! decoder path the [`LoadOptions`] and the export choose ([`DecoderPath`]; the GQA path
//! loads its own cache, CUDA graphs and prefill stage, `gqa::GqaDecoder::load`).

use super::merged::MergedDecoder;
use super::paged;
use super::*;
use crate::model::export::Export;
use crate::runtime::providers::Provider;
use ocrctl_exporters::graph::GraphInfo;
use ort::value::TensorElementType;
use std::collections::BTreeMap;

impl OrtModel {
    /// Opens the export in `dir` and loads it (for one-off loads and tests; a caller that
    /// holds the [`Export`] already uses [`OrtModel::open`]).
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<OrtModel, LoadError> {
        OrtModel::open(&Export::open(dir)?, opts)
    }

    /// Loads the sessions of an opened export as `opts` describe.
    pub fn open(export: &Export, opts: &LoadOptions) -> Result<OrtModel, LoadError> {
        // Creating sessions allocates device memory: not while another thread captures.
        let mut gpu = capture::shared();
        let (dir, manifest) = (export.dir.as_path(), &export.manifest);
        let graphs = graphs_of(manifest, dir, opts)?;
        let variant = choose_variant(dir, opts, |v| graphs.contains_key(v.part()))?;
        if opts.verify {
            verify_files(dir, manifest, opts.precision, variant)?;
        }
        if variant == DecoderVariant::Paged && !opts.providers.order.contains(&Provider::Cuda) {
            return Err(LoadError::Session {
                path: dir.join(MANIFEST_NAME),
                message: paged::CUDA_ONLY.into(),
            });
        }
        let env = environment(dir, opts)?;
        let path_of = |part: &str| -> Result<PathBuf, LoadError> {
            let g = graphs.get(part).ok_or_else(|| LoadError::Session {
                path: dir.join(MANIFEST_NAME),
                message: format!("manifest lists no `{part}` graph"),
            })?;
            Ok(dir.join("onnx").join(&g.file))
        };
        let t = &manifest.model.text;
        let decoder_path = path_of(variant.part())?;
        // The cache's type is the graph's (read below); the manifest's record of it picks
        // ONNX Runtime's transformers before the session exists (a speed matter only).
        let tweaks = session::Tweaks::decoder(variant, &manifest.kv_cache);
        let vision = session::build(&env, &path_of(graph::VISION)?, opts, Default::default())?;
        let mut embed =
            session::build(&env, &path_of(graph::EMBED)?, opts, Default::default())?.session;
        let (decoder, graphs_on) = build_decoder(&env, &decoder_path, opts, variant, tweaks)?;
        let provider = decoder.provider;
        let placement =
            Placement::for_provider(provider, opts.providers.device_id).map_err(|e| {
                LoadError::Session {
                    path: decoder_path.clone(),
                    message: e.to_string(),
                }
            })?;
        let act = opts.precision.dtype();
        let stages = opts.vision_stage && (provider.is_gpu() || opts.stages_on_cpu);
        let mut stats = KvStats::default();
        if variant == DecoderVariant::Gqa && provider.is_gpu() {
            warn_slow_cache(&decoder.session, act, opts, &decoder_path);
        }
        let embed_path = path_of(graph::EMBED)?;
        let l = gqa::GqaLoad {
            env: &env,
            opts,
            text: t,
            paths: (decoder_path.as_path(), embed_path.as_path()),
            tweaks,
            act,
            placement: &placement,
            stages,
        };
        let on = (decoder, graphs_on);
        let path = decoder_path_of(&l, variant, on, &mut embed, &mut gpu, &mut stats)?;
        let vision = Vision::new(vision.session, vision.provider, opts.providers.device_id);
        Ok(OrtModel {
            vision: Arc::new(Mutex::new(vision)),
            provider,
            vision_stage: stages,
            hidden: t.hidden_size,
            common: Common {
                act,
                embed,
                placement,
                kv_path: KvPath::Bound,
                stats,
                tap: None,
            },
            path,
            dir: dir.to_path_buf(),
            manifest: manifest.clone(),
        })
    }
}

/// The decoder path of `variant` over the session `decoder` (created with CUDA graphs
/// enabled when `graphs_on`), with what `l` holds; a cache decoder's cache location goes
/// into `stats`.
fn decoder_path_of(
    l: &gqa::GqaLoad<'_>,
    variant: DecoderVariant,
    (decoder, graphs_on): (session::Built, bool),
    embed: &mut Session,
    gpu: &mut capture::Shared,
    stats: &mut KvStats,
) -> Result<DecoderPath, LoadError> {
    let built = (decoder.session, decoder.provider);
    Ok(match variant {
        DecoderVariant::Gqa => {
            let g = gqa::GqaDecoder::load(l, built, graphs_on, embed, gpu)?;
            // The GQA cache lives where it was allocated, from the first run on.
            stats.kv_location = Some(l.placement.kv_at());
            DecoderPath::Gqa(g)
        }
        DecoderVariant::Paged => {
            let pl = paged::PagedLoad {
                path: l.paths.0,
                opts: l.opts,
                text: l.text,
                kv: l.placement.kv.clone(),
                graphs_on,
            };
            let p = paged::PagedDecoder::load(pl, built, embed, gpu)?;
            stats.kv_location = Some(l.placement.kv_at());
            DecoderPath::Paged(p)
        }
        DecoderVariant::Merged => DecoderPath::Merged(MergedDecoder::new(
            l.env,
            built,
            l.opts,
            l.act,
            l.placement,
            l.text,
        )),
    })
}

/// The graphs `manifest` lists for the precision `opts` asks for.
fn graphs_of<'m>(
    manifest: &'m Manifest,
    dir: &Path,
    opts: &LoadOptions,
) -> Result<&'m BTreeMap<String, GraphInfo>, LoadError> {
    manifest.graphs.get(&opts.precision).ok_or_else(|| {
        let available: Vec<_> = manifest.precisions.iter().map(|p| p.name()).collect();
        LoadError::NoPrecision {
            dir: dir.to_path_buf(),
            precision: opts.precision.name().into(),
            available: available.join(", "),
        }
    })
}

/// ONNX Runtime's environment, after checking that the providers `opts` asks for can run
/// (their notes are logged as warnings).
fn environment(dir: &Path, opts: &LoadOptions) -> Result<ort::environment::Environment, LoadError> {
    let (_, env) = crate::runtime::ortlib::environment(opts.ort_lib.as_deref())?;
    match crate::runtime::providers::usable(&opts.providers) {
        Ok((_, notes)) => notes.iter().for_each(|n| tracing::warn!("{n}")),
        Err(e) => {
            return Err(LoadError::Session {
                path: dir.to_path_buf(),
                message: e.to_string(),
            })
        }
    }
    Ok(env)
}

/// The decoder graph a load runs: the one `opts` names, else `gqa` when the export has it
/// (`has`), else `merged`, else `paged` (which runs on CUDA only).
fn choose_variant(
    dir: &Path,
    opts: &LoadOptions,
    has: impl Fn(DecoderVariant) -> bool,
) -> Result<DecoderVariant, LoadError> {
    let refused = |message: String| LoadError::Session {
        path: dir.join(MANIFEST_NAME),
        message,
    };
    match opts.decoder {
        Some(v) if !has(v) => Err(refused(format!(
            "the {} decoder was not exported for {} (export with --decoder {})",
            v.part(),
            opts.precision.name(),
            v.name()
        ))),
        Some(v) => Ok(v),
        None if has(DecoderVariant::Gqa) => Ok(DecoderVariant::Gqa),
        None if !has(DecoderVariant::Merged) && has(DecoderVariant::Paged) => {
            Ok(DecoderVariant::Paged)
        }
        None => Ok(DecoderVariant::Merged),
    }
}

/// The decoder's session, and whether CUDA graphs are enabled on it. ONNX Runtime refuses
/// graph capture for a session with nodes outside the CUDA provider; a GQA or paged decoder
/// then runs uncaptured rather than not at all.
fn build_decoder(
    env: &ort::environment::Environment,
    path: &Path,
    opts: &LoadOptions,
    variant: DecoderVariant,
    tweaks: session::Tweaks<'_>,
) -> Result<(session::Built, bool), LoadError> {
    match session::build(env, path, opts, tweaks) {
        Err(e) if opts.providers.cuda.cuda_graphs && variant != DecoderVariant::Merged => {
            tracing::warn!("CUDA graphs unavailable ({e}); decode steps run without them");
            let mut plain = opts.clone();
            plain.providers.cuda.cuda_graphs = false;
            Ok((session::build(env, path, &plain, tweaks)?, false))
        }
        r => Ok((r?, opts.providers.cuda.cuda_graphs)),
    }
}

/// Warns when the GQA `decoder`'s 8-bit KV cache will be slow on this GPU (see
/// [`slow_cache_warning`]; nvidia-smi, ~0.1 s, is asked only for an 8-bit cache).
fn warn_slow_cache(decoder: &Session, act: DType, opts: &LoadOptions, path: &Path) {
    let kind = gqa::cache_element_type(decoder, act);
    let device = opts.providers.device_id.max(0) as usize;
    let cc = || crate::runtime::gpumem::compute_capability(device);
    if let Some(w) = slow_cache_warning(kind, cc) {
        tracing::warn!("{}: {w}", path.display());
    }
}

/// The 8-bit KV caches ONNX Runtime's GroupQueryAttention decodes through XQA, by `--kv-cache`
/// name, cache type and the compute capability it needs (`is_fp8_quantized_supported` and
/// `is_int8_quantized_supported` in `contrib_ops/cuda/bert/group_query_attention.cc`, 1.31);
/// below it the kernel dequantizes the whole cache every step, slower than an fp16 cache.
const XQA_8BIT: [(&str, TensorElementType, (u32, u32)); 2] = [
    ("fp8", TensorElementType::Float8E4M3FN, (8, 9)),
    ("int8", TensorElementType::Int8, (8, 0)),
];

/// The `--kv-cache` kinds a GPU of compute capability `cc` decodes at full speed (for
/// `ocrctl doctor`).
pub fn fast_8bit_caches(cc: (u32, u32)) -> Vec<&'static str> {
    XQA_8BIT
        .iter()
        .filter(|(_, _, need)| cc >= *need)
        .map(|(name, _, _)| *name)
        .collect()
}

/// Why an 8-bit KV cache of type `cache` will be slow on a GPU of compute capability `cc()`
/// (asked only for an 8-bit cache), if it will (see [`XQA_8BIT`]), naming the export to make
/// instead.
fn slow_cache_warning(
    cache: TensorElementType,
    cc: impl FnOnce() -> Option<(u32, u32)>,
) -> Option<String> {
    let (_, _, need) = XQA_8BIT.iter().find(|(_, t, _)| *t == cache)?;
    let (major, minor) = cc()?;
    let fast = fast_8bit_caches((major, minor));
    let other = match fast.first() {
        Some(k) => format!("--kv-cache {k} or auto"),
        None => "--kv-cache auto".to_string(),
    };
    ((major, minor) < *need).then(|| {
        format!(
            "this export's {cache:?} KV cache needs compute capability {}.{} for ONNX Runtime's \
             XQA kernel; this GPU has {major}.{minor}, so every decode step dequantizes the \
             whole cache (slower than an fp16 cache): export with {other}",
            need.0, need.1
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_8bit_cache_below_its_compute_capability_is_named() {
        let fp8 = TensorElementType::Float8E4M3FN;
        let int8 = TensorElementType::Int8;
        let w = slow_cache_warning(fp8, || Some((8, 6))).unwrap();
        assert!(
            w.contains("8.9") && w.contains("8.6") && w.contains("--kv-cache int8"),
            "{w}"
        );
        assert!(slow_cache_warning(fp8, || Some((8, 9))).is_none());
        assert!(slow_cache_warning(fp8, || Some((9, 0))).is_none());
        assert!(slow_cache_warning(fp8, || Some((12, 0))).is_none());
        assert!(slow_cache_warning(int8, || Some((8, 6))).is_none());
        let w = slow_cache_warning(int8, || Some((7, 5))).unwrap();
        assert!(w.contains("8.0") && w.contains("7.5"), "{w}");
        assert_eq!(fast_8bit_caches((9, 0)), ["fp8", "int8"]);
        assert_eq!(fast_8bit_caches((8, 6)), ["int8"]);
        assert!(fast_8bit_caches((7, 5)).is_empty());
        // Not an 8-bit cache (the GPU is not asked), or nothing known of the GPU.
        assert!(slow_cache_warning(TensorElementType::Float16, || panic!("asked")).is_none());
        assert!(slow_cache_warning(TensorElementType::Float16, || Some((7, 5))).is_none());
        assert!(slow_cache_warning(fp8, || None).is_none());
    }
}
