//! A [`Budget`] read back: whether it fits, the problems, the advice, and the table it prints.

use super::*;

impl Budget {
    /// Whether the profile fits: memory, KV budget, arena limit, positions and image side.
    pub fn fits(&self) -> bool {
        self.problems.is_empty()
    }

    /// Device (or host) memory left after the total, bytes (negative when over).
    pub fn headroom(&self) -> Option<i64> {
        self.capacity
            .map(|c| c as i64 - self.total.min(i64::MAX as u64) as i64)
    }

    /// The profile the budget was computed for.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    fn refit(&self, f: impl FnOnce(&mut Profile)) -> Budget {
        let mut p = self.profile.clone();
        f(&mut p);
        budget_with(
            &p,
            &self.dims,
            self.weights_bytes,
            self.gpu_memory_bytes,
            self.options,
        )
    }

    /// What to lower for the profile to fit, each with the largest value that fits: empty
    /// when it fits. Levers: `max_batch_size`, `max_sequence_length` (with the
    /// `max_new_tokens_limit` it implies), `max_image_side`, `precision` (activations and KV
    /// cache only: the weights of another precision come from its own export), and the
    /// limits `kv_cache_gb` / `cuda.memory_limit_gb` when only they are short.
    pub fn advice(&self) -> Vec<Advice> {
        if self.fits() {
            return Vec::new();
        }
        let mut out = vec![
            self.batch_advice(),
            self.sequence_advice(),
            self.image_side_advice(),
            self.precision_advice(),
        ];
        out.extend(self.problems.iter().filter_map(|pr| self.limit_advice(pr)));
        out
    }

    /// The largest `max_batch_size` that fits.
    fn batch_advice(&self) -> Advice {
        let p = &self.profile;
        let batch = (1..p.max_batch_size)
            .rev()
            .find(|&b| self.refit(|q| q.max_batch_size = b).fits());
        Advice {
            field: "max_batch_size".into(),
            current: p.max_batch_size.to_string(),
            suggested: batch.map(|b| b.to_string()),
            note: match batch {
                Some(b) => format!(
                    "KV cache {} at {b} sequences",
                    gib_str(self.refit(|q| q.max_batch_size = b).kv_cache)
                ),
                None if p.max_batch_size > 1 => "even 1 does not fit".into(),
                None => "already 1".into(),
            },
        }
    }

    /// The largest `max_sequence_length` that fits (a multiple of 256, else the shortest
    /// that holds a full prompt and one new token).
    fn sequence_advice(&self) -> Advice {
        let p = &self.profile;
        let prompt = p.max_prompt_tokens();
        let lowest = prompt + 1;
        let seq = p.max_sequence_length as u64;
        let mut candidates: Vec<u64> = (lowest..seq)
            .filter(|s| s.is_multiple_of(256))
            .rev()
            .collect();
        if lowest < seq {
            candidates.push(lowest);
        }
        let found = candidates
            .into_iter()
            .find(|&s| self.refit(|q| q.max_sequence_length = s as u32).fits());
        Advice {
            field: "max_sequence_length".into(),
            current: p.max_sequence_length.to_string(),
            suggested: found.map(|s| s.to_string()),
            note: match found {
                Some(s) if s - prompt < p.max_new_tokens_limit as u64 => format!(
                    "max_new_tokens_limit then at most {} for a {}×{} page",
                    s - prompt,
                    p.max_image_side,
                    p.max_image_side
                ),
                Some(_) => String::new(),
                None => format!(
                    "not even {lowest} (a full {}×{} prompt and one new token)",
                    p.max_image_side, p.max_image_side
                ),
            },
        }
    }

    /// The largest `max_image_side` (a multiple of the side unit) that fits.
    fn image_side_advice(&self) -> Advice {
        let p = &self.profile;
        let side = (1..p.max_image_side / IMAGE_SIDE_UNIT)
            .rev()
            .map(|k| k * IMAGE_SIDE_UNIT)
            .find(|&s| self.refit(|q| q.max_image_side = s).fits());
        Advice {
            field: "max_image_side".into(),
            current: p.max_image_side.to_string(),
            suggested: side.map(|s| s.to_string()),
            note: match side {
                Some(_) => "pages are downscaled further (small print suffers)".into(),
                None => "lowering it alone is not enough".into(),
            },
        }
    }

    /// A precision with lighter activations and KV cache that fits.
    fn precision_advice(&self) -> Advice {
        let p = &self.profile;
        let eb = activation_bytes(p.precision);
        let lighter: Vec<Precision> = [Precision::Fp16, Precision::Int4Fp16]
            .into_iter()
            .filter(|&c| activation_bytes(c) < eb)
            .collect();
        let prec = lighter
            .into_iter()
            .find(|&c| self.refit(|q| q.precision = c).fits());
        Advice {
            field: "precision".into(),
            current: p.precision.name().into(),
            suggested: prec.map(|c| c.name().to_string()),
            note: match prec {
                Some(c) => format!(
                    "16-bit activations and KV cache; export `--precision {}` (its weights are smaller too)",
                    c.name()
                ),
                None if eb == 2 => {
                    "activations are already 16-bit; int4-fp16 weights shrink only the weights row"
                        .into()
                }
                None => "16-bit activations alone are not enough".into(),
            },
        }
    }

    /// The limit to raise for problem `pr`, when it is `kv_cache_gb` or
    /// `cuda.memory_limit_gb` (lowering max_sequence_length / max_image_side covers the
    /// others).
    fn limit_advice(&self, pr: &Problem) -> Option<Advice> {
        let p = &self.profile;
        match pr {
            Problem::KvBudget { need, .. } => {
                let others_ok = self
                    .refit(|q| q.kv_cache_gb = (*need as f64 / GIB as f64 * 100.0).ceil() / 100.0)
                    .fits();
                Some(Advice {
                    field: "kv_cache_gb".into(),
                    current: format!("{}", p.kv_cache_gb),
                    suggested: Some(format!(
                        "{:.2}",
                        (*need as f64 / GIB as f64 * 100.0).ceil() / 100.0
                    )),
                    note: if others_ok {
                        "the device has room for it".into()
                    } else {
                        "raising it alone is not enough".into()
                    },
                })
            }
            Problem::Arena { need, .. } => {
                let v = (*need as f64 / GIB as f64 * 100.0).ceil() / 100.0;
                Some(Advice {
                    field: "cuda.memory_limit_gb".into(),
                    current: p
                        .cuda
                        .as_ref()
                        .map_or(String::new(), |c| c.memory_limit_gb.to_string()),
                    suggested: Some(format!("{v:.2}")),
                    note: "the arena must hold the weights, the KV cache and the activations"
                        .into(),
                })
            }
            Problem::Positions { .. } | Problem::ImageSide { .. } | Problem::Memory { .. } => None,
        }
    }
}

pub(crate) fn gib_str(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / GIB as f64)
}

pub(crate) fn mib_str(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / MIB as f64)
}

pub(crate) fn kib_str(b: u64) -> String {
    if b.is_multiple_of(1024) {
        format!("{} KiB", b / 1024)
    } else {
        format!("{:.1} KiB", b as f64 / 1024.0)
    }
}

/// One line of the budget table: item, bytes (none: a dash, or a blank line when the item
/// is empty too), how.
type Line = (String, Option<i128>, String);

impl Budget {
    /// The table's lines: the rows, the total, the capacity and headroom, then the limits.
    fn table_lines(&self) -> Vec<Line> {
        let mut lines: Vec<Line> = self
            .rows
            .iter()
            .map(|r| (r.item.clone(), Some(r.bytes as i128), r.detail.clone()))
            .collect();
        lines.push(("".into(), None, "".into()));
        lines.push(("total".into(), Some(self.total as i128), String::new()));
        match self.capacity {
            Some(c) => {
                lines.push((self.capacity_label.clone(), Some(c as i128), String::new()));
                lines.push((
                    "headroom".into(),
                    Some(c as i128 - self.total as i128),
                    format!(
                        "at least {:.0}% ({}) required",
                        MIN_HEADROOM_FRACTION * 100.0,
                        gib_str((c as f64 * MIN_HEADROOM_FRACTION) as u64)
                    ),
                ));
            }
            None => lines.push((
                self.capacity_label.clone(),
                None,
                "unknown: pass --gpu-memory to compare".into(),
            )),
        }
        lines.push((
            "kv_cache_gb".into(),
            Some(self.kv_budget as i128),
            format!(
                "KV cache needs {} ({})",
                gib_str(self.kv_cache),
                if self.kv_cache <= self.kv_budget {
                    "within"
                } else {
                    "OVER"
                }
            ),
        ));
        if let Some((need, limit)) = self.arena {
            lines.push((
                "cuda.memory_limit_gb".into(),
                Some(limit as i128),
                format!(
                    "ONNX Runtime allocates {} ({})",
                    gib_str(need),
                    if need <= limit { "within" } else { "OVER" }
                ),
            ));
        }
        lines
    }

    /// The verdict (memory and the model's own limits are different verdicts: a profile can
    /// fit in memory and still ask for more positions than the model takes) and the notes.
    fn write_verdict(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (model_limits, memory): (Vec<&Problem>, Vec<&Problem>) = self
            .problems
            .iter()
            .partition(|p| matches!(p, Problem::Positions { .. } | Problem::ImageSide { .. }));
        if self.fits() {
            writeln!(f, "verdict: fits")?;
        } else if memory.is_empty() {
            writeln!(
                f,
                "verdict: fits in memory, but the model cannot take these limits"
            )?;
        } else {
            writeln!(f, "verdict: does NOT fit in memory")?;
            for pr in &memory {
                writeln!(f, "  - {pr}")?;
            }
            if !model_limits.is_empty() {
                writeln!(f, "and the model cannot take these limits:")?;
            }
        }
        for pr in &model_limits {
            writeln!(f, "  - {pr}")?;
        }
        if !self.notes.is_empty() {
            writeln!(f, "notes:")?;
            for n in &self.notes {
                writeln!(f, "  - {n}")?;
            }
        }
        Ok(())
    }
}

/// `lines` aligned: item, MiB, GiB, how.
fn write_table(f: &mut fmt::Formatter<'_>, lines: &[Line]) -> fmt::Result {
    let w = lines
        .iter()
        .map(|l| l.0.chars().count())
        .max()
        .unwrap_or(0)
        .max(4);
    writeln!(f, "{:<w$}  {:>10}  {:>8}  how", "item", "MiB", "GiB")?;
    for (item, bytes, detail) in lines {
        match bytes {
            Some(b) => writeln!(
                f,
                "{}",
                format!(
                    "{:<w$}  {:>10.1}  {:>8.3}  {}",
                    item,
                    *b as f64 / MIB as f64,
                    *b as f64 / GIB as f64,
                    detail
                )
                .trim_end()
            )?,
            None if item.is_empty() => writeln!(f)?,
            None => writeln!(f, "{:<w$}  {:>10}  {:>8}  {}", item, "-", "-", detail)?,
        }
    }
    Ok(())
}

impl fmt::Display for Budget {
    /// An aligned table: item, MiB, GiB, how; then total, capacity, headroom, limits, the
    /// verdict and the notes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.profile;
        writeln!(
            f,
            "profile {} ({}): {}, batch {} × {} tokens, images up to {}×{}",
            p.name,
            p.source,
            p.precision.name(),
            p.max_batch_size,
            p.max_sequence_length,
            p.max_image_side,
            p.max_image_side
        )?;
        write_table(f, &self.table_lines())?;
        self.write_verdict(f)
    }
}
