//! GPU memory from `nvidia-smi`: this process's (for `/metrics` and `ocrctl bench`) and the
//! device's used and total memory (for `bench`).
//!
//! `nvidia-smi --query-compute-apps=pid,used_memory` gives each process's GPU memory; ours is
//! the lines with our pid (summed over GPUs). `--query-gpu=memory.total,memory.used` gives
//! the device's total and used memory (the line of the configured device). [`GpuMonitor`]
//! polls both at phase ends and keeps the maxima; ONNX Runtime's CUDA arena keeps what it
//! grew to, so a poll after a phase sees that phase's peak. When nvidia-smi is missing or
//! prints nothing usable (e.g. our pid is not visible from a container), the values are
//! absent, not errors.

use serde_json::{json, Value};
use std::process::Command;

/// Parses `nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`
/// and returns the MiB used by `pid`, summed over GPUs.
pub fn parse_compute_apps(text: &str, pid: u32) -> Option<u64> {
    let mut total = None;
    for line in text.lines() {
        let mut it = line.split(',').map(str::trim);
        let (Some(p), Some(m)) = (it.next(), it.next()) else {
            continue;
        };
        if p.parse::<u32>().ok() == Some(pid) {
            if let Ok(mib) = m.parse::<u64>() {
                *total.get_or_insert(0) += mib;
            }
        }
    }
    total
}

/// Bytes of GPU memory held by this process, if `nvidia-smi` can tell.
pub fn process_gpu_memory() -> Option<u64> {
    let csv = nvidia_smi("--query-compute-apps=pid,used_memory")?;
    parse_compute_apps(&csv, std::process::id()).map(|mib| mib * 1024 * 1024)
}

/// `(total, used)` MiB of GPU `index` from `--query-gpu=memory.total,memory.used` CSV output
/// (`noheader,nounits`, one line per GPU).
pub fn parse_gpu_mib(csv: &str, index: usize) -> Option<(f64, f64)> {
    let line = csv.lines().filter(|l| !l.trim().is_empty()).nth(index)?;
    let (t, u) = line.split_once(',')?;
    Some((t.trim().parse().ok()?, u.trim().parse().ok()?))
}

/// Compute capability `(major, minor)` of GPU `index` from `--query-gpu=compute_cap` CSV
/// output (`noheader,nounits`, one line per GPU, e.g. `9.0`).
pub fn parse_compute_cap(csv: &str, index: usize) -> Option<(u32, u32)> {
    let line = csv.lines().filter(|l| !l.trim().is_empty()).nth(index)?;
    let (major, minor) = line.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Total memory of GPU `index` in MiB, as `nvidia-smi` numbers GPUs, if it can tell.
pub fn total_mib(index: usize) -> Option<f64> {
    parse_gpu_mib(&nvidia_smi("--query-gpu=memory.total,memory.used")?, index).map(|(t, _)| t)
}

/// Compute capability of GPU `index` as `nvidia-smi` numbers GPUs, if it can tell (drivers
/// since 510; `CUDA_VISIBLE_DEVICES` may number them differently).
pub fn compute_capability(index: usize) -> Option<(u32, u32)> {
    parse_compute_cap(&nvidia_smi("--query-gpu=compute_cap")?, index)
}

fn nvidia_smi(query: &str) -> Option<String> {
    let out = Command::new("nvidia-smi")
        .args([query, "--format=csv,noheader,nounits"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Maxima of GPU memory over the polls so far.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct GpuPeak {
    /// This process's GPU memory (MiB).
    pub process_mib: Option<f64>,
    /// The device's used memory (MiB), all processes.
    pub used_mib: Option<f64>,
    /// The device's total memory (MiB).
    pub total_mib: Option<f64>,
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    }
}

impl GpuPeak {
    /// Folds a newer sample in.
    pub fn merge(&mut self, s: &GpuPeak) {
        self.process_mib = max_opt(self.process_mib, s.process_mib);
        self.used_mib = max_opt(self.used_mib, s.used_mib);
        self.total_mib = self.total_mib.or(s.total_mib);
    }

    /// `{"process_peak_mib", "used_peak_mib", "total_mib"}`, or `null` when nothing was read.
    pub fn json(&self) -> Value {
        if *self == GpuPeak::default() {
            return Value::Null;
        }
        json!({
            "process_peak_mib": self.process_mib,
            "used_peak_mib": self.used_mib,
            "total_mib": self.total_mib,
        })
    }
}

/// Polls `nvidia-smi` (when enabled) and keeps the peaks.
pub struct GpuMonitor {
    enabled: bool,
    device: usize,
    /// Peaks since the start.
    pub total: GpuPeak,
}

impl GpuMonitor {
    /// A monitor for GPU `device`; a disabled one (CPU provider) never runs nvidia-smi.
    pub fn new(enabled: bool, device: usize) -> GpuMonitor {
        GpuMonitor {
            enabled,
            device,
            total: GpuPeak::default(),
        }
    }

    /// Reads the current values, folds them into the totals and returns them.
    pub fn poll(&mut self) -> GpuPeak {
        if !self.enabled {
            return GpuPeak::default();
        }
        let process_mib = nvidia_smi("--query-compute-apps=pid,used_memory")
            .and_then(|s| parse_compute_apps(&s, std::process::id()))
            .map(|mib| mib as f64);
        let gpu = nvidia_smi("--query-gpu=memory.total,memory.used")
            .and_then(|s| parse_gpu_mib(&s, self.device));
        let s = GpuPeak {
            process_mib,
            used_mib: gpu.map(|g| g.1),
            total_mib: gpu.map(|g| g.0),
        };
        self.total.merge(&s);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_this_pids_rows_only() {
        let t = "1234, 812\n999, 4000\n1234, 100\n[Not Supported]\n";
        assert_eq!(parse_compute_apps(t, 1234), Some(912));
        assert_eq!(parse_compute_apps(t, 5), None);
    }

    #[test]
    fn process_memory_ignores_what_is_not_a_number() {
        // MIG and some containers print [N/A] or a notice instead of numbers.
        assert_eq!(parse_compute_apps("1234, [N/A]\n", 1234), None);
        assert_eq!(
            parse_compute_apps("No running processes found\n", 1234),
            None
        );
    }

    #[test]
    fn gpu_totals_are_read_per_device() {
        let csv = "143771, 20480\n143771, 5\n";
        assert_eq!(parse_gpu_mib(csv, 0), Some((143771.0, 20480.0)));
        assert_eq!(parse_gpu_mib(csv, 1), Some((143771.0, 5.0)));
        assert_eq!(parse_gpu_mib(csv, 2), None);
        assert_eq!(parse_gpu_mib("[N/A], [N/A]\n", 0), None);
    }

    #[test]
    fn compute_capability_is_read_per_device() {
        let csv = "9.0\n8.6\n\n12.0\n";
        assert_eq!(parse_compute_cap(csv, 0), Some((9, 0)));
        assert_eq!(parse_compute_cap(csv, 1), Some((8, 6)));
        assert_eq!(parse_compute_cap(csv, 2), Some((12, 0)));
        assert_eq!(parse_compute_cap(csv, 3), None);
        assert_eq!(parse_compute_cap("[N/A]\n", 0), None);
    }

    #[test]
    fn peaks_keep_the_maximum_and_are_null_when_unread() {
        let mut p = GpuPeak::default();
        assert_eq!(p.json(), Value::Null);
        p.merge(&GpuPeak {
            process_mib: Some(100.0),
            used_mib: Some(500.0),
            total_mib: Some(1000.0),
        });
        p.merge(&GpuPeak {
            process_mib: Some(80.0),
            used_mib: None,
            total_mib: Some(1000.0),
        });
        assert_eq!(p.process_mib, Some(100.0));
        assert_eq!(p.used_mib, Some(500.0));
        assert_eq!(p.json()["total_mib"], 1000.0);
        let mut off = GpuMonitor::new(false, 0);
        assert_eq!(off.poll(), GpuPeak::default());
        assert_eq!(off.total.json(), Value::Null);
    }
}
