//! `--devices`: which devices run an engine each (`serve`, `ocr`).
//!
//! A list such as `0,1,2,3` (GPU indices, for the profile's GPU providers) or `cpu,cpu` (CPU
//! engines; the dispatcher does not care what a device is, which is how CI tests several
//! engines on a machine without a GPU). Each engine loads its own copy of the model; CPU
//! engines split the machine's cores between them unless `--threads` says otherwise.
//!
//! ```text
//! ocrctl serve --model out/m --profile 80gb --devices 0,1,2,3
//! ```

use crate::runtime::ortmodel::LoadOptions;
use crate::runtime::providers::Provider;
use std::str::FromStr;

/// Why a `--devices` list, or the options of one of its engines, cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DevicesError {
    #[error("--devices: give at least one device")]
    Empty,
    /// A GPU listed twice (its label).
    #[error("--devices: {0} is listed twice (one engine per GPU)")]
    Twice(String),
    /// A GPU device (its index) with CPU-only providers (their names, comma-separated).
    #[error(
        "--devices {0}: GPU {0} needs a GPU provider, but the providers are {1} \
         (use --providers cuda or a GPU profile, or `cpu` devices)"
    )]
    NoGpuProvider(u32, String),
}

/// One device of `--devices`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// An engine on the CPU provider only.
    Cpu,
    /// An engine on GPU `index` (CUDA's device ordinal), with the profile's GPU providers.
    Gpu(u32),
}

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Device, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("cpu") {
            return Ok(Device::Cpu);
        }
        let n = s
            .strip_prefix("cuda:")
            .or(s.strip_prefix("gpu:"))
            .unwrap_or(s);
        n.parse::<u32>()
            .map(Device::Gpu)
            .map_err(|_| format!("`{s}` is not a device: give GPU indices (0,1) or `cpu`"))
    }
}

/// The devices of `--devices` as labels unique within the list (`gpu:0`, `cpu:0`, `cpu:1`):
/// the `device` label of `/metrics` and the names `/health` reports.
pub fn labels(devices: &[Device]) -> Vec<String> {
    let mut cpus = 0;
    devices
        .iter()
        .map(|d| match d {
            Device::Gpu(i) => format!("gpu:{i}"),
            Device::Cpu => {
                cpus += 1;
                format!("cpu:{}", cpus - 1)
            }
        })
        .collect()
}

/// Checks a `--devices` list: not empty, no GPU twice.
pub fn check(devices: &[Device]) -> Result<(), DevicesError> {
    if devices.is_empty() {
        return Err(DevicesError::Empty);
    }
    for (i, d) in devices.iter().enumerate() {
        if let Device::Gpu(_) = d {
            if devices[..i].contains(d) {
                let label = labels(&devices[i..=i]).swap_remove(0);
                return Err(DevicesError::Twice(label));
            }
        }
    }
    Ok(())
}

/// The load options of the engine on `device`, from the command's `base`. A GPU device keeps
/// the profile's providers with that device's ordinal (an error when they are CPU-only); a CPU
/// device runs the CPU provider only, and `cpu_engines` CPU engines share the cores when
/// `base.threads` is 0 (all cores).
pub fn options_for(
    base: &LoadOptions,
    device: Device,
    cpu_engines: usize,
) -> Result<LoadOptions, DevicesError> {
    let mut o = base.clone();
    match device {
        Device::Gpu(i) => {
            if !o.providers.order.iter().any(|p| p.is_gpu()) {
                let names: Vec<&str> = o.providers.order.iter().map(|p| p.name()).collect();
                return Err(DevicesError::NoGpuProvider(i, names.join(",")));
            }
            o.providers.device_id = i as i32;
        }
        Device::Cpu => {
            o.providers.order = vec![Provider::Cpu];
            if o.threads == 0 && cpu_engines > 1 {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                o.threads = (cores / cpu_engines).max(1);
            }
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ocrctl_exporters::export::Precision;

    #[test]
    fn devices_parse_and_get_unique_labels() {
        let d: Vec<Device> = ["0", "cpu", " 3", "CPU", "cuda:1"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(
            d,
            [
                Device::Gpu(0),
                Device::Cpu,
                Device::Gpu(3),
                Device::Cpu,
                Device::Gpu(1)
            ]
        );
        assert_eq!(labels(&d), ["gpu:0", "cpu:0", "gpu:3", "cpu:1", "gpu:1"]);
        let e = "x1".parse::<Device>().unwrap_err();
        assert!(e.contains("`x1`"), "{e}");
        assert!("-1".parse::<Device>().is_err());
    }

    #[test]
    fn lists_are_checked() {
        assert!(check(&[]).is_err());
        assert!(check(&[Device::Cpu, Device::Cpu]).is_ok());
        let e = check(&[Device::Gpu(0), Device::Gpu(1), Device::Gpu(0)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("gpu:0 is listed twice"), "{e}");
    }

    /// The messages are those the functions wrote before they had an error type.
    #[test]
    fn errors_say_what_they_said() {
        assert_eq!(
            DevicesError::NoGpuProvider(1, "cpu".into()).to_string(),
            "--devices 1: GPU 1 needs a GPU provider, but the providers are cpu (use --providers \
             cuda or a GPU profile, or `cpu` devices)"
        );
        assert_eq!(
            DevicesError::Empty.to_string(),
            "--devices: give at least one device"
        );
    }

    #[test]
    fn each_device_gets_its_own_options() {
        let mut base = LoadOptions::new(Precision::Fp32);
        assert!(options_for(&base, Device::Gpu(0), 0)
            .unwrap_err()
            .to_string()
            .contains("needs a GPU provider"));
        base.providers.order = vec![Provider::Cuda, Provider::Cpu];
        let g = options_for(&base, Device::Gpu(2), 0).unwrap();
        assert_eq!(g.providers.device_id, 2);
        assert_eq!(g.providers.order, [Provider::Cuda, Provider::Cpu]);
        let c = options_for(&base, Device::Cpu, 2).unwrap();
        assert_eq!(c.providers.order, [Provider::Cpu]);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(c.threads, (cores / 2).max(1));
        base.threads = 3;
        assert_eq!(options_for(&base, Device::Cpu, 2).unwrap().threads, 3);
    }
}
