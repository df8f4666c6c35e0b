//! [`OrtModel::load`]: an export's sessions (vision encoder, embeddings, decoder), its
//! decoder variant and KV cache, CUDA graphs for the GQA decoder's decode steps, and the
//! stages' sessions, as the [`LoadOptions`] ask.

use super::*;
use ort::value::TensorElementType;

impl OrtModel {
    /// Loads the export in `dir` with the given precision.
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<OrtModel, LoadError> {
        // Creating sessions allocates device memory: not while another thread captures.
        let mut gpu = capture::shared();
        let manifest = Manifest::load(dir)?;
        let graphs =
            manifest
                .graphs
                .get(&opts.precision)
                .ok_or_else(|| LoadError::NoPrecision {
                    dir: dir.to_path_buf(),
                    precision: opts.precision.name().into(),
                    available: manifest
                        .precisions
                        .iter()
                        .map(|p| p.name())
                        .collect::<Vec<_>>()
                        .join(", "),
                })?;
        let paged_refused = || LoadError::Session {
            path: dir.join(MANIFEST_NAME),
            message: format!(
                "the paged decoder ({}) is exported to be checked on a GPU \
                 (scripts/check_paged.py); ocrctl does not run it yet: export and run \
                 --decoder gqa (or merged)",
                graph::DECODER_PAGED
            ),
        };
        let has = |v: DecoderVariant| graphs.contains_key(v.part());
        let variant = match opts.decoder {
            Some(DecoderVariant::Paged) => return Err(paged_refused()),
            Some(v) if !has(v) => {
                return Err(LoadError::Session {
                    path: dir.join(MANIFEST_NAME),
                    message: format!(
                        "the {} decoder was not exported for {} (export with --decoder {})",
                        v.part(),
                        opts.precision.name(),
                        v.name()
                    ),
                })
            }
            Some(v) => v,
            None if has(DecoderVariant::Gqa) => DecoderVariant::Gqa,
            None if !has(DecoderVariant::Merged) && has(DecoderVariant::Paged) => {
                return Err(paged_refused())
            }
            None => DecoderVariant::Merged,
        };
        if opts.verify {
            verify_files(dir, &manifest, opts.precision, variant)?;
        }
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
        let decoder_tweaks = session::Tweaks::decoder(variant, &manifest.kv_cache);
        let vision = session::build(&env, &path_of(graph::VISION)?, opts, Default::default())?;
        let mut embed =
            session::build(&env, &path_of(graph::EMBED)?, opts, Default::default())?.session;
        let (mut decoder, graphs_on) =
            match session::build(&env, &decoder_path, opts, decoder_tweaks) {
                // ONNX Runtime refuses graph capture for a session with nodes outside the CUDA
                // provider; the decoder then runs uncaptured rather than not at all.
                Err(e) if opts.providers.cuda.cuda_graphs && variant == DecoderVariant::Gqa => {
                    tracing::warn!("CUDA graphs unavailable ({e}); decode steps run without them");
                    let mut plain = opts.clone();
                    plain.providers.cuda.cuda_graphs = false;
                    (
                        session::build(&env, &decoder_path, &plain, decoder_tweaks)?,
                        false,
                    )
                }
                r => (r?, opts.providers.cuda.cuda_graphs),
            };
        let (t_hidden, t_vocab) = (t.hidden_size, t.vocab_size);
        let placement = Placement::for_provider(decoder.provider, opts.providers.device_id)
            .map_err(|e| LoadError::Session {
                path: decoder_path.clone(),
                message: e.to_string(),
            })?;
        let act = opts.precision.dtype();
        // The GQA decoder never repacks: its cache is updated in place.
        let repacker = if variant == DecoderVariant::Gqa {
            None
        } else {
            match Repacker::new(
                &env,
                decoder.provider,
                opts.providers.device_id,
                act,
                &placement.kv,
                &decoder.session,
            ) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!("KV repack graph unavailable ({e}); batch caches are repacked through host memory");
                    None
                }
            }
        };
        let gqa = match variant {
            // (A paged decoder was refused above.)
            DecoderVariant::Merged | DecoderVariant::Paged => None,
            DecoderVariant::Gqa => {
                if decoder.provider.is_gpu() {
                    let kind = gqa::cache_element_type(&decoder.session, act);
                    // nvidia-smi (~0.1 s) is asked only for an 8-bit cache.
                    let device = opts.providers.device_id.max(0) as usize;
                    let cc = || crate::runtime::gpumem::compute_capability(device);
                    if let Some(w) = slow_cache_warning(kind, cc) {
                        tracing::warn!("{}: {w}", decoder_path.display());
                    }
                }
                let max_pos = t.max_position_embeddings.max(1);
                let max_seq = match opts.max_sequence_length {
                    0 => max_pos.min(8192),
                    n => n.min(max_pos),
                };
                let cache = gqa::GqaCache::new(
                    &decoder.session,
                    placement.kv.clone(),
                    act,
                    t.num_kv_heads,
                    t.head_dim,
                    opts.kv_slots.max(1),
                    max_seq,
                    t.num_layers,
                )
                .map_err(|e| LoadError::Session {
                    path: decoder_path.clone(),
                    message: e.to_string(),
                })?;
                let mut cache = cache;
                if graphs_on && decoder.provider == Provider::Cuda {
                    let t = std::time::Instant::now();
                    // The capture takes the lock alone (see `capture`).
                    let captured = gpu.released(|| {
                        cache.enable_graphs(&mut decoder.session, &mut embed, t_hidden, t_vocab)
                    });
                    match captured {
                        Ok(()) => tracing::info!(
                            "CUDA graphs for decode steps of 1 to {} sequences captured in {:.1} s",
                            cache.slots,
                            t.elapsed().as_secs_f64()
                        ),
                        Err(e) => tracing::warn!(
                            "CUDA graphs unavailable ({e}); decode steps run without them"
                        ),
                    }
                }
                tracing::info!(
                    "GQA decoder, KV cache of {} sequences x {} positions ({:.2} GiB, {:?}) in {} memory",
                    cache.slots,
                    cache.max_seq,
                    cache.bytes() as f64 / (1u64 << 30) as f64,
                    cache.element_type(),
                    placement.kv.allocation_device().as_str()
                );
                Some(cache)
            }
        };
        let stages = opts.vision_stage && (decoder.provider.is_gpu() || opts.stages_on_cpu);
        let prefill_stage = match &gqa {
            Some(cache) if stages && opts.prefill_stage => {
                let embed_path = path_of(graph::EMBED)?;
                let paths = (decoder_path.as_path(), embed_path.as_path());
                stage::build(
                    &env,
                    paths,
                    opts,
                    decoder_tweaks,
                    cache,
                    act,
                    &placement.host,
                )
            }
            _ => None,
        };
        let gqa_location = gqa.as_ref().map(|_| {
            format!(
                "{}:{}",
                placement.kv.allocation_device().as_str(),
                placement.kv.device_id()
            )
        });
        Ok(OrtModel {
            gqa,
            act,
            vision: Arc::new(Mutex::new(Vision::new(
                vision.session,
                vision.provider,
                opts.providers.device_id,
            ))),
            embed,
            decoder_takes_positions: decoder
                .session
                .inputs()
                .iter()
                .any(|i| i.name() == tensor::POSITION_IDS),
            decoder: decoder.session,
            provider: decoder.provider,
            vision_stage: stages,
            prefill_stage,
            placement,
            repacker,
            kv_path: KvPath::Bound,
            stats: KvStats {
                // The GQA cache lives where it was allocated, from the first run on.
                kv_location: gqa_location,
                ..KvStats::default()
            },
            warned_placement: false,
            past_names: tensor::cache_names(t.num_layers, false),
            present_names: tensor::cache_names(t.num_layers, true),
            dims: KvDims {
                kv_heads: t.num_kv_heads,
                head_dim: t.head_dim,
                tensors: 2 * t.num_layers,
            },
            hidden: t.hidden_size,
            tap: None,
            batch: None,
            dir: dir.to_path_buf(),
            manifest,
        })
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
