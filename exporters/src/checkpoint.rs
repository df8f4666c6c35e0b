//! Memory-mapped safetensors checkpoints (one file or sharded) behind the [`Weights`] trait.
//!
//! A checkpoint directory holds `model.safetensors`, or shards listed in
//! `model.safetensors.index.json` (`weight_map`: tensor name → file). Headers are parsed
//! and validated up front (truncated or corrupt files fail here, naming the file); tensor
//! data stays memory-mapped and is converted to `f32` one tensor at a time.

use crate::ExportError;
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

/// A source of named weight tensors (a real checkpoint or random dummy weights).
pub trait Weights {
    /// The tensor `name` as `f32`, which must have exactly `shape`.
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ExportError>;
    /// Whether the tensor exists.
    fn contains(&self, name: &str) -> bool;
    /// Storage dtype of the weights (`bfloat16`, `float16`, `float32`), for the manifest.
    fn source_dtype(&self) -> String;
}

struct TensorLoc {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// A safetensors checkpoint opened from a directory.
pub struct Checkpoint {
    files: Vec<(PathBuf, Mmap)>,
    tensors: HashMap<String, TensorLoc>,
}

impl Checkpoint {
    /// Opens `dir/model.safetensors` or the shards named by `dir/model.safetensors.index.json`.
    pub fn open(dir: &Path) -> Result<Checkpoint, ExportError> {
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let paths: Vec<PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|e| ExportError::io(&index, e))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| ExportError::config(&index, format!("invalid JSON: {e}")))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| {
                    ExportError::config(&index, "field `weight_map` missing or not an object")
                })?;
            let mut files: Vec<String> = map
                .values()
                .map(|f| {
                    f.as_str().map(str::to_string).ok_or_else(|| {
                        ExportError::config(
                            &index,
                            "field `weight_map`: file names must be strings",
                        )
                    })
                })
                .collect::<Result<_, _>>()?;
            files.sort();
            files.dedup();
            files.into_iter().map(|f| dir.join(f)).collect()
        } else if single.exists() {
            vec![single]
        } else {
            return Err(ExportError::Invalid(format!(
                "{}: no model.safetensors or model.safetensors.index.json",
                dir.display()
            )));
        };
        Checkpoint::open_files(paths)
    }

    /// Opens the given safetensors files as one tensor collection.
    pub fn open_files(paths: Vec<PathBuf>) -> Result<Checkpoint, ExportError> {
        let mut ck = Checkpoint {
            files: Vec::new(),
            tensors: HashMap::new(),
        };
        for path in paths {
            ck.add_file(path)?;
        }
        Ok(ck)
    }

    /// Where tensor `name` lives: its record, file and mapping (missing: an error listing
    /// the files searched).
    fn locate(&self, name: &str) -> Result<(&TensorLoc, &PathBuf, &Mmap), ExportError> {
        let loc = self
            .tensors
            .get(name)
            .ok_or_else(|| ExportError::MissingTensor {
                tensor: name.to_string(),
                searched: self
                    .files
                    .iter()
                    .map(|(p, _)| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let (path, map) = &self.files[loc.file];
        Ok((loc, path, map))
    }

    /// A `U8` tensor's raw values (e.g. reference images stored next to goldens).
    pub fn get_u8(&self, name: &str, shape: &[usize]) -> Result<Vec<u8>, ExportError> {
        let (loc, path, map) = self.locate(name)?;
        if loc.shape != shape || loc.dtype != Dtype::U8 {
            return Err(ExportError::TensorShape {
                tensor: name.to_string(),
                file: path.clone(),
                expected: shape.to_vec(),
                found: loc.shape.clone(),
            });
        }
        Ok(map[loc.start..loc.end].to_vec())
    }

    /// Shape of tensor `name`, if present.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).map(|t| t.shape.as_slice())
    }

    fn add_file(&mut self, path: PathBuf) -> Result<(), ExportError> {
        let f = File::open(&path).map_err(|e| ExportError::io(&path, e))?;
        // SAFETY: the file is only read; ocrctl never writes checkpoints it has mapped.
        let map = unsafe { Mmap::map(&f) }.map_err(|e| ExportError::io(&path, e))?;
        let (header_len, meta) =
            SafeTensors::read_metadata(&map).map_err(|e| ExportError::Safetensors {
                file: path.clone(),
                message: e.to_string(),
            })?;
        let base = 8 + header_len;
        let idx = self.files.len();
        for (name, info) in meta.tensors() {
            self.tensors.insert(
                name.clone(),
                TensorLoc {
                    file: idx,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start: base + info.data_offsets.0,
                    end: base + info.data_offsets.1,
                },
            );
        }
        self.files.push((path, map));
        Ok(())
    }

    /// Tensor names and shapes, sorted (for reports and tests).
    pub fn shapes(&self) -> BTreeMap<String, Vec<usize>> {
        self.tensors
            .iter()
            .map(|(k, v)| (k.clone(), v.shape.clone()))
            .collect()
    }

    /// The files backing this checkpoint.
    pub fn files(&self) -> Vec<PathBuf> {
        self.files.iter().map(|(p, _)| p.clone()).collect()
    }
}

/// Converts little-endian `bf16`/`f16`/`f32` bytes to `f32` (byte-wise: mmap data need not
/// be aligned).
fn to_f32(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}

impl Weights for Checkpoint {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ExportError> {
        let (loc, path, map) = self.locate(name)?;
        if loc.shape != shape {
            return Err(ExportError::TensorShape {
                tensor: name.to_string(),
                file: path.clone(),
                expected: shape.to_vec(),
                found: loc.shape.clone(),
            });
        }
        to_f32(loc.dtype, &map[loc.start..loc.end]).ok_or_else(|| ExportError::TensorDtype {
            tensor: name.to_string(),
            file: path.clone(),
            dtype: format!("{:?}", loc.dtype),
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn source_dtype(&self) -> String {
        let mut kinds: Vec<String> = self
            .tensors
            .values()
            .map(|t| format!("{:?}", t.dtype).to_lowercase())
            .collect();
        kinds.sort();
        kinds.dedup();
        kinds.join("+")
    }
}

/// Test weights whose every value is its own index + 1, of any requested shape.
#[cfg(test)]
pub(crate) struct CountingWeights;

#[cfg(test)]
impl Weights for CountingWeights {
    fn get(&self, _: &str, shape: &[usize]) -> Result<Vec<f32>, ExportError> {
        Ok((0..shape.iter().product::<usize>())
            .map(|i| i as f32 + 1.0)
            .collect())
    }
    fn contains(&self, _: &str) -> bool {
        true
    }
    fn source_dtype(&self) -> String {
        "test".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_st(path: &Path, header: &str, data: &[u8]) {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(data);
        std::fs::write(path, b).unwrap();
    }

    #[test]
    fn reads_bf16_and_checks_shapes() {
        let d = tempfile::tempdir().unwrap();
        let mut data = Vec::new();
        for v in [1.0f32, -2.5, 0.15625, 3.0] {
            data.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes());
        }
        write_st(
            &d.path().join("model.safetensors"),
            r#"{"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}"#,
            &data,
        );
        let ck = Checkpoint::open(d.path()).unwrap();
        assert_eq!(ck.get("w", &[2, 2]).unwrap(), vec![1.0, -2.5, 0.15625, 3.0]);
        let e = ck.get("w", &[4]).unwrap_err().to_string();
        assert!(
            e.contains("`w`") && e.contains("[4]") && e.contains("[2, 2]"),
            "{e}"
        );
        let e = ck.get("nope", &[1]).unwrap_err().to_string();
        assert!(
            e.contains("`nope`") && e.contains("model.safetensors"),
            "{e}"
        );
    }

    #[test]
    fn truncated_and_corrupt_files_name_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("model.safetensors");
        write_st(
            &p,
            r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
            &[0u8; 7],
        );
        let e = Checkpoint::open(d.path()).err().unwrap().to_string();
        assert!(
            e.contains("model.safetensors") && e.contains("not a valid safetensors"),
            "{e}"
        );
        std::fs::write(&p, b"\xff\xff\xff\xff\x00\x00\x00\x00{").unwrap();
        let e = Checkpoint::open(d.path()).err().unwrap().to_string();
        assert!(e.contains("not a valid safetensors"), "{e}");
        write_st(&p, "{not json", &[]);
        assert!(Checkpoint::open(d.path()).is_err());
    }

    #[test]
    fn unsupported_dtype_is_reported() {
        let d = tempfile::tempdir().unwrap();
        write_st(
            &d.path().join("model.safetensors"),
            r#"{"w":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}"#,
            &[0u8; 4],
        );
        let e = Checkpoint::open(d.path())
            .unwrap()
            .get("w", &[1])
            .unwrap_err();
        assert!(e.to_string().contains("dtype I32"), "{e}");
    }

    #[test]
    fn sharded_checkpoints_follow_the_index() {
        let d = tempfile::tempdir().unwrap();
        write_st(
            &d.path().join("a.safetensors"),
            r#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            &2.0f32.to_le_bytes(),
        );
        write_st(
            &d.path().join("b.safetensors"),
            r#"{"y":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}}"#,
            &half::f16::from_f32(0.5).to_le_bytes(),
        );
        std::fs::write(
            d.path().join("model.safetensors.index.json"),
            r#"{"weight_map":{"x":"a.safetensors","y":"b.safetensors"}}"#,
        )
        .unwrap();
        let ck = Checkpoint::open(d.path()).unwrap();
        assert_eq!(ck.get("x", &[1]).unwrap(), vec![2.0]);
        assert_eq!(ck.get("y", &[1]).unwrap(), vec![0.5]);
    }
}
