//! The profile `ocr`, `serve` and `bench` take when neither `--profile` nor
//! `--providers` is given: the largest built-in GPU profile the first GPU's memory holds
//! (`nvidia-smi`'s memory.total), else none, which runs on the CPU as before. A "16 GB" card
//! reports 15.99 GiB (16 376 MiB), an H100 79.6 GiB: a profile's `gpu_memory_gb` may exceed the
//! card's total by 3 %.

use super::{Profile, BUILTIN};

/// How far a profile's `gpu_memory_gb` may exceed the memory a card reports.
const SLACK: f64 = 1.03;

/// The name of the largest of `profiles` (name, `gpu_memory_gb`) that a card of `total_gib`
/// holds.
pub fn choose<'a>(total_gib: f64, profiles: &[(&'a str, f64)]) -> Option<&'a str> {
    profiles
        .iter()
        .filter(|(_, gb)| *gb <= total_gib * SLACK)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(n, _)| *n)
}

/// The built-in profiles that run on a GPU, with their `gpu_memory_gb`.
pub fn gpu_builtins() -> Vec<(&'static str, f64)> {
    BUILTIN
        .iter()
        .filter_map(|(name, _)| {
            let p = Profile::load(name).ok()?;
            p.uses_gpu().then_some((*name, p.gpu_memory_gb))
        })
        .collect()
}

/// The profile for this machine's first GPU and the GiB it reports, if it has one.
pub fn for_this_machine() -> Option<(&'static str, f64)> {
    let total_gib = crate::runtime::gpumem::total_mib(0)? / 1024.0;
    choose(total_gib, &gpu_builtins()).map(|name| (name, total_gib))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_profile_a_card_holds_is_chosen() {
        let ps = gpu_builtins();
        let names: Vec<&str> = ps.iter().map(|p| p.0).collect();
        assert_eq!(names, ["16gb", "24gb", "80gb"], "cpu runs on no GPU");
        let pick = |mib: f64| choose(mib / 1024.0, &ps);
        assert_eq!(pick(16_376.0), Some("16gb"), "RTX 4080 16 GB");
        assert_eq!(pick(24_564.0), Some("24gb"), "RTX A5000 24 GB");
        assert_eq!(pick(40_960.0), Some("24gb"), "A100 40 GB");
        assert_eq!(pick(81_559.0), Some("80gb"), "H100 80 GB");
        assert_eq!(pick(143_771.0), Some("80gb"), "H200");
        assert_eq!(pick(12_288.0), None, "a 12 GB card: none fits");
    }
}
