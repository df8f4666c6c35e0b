//! GPU memory of this process, from `nvidia-smi` (absent when there is no NVIDIA driver).

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
    let out = Command::new("nvidia-smi")
        .args([
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    parse_compute_apps(&String::from_utf8_lossy(&out.stdout), std::process::id())
        .map(|mib| mib * 1024 * 1024)
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
}
