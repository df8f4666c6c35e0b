//! The merged decoder's runs, with the KV cache kept in the execution provider's memory
//! (IoBinding) or brought back to the host (`Session::run`).
//!
//! On the [`KvPath::Bound`] path every input is bound (host inputs are uploaded by ONNX
//! Runtime; past values that are already on the device are used in place), `logits` is bound
//! to host memory and every `present.*` to the memory of the provider the decoder session got
//! (CUDA device memory on CUDA/TensorRT, host memory on the CPU provider, so CPU-only CI runs
//! this same path). The presents come back as values in that memory and are bound as the next
//! step's past without touching the host. A binding is made per run: output shapes grow every
//! step, and a binding reused across runs would hand ONNX Runtime last step's buffers.
//!
//! If a bound run fails and the same run then succeeds through `Session::run`, binding is at
//! fault (e.g. the device memory cannot be bound): one line is logged and the model stays on
//! [`KvPath::Host`]. If both fail, the error is the model's and is returned as is. ONNX Runtime
//! may also honour a binding silently elsewhere (outputs bound to a device no provider of the
//! session has come back in host memory): that is logged once and shows in
//! [`KvStats::kv_location`]; results are unaffected.

use super::merged::MergedDecoder;
use super::tensors::{as_tensor, location, read_f};
use super::Common;
use crate::runtime::backend::BackendError;
use crate::runtime::providers::Provider;
use ocrctl_exporters::contract::graph;
use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{SessionInputValue, SessionOutputs};
use ort::value::DynTensor;
use std::borrow::Cow;

const PART: &str = graph::DECODER_MERGED;

/// How decoder runs move the KV cache between steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvPath {
    /// IoBinding: `present.*` stay in the memory of the decoder's execution provider and are
    /// bound as the next step's past; only the logits come to the host. The default.
    Bound,
    /// `Session::run`: every output, the KV cache included, is copied to host memory and
    /// copied back as the next step's input (the only path while a calibration tap is set).
    Host,
}

impl KvPath {
    /// `bound` or `host`.
    pub fn name(self) -> &'static str {
        match self {
            KvPath::Bound => "bound",
            KvPath::Host => "host",
        }
    }
}

/// What the decoder runs did: which path ran, where the cache was, how often it was repacked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvStats {
    /// Decoder runs through IoBinding.
    pub bound_runs: u64,
    /// Decoder runs through `Session::run`.
    pub host_runs: u64,
    /// KV caches rebuilt because sequences joined or left a batch (or one sequence's rows
    /// were cut out of the batch cache).
    pub repacks: u64,
    /// Of those, the ones done in the decoder's memory by the repack graph.
    pub device_repacks: u64,
    /// Where the last run's `present.*` values were, e.g. `Cuda:0` or `Cpu:0`.
    pub kv_location: Option<String>,
    /// Why the model fell back from [`KvPath::Bound`] to [`KvPath::Host`], if it did.
    pub fallback: Option<String>,
    /// GQA decode steps: nanoseconds spent embedding the step's tokens, in the decoder run
    /// (logits to host memory included), and picking each row's logits out (a profile of
    /// the step on the host's side).
    pub step_embed_ns: u64,
    pub step_run_ns: u64,
    pub step_logits_ns: u64,
    /// Sampling rows whose device candidates did not decide the draw, so their full logits
    /// were fetched after the step.
    pub step_logits_fallbacks: u64,
}

/// Memory the decoder's outputs are bound to.
pub(super) struct Placement {
    /// For `present.*`: the decoder provider's device memory.
    pub kv: MemoryInfo<'static>,
    /// For `logits`: host memory.
    pub host: MemoryInfo<'static>,
}

impl Placement {
    /// Placement for a decoder session whose main provider is `provider`.
    pub fn for_provider(provider: Provider, device_id: i32) -> ort::Result<Placement> {
        let host = MemoryInfo::new(
            AllocationDevice::CPU,
            0,
            AllocatorType::Device,
            MemoryType::Default,
        )?;
        let kv = match provider {
            Provider::Cpu => host.clone(),
            // TensorRT (classic and RTX) runs on CUDA memory too; a binding the plugin refuses
            // falls back to the host path with one log line (`run_decoder`).
            Provider::Cuda | Provider::TensorRt | Provider::TensorRtRtx => MemoryInfo::new(
                AllocationDevice::CUDA,
                device_id,
                AllocatorType::Device,
                MemoryType::Default,
            )?,
        };
        Ok(Placement { kv, host })
    }

    /// Where `present.*` are bound, as [`KvStats::kv_location`] names it (e.g. `Cuda:0`).
    pub fn kv_at(&self) -> String {
        let kv = &self.kv;
        format!("{}:{}", kv.allocation_device().as_str(), kv.device_id())
    }
}

/// Decoder inputs by name.
pub(super) type Inputs = Vec<(String, DynTensor)>;

/// Each row's last-position logits and the `present.*` values in layer order.
pub(super) type DecoderOut = (Vec<Vec<f32>>, Vec<DynTensor>);

impl MergedDecoder {
    /// Runs the decoder on `inputs` along the current [`KvPath`].
    pub(super) fn run_decoder(
        &mut self,
        c: &mut Common,
        inputs: Inputs,
    ) -> Result<DecoderOut, BackendError> {
        if c.kv_path == KvPath::Bound && c.tap.is_none() {
            let bound_err = match self.run_bound(&c.placement, &inputs) {
                Ok(r) => {
                    c.stats.bound_runs += 1;
                    return note_location(c, r);
                }
                Err(e) => e,
            };
            let r = self.run_plain(c, &inputs)?;
            tracing::warn!(
                "keeping the KV cache in {} memory failed ({bound_err}); falling back to host memory",
                c.placement.kv.allocation_device().as_str()
            );
            c.kv_path = KvPath::Host;
            c.stats.fallback = Some(bound_err.to_string());
            c.stats.host_runs += 1;
            return note_location(c, r);
        }
        let r = self.run_plain(c, &inputs)?;
        c.stats.host_runs += 1;
        note_location(c, r)
    }

    /// Logs (once) presents of a bound run that are not where they were bound.
    fn check_placement(&mut self, placement: &Placement, r: &DecoderOut) {
        let want = placement.kv_at();
        match r.1.first().map(location) {
            Some(got) if got != want && !self.warned_placement => {
                tracing::warn!(
                    "the KV cache was bound to {want} memory but came back in {got} memory"
                );
                self.warned_placement = true;
            }
            _ => {}
        }
    }

    fn run_bound(
        &mut self,
        placement: &Placement,
        inputs: &Inputs,
    ) -> Result<DecoderOut, BackendError> {
        let rt = |e: ort::Error| BackendError::runtime(PART, e);
        #[cfg(test)]
        if tests::FAIL_BINDING.get() {
            return Err(BackendError::runtime(
                PART,
                "binding failure injected by a test",
            ));
        }
        let mut b = self.decoder.create_binding().map_err(rt)?;
        for (name, v) in inputs {
            b.bind_input(name.as_str(), v).map_err(rt)?;
        }
        b.bind_output_to_device("logits", &placement.host)
            .map_err(rt)?;
        for name in &self.present_names {
            b.bind_output_to_device(name.as_str(), &placement.kv)
                .map_err(rt)?;
        }
        // Host inputs are copied to the device as they are bound; make sure the copies are done.
        b.synchronize_inputs().map_err(rt)?;
        let mut out = self.decoder.run_binding(&b).map_err(rt)?;
        let r = split_outputs(&mut out, &self.present_names)?;
        drop(out);
        self.check_placement(placement, &r);
        Ok(r)
    }

    fn run_plain(&mut self, c: &mut Common, inputs: &Inputs) -> Result<DecoderOut, BackendError> {
        let feed: Vec<(Cow<str>, SessionInputValue)> = inputs
            .iter()
            .map(|(n, v)| (Cow::from(n.as_str()), SessionInputValue::from(v)))
            .collect();
        let mut out = self
            .decoder
            .run(feed)
            .map_err(|e| BackendError::runtime(PART, e))?;
        super::tap_outputs(&mut c.tap, &out, PART)?;
        split_outputs(&mut out, &self.present_names)
    }
}

/// Records where the presents of a run are ([`KvStats::kv_location`]).
fn note_location(c: &mut Common, r: DecoderOut) -> Result<DecoderOut, BackendError> {
    c.stats.kv_location = r.1.first().map(location);
    Ok(r)
}

/// Takes the logits (last position of each row) and the presents out of a run's outputs.
fn split_outputs(
    out: &mut SessionOutputs<'_>,
    present_names: &[String],
) -> Result<DecoderOut, BackendError> {
    let logits = out
        .remove("logits")
        .ok_or_else(|| BackendError::runtime(PART, "no logits output"))?;
    let (shape, data) = read_f(&logits, PART)?;
    let (rows, vocab) = (shape[0].max(1), shape[2]);
    let per_row = data.len() / rows;
    let logits = data
        .chunks_exact(per_row)
        .map(|r| r[r.len() - vocab..].to_vec())
        .collect();
    let mut kv = Vec::with_capacity(present_names.len());
    for name in present_names {
        let v = out
            .remove(name)
            .ok_or_else(|| BackendError::runtime(PART, format!("no {name} output")))?;
        kv.push(as_tensor(v, PART)?);
    }
    Ok((logits, kv))
}

#[cfg(test)]
pub(super) mod tests {
    use std::cell::Cell;

    thread_local! {
        /// Makes this thread's bound decoder runs fail (fallback tests).
        pub static FAIL_BINDING: Cell<bool> = const { Cell::new(false) };
    }
}
