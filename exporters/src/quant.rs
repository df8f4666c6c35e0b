//! Block-wise symmetric INT4 weight quantization and the two ONNX layouts ocrctl writes.
//!
//! For a Linear with ONNX weight `W [K, N]` (input features K, output features N), each
//! block of `block_size` consecutive rows of one column shares a scale
//! `s = amax / 7` (round-to-nearest, zero point 0, values clamped to [-8, 7]).
//!
//! - [`pack_int4_rows`]: ONNX `INT4` tensor data, row-major `[K, N]`, two values per byte,
//!   the even element in the low nibble (ONNX IR spec, "4 bit integer types"). Used as
//!   `DequantizeLinear(W, scale [K/bs, N], axis=0, block_size=bs) → MatMul` (opset 21), the
//!   form TensorRT parses and ONNX Runtime fuses into `MatMulNBits`.
//! - [`pack_matmulnbits`]: `com.microsoft.MatMulNBits` `B` as uint8 `[N, K/bs, bs/2]`
//!   (transposed), each nibble `q + 8`, scales `[N · K/bs]`.
//!
//! Both layouts hold the same integers and scales, so they dequantize identically.

/// Quantized weights: `q[k·N + n]` in [-8, 7] and `scales[(k / bs)·N + n]`.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockQuant {
    pub k: usize,
    pub n: usize,
    pub block_size: usize,
    pub q: Vec<i8>,
    pub scales: Vec<f32>,
}

/// Checks a block size: a power of two ≥ 16 that divides `k`.
pub fn check_block_size(block_size: usize, k: usize, tensor: &str) -> Result<(), String> {
    if block_size < 16 || !block_size.is_power_of_two() {
        return Err(format!(
            "block size {block_size} must be a power of two >= 16"
        ));
    }
    if !k.is_multiple_of(block_size) {
        return Err(format!(
            "block size {block_size} does not divide the input dimension {k} of `{tensor}`"
        ));
    }
    Ok(())
}

/// Round-to-nearest symmetric quantization of `w` (`[K, N]` row-major). Scales are
/// rounded to float16 first, so that fp16- and fp32-scale graphs hold identical values.
pub fn quantize(w: &[f32], k: usize, n: usize, block_size: usize) -> BlockQuant {
    assert_eq!(w.len(), k * n);
    assert_eq!(k % block_size, 0);
    let blocks = k / block_size;
    let mut scales = vec![0f32; blocks * n];
    for b in 0..blocks {
        for col in 0..n {
            let mut amax = 0f32;
            for r in b * block_size..(b + 1) * block_size {
                amax = amax.max(w[r * n + col].abs());
            }
            let s = half::f16::from_f32(amax / 7.0).to_f32();
            scales[b * n + col] = s;
        }
    }
    let q = (0..k * n)
        .map(|i| {
            let (r, col) = (i / n, i % n);
            let s = scales[(r / block_size) * n + col];
            if s == 0.0 {
                0
            } else {
                (w[i] / s).round().clamp(-8.0, 7.0) as i8
            }
        })
        .collect();
    BlockQuant {
        k,
        n,
        block_size,
        q,
        scales,
    }
}

impl BlockQuant {
    /// The dequantized weights `q · s`, `[K, N]`.
    pub fn dequantize(&self) -> Vec<f32> {
        (0..self.k * self.n)
            .map(|i| {
                let (r, col) = (i / self.n, i % self.n);
                self.q[i] as f32 * self.scales[(r / self.block_size) * self.n + col]
            })
            .collect()
    }
}

/// Packs signed 4-bit values two per byte, even index in the low nibble (ONNX `INT4`).
pub fn pack_int4_rows(q: &[i8]) -> Vec<u8> {
    q.chunks(2)
        .map(|c| {
            let lo = (c[0] as u8) & 0x0f;
            let hi = c.get(1).map_or(0, |v| (*v as u8) & 0x0f);
            lo | (hi << 4)
        })
        .collect()
}

/// `MatMulNBits` layout: `B` uint8 `[N, K/bs, bs/2]` with nibble `q + 8` (low nibble =
/// even k), and scales `[N, K/bs]`.
pub fn pack_matmulnbits(bq: &BlockQuant) -> (Vec<u8>, Vec<f32>) {
    let (k, n, bs) = (bq.k, bq.n, bq.block_size);
    let blocks = k / bs;
    let mut b = vec![0u8; n * k / 2];
    let mut scales = vec![0f32; n * blocks];
    for col in 0..n {
        for blk in 0..blocks {
            scales[col * blocks + blk] = bq.scales[blk * n + col];
            for j in 0..bs / 2 {
                let r0 = blk * bs + 2 * j;
                let lo = (bq.q[r0 * n + col] + 8) as u8;
                let hi = (bq.q[(r0 + 1) * n + col] + 8) as u8;
                b[(col * blocks + blk) * (bs / 2) + j] = lo | (hi << 4);
            }
        }
    }
    (b, scales)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int4_packing_puts_the_even_element_in_the_low_nibble() {
        assert_eq!(pack_int4_rows(&[1, 2, -1, -8, 7]), vec![0x21, 0x8f, 0x07]);
    }

    #[test]
    fn quantization_is_round_to_nearest_with_amax_over_seven() {
        // K = 16 (one block), N = 2: column 0 has amax 7 → scale 1.
        let mut w = vec![0f32; 32];
        for r in 0..16 {
            w[r * 2] = r as f32 - 7.6; // -7.6 ..= 7.4 → amax 7.6
            w[r * 2 + 1] = 0.0;
        }
        let q = quantize(&w, 16, 2, 16);
        let s = half::f16::from_f32(7.6 / 7.0).to_f32();
        assert_eq!(q.scales, vec![s, 0.0]);
        assert_eq!(q.q[0], -7);
        assert_eq!(q.q[2 * 15], (7.4f32 / s).round() as i8);
        assert!(q.q.iter().skip(1).step_by(2).all(|v| *v == 0));
        let deq = q.dequantize();
        for (a, b) in w.iter().zip(&deq) {
            assert!((a - b).abs() <= s / 2.0 + 1e-6);
        }
    }

    #[test]
    fn matmulnbits_layout_is_transposed_with_offset_eight() {
        let (k, n) = (32, 3);
        let w: Vec<f32> = (0..k * n)
            .map(|i| ((i * 37 % 17) as f32 - 8.0) / 3.0)
            .collect();
        let q = quantize(&w, k, n, 16);
        let (b, s) = pack_matmulnbits(&q);
        assert_eq!(b.len(), n * 2 * 8);
        // Unpack and compare with the row-major integers.
        for col in 0..n {
            for r in 0..k {
                let (blk, within) = (r / 16, r % 16);
                let byte = b[(col * 2 + blk) * 8 + within / 2];
                let nib = if within % 2 == 0 {
                    byte & 0x0f
                } else {
                    byte >> 4
                };
                assert_eq!(nib as i8 - 8, q.q[r * n + col]);
            }
            assert_eq!(s[col * 2 + 1], q.scales[n + col]);
        }
    }

    #[test]
    fn block_sizes_are_validated() {
        assert!(check_block_size(32, 1024, "w").is_ok());
        assert!(check_block_size(48, 1024, "w")
            .unwrap_err()
            .contains("power of two"));
        assert!(check_block_size(8, 1024, "w").is_err());
        assert!(check_block_size(128, 96, "w")
            .unwrap_err()
            .contains("does not divide"));
    }
}
