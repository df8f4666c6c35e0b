//! A graph's external weights read into process memory before its session is built.
//!
//! Loading from a file, ONNX Runtime memory-maps the external data file and the CPU
//! initializers point into that mapping (the exporter aligns them to 4 KiB so it can). A file
//! truncated or overwritten under a running server (`cp new/* live/`) then kills it with
//! SIGBUS at its next run (issue 42, N9). So the file is read here and handed over as an
//! in-memory file (`AddExternalInitializersFromFilesInMemory`, ONNX Runtime ≥ 1.18), which ONNX
//! Runtime copies initializer by initializer while it builds the session: the buffer is
//! dropped once the session exists, and no file of the export is referenced after the load
//! (`tests/live_weights.rs`). The price is a transient second copy of one graph's weights
//! during its load and a slower load (docs/benchmarks/2026-12-06-memory/).
//!
//! A CUDA session needs none of that: it copies every initializer to the device and unmaps
//! the file while it is built (no `.onnx_data` in `/proc/PID/maps` after loading the
//! full-size export on an H100, and truncating the files under the server changed no
//! answer), so its weights stay with ONNX Runtime's map ([`keeps_map`]), where reading cost
//! the fp16 export 8.1 s against 2.6 s of load and 3.0 against 1.0 GB of peak RSS.

use super::LoadError;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

/// Set: leave the external data to ONNX Runtime's memory map (measurements only).
pub const MAPPED_ENV: &str = "OCRCTL_WEIGHTS_MAPPED";

/// Whether a session of provider `p` may keep the export's files mapped once built, so its
/// weights are read into memory first: the CPU's initializers point into the map; TensorRT
/// and TensorRT-RTX were not checked (no such GPU lent), so they are read too.
pub(super) fn keeps_map(p: crate::runtime::providers::Provider) -> bool {
    p != crate::runtime::providers::Provider::Cuda
}

/// An external data file's bytes and the name the graph refers to it by.
pub(super) struct ExternalData {
    /// The file name relative to the graph (its initializers' `location`).
    pub name: String,
    pub bytes: Arc<[u8]>,
}

/// The external data of the graph file `graph`, read whole: `<file>_data` (the exporter's
/// name for it, `ocrctl_exporters::graph::Graph::create`); `None` when there is none.
pub(super) fn read(graph: &Path) -> Result<Option<ExternalData>, LoadError> {
    // The file mapped by ONNX Runtime as before, only to measure what reading costs (the
    // memory benchmark's load probe); a replaced file then SIGBUSes a running server again.
    if std::env::var_os(MAPPED_ENV).is_some() {
        return Ok(None);
    }
    let Some(file) = graph.file_name().and_then(|f| f.to_str()) else {
        return Ok(None);
    };
    let name = format!("{file}_data");
    let path = graph.with_file_name(&name);
    let err = |e: std::io::Error| LoadError::Session {
        path: path.clone(),
        message: format!("reading the graph's external weights: {e}"),
    };
    let mut f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(e)),
    };
    let len = f.metadata().map_err(err)?.len() as usize;
    // Collected from a sized iterator the slice is allocated once, in place (no Vec to copy
    // into an Arc: that would be a third copy of the weights at the peak).
    let mut bytes: Arc<[u8]> = std::iter::repeat_n(0u8, len).collect();
    let buf = Arc::get_mut(&mut bytes).expect("a fresh Arc is unique");
    f.read_exact(buf).map_err(err)?;
    // A file that grew while read is as suspect as one that shrank (read_exact names that).
    if f.read(&mut [0u8; 1]).map_err(err)? != 0 {
        return Err(err(std::io::Error::other(format!(
            "the file changed while it was read (more than its {len} bytes)"
        ))));
    }
    Ok(Some(ExternalData { name, bytes }))
}

#[cfg(test)]
mod tests;
