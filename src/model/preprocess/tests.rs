//! Unit tests of preprocessing (`src/model/preprocess.rs`).

use super::*;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/resize");

/// Same integer formula as `synth` in tests/fixtures/resize/gen.py.
fn synth(kind: u32, w: u32, h: u32) -> RgbImage {
    let mut img = RgbImage::new(w, h);
    for (x, y, px) in img.enumerate_pixels_mut() {
        for c in 0..3u64 {
            let (x, y) = (u64::from(x), u64::from(y));
            let v = if kind == 0 {
                let m = 0xFFFF_FFFFu64;
                let mut v = (x * 374_761_393 + y * 668_265_263 + c * 2_246_822_519 + 1_234_567) & m;
                v = ((v ^ (v >> 13)) * 1_274_126_177) & m;
                v ^= v >> 16;
                v & 255
            } else {
                let gx = x * 255 / u64::from(w.saturating_sub(1).max(1));
                let gy = y * 255 / u64::from(h.saturating_sub(1).max(1));
                let g = (gx * (c + 1) + gy * (3 - c)) / 4;
                let stripe = (x / 3 + y / 5) % 4 == 0;
                (if stripe && c != 2 { (g * 7) % 61 } else { g }) & 255
            };
            px.0[c as usize] = v as u8;
        }
    }
    img
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

fn fixture(name: &str) -> RgbImage {
    let path = Path::new(FIXTURES).join(name);
    image::open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .to_rgb8()
}

fn assert_same(name: &str, got: &RgbImage, want: &RgbImage) {
    assert_eq!(got.dimensions(), want.dimensions(), "{name}: size");
    let diffs = got
        .as_raw()
        .iter()
        .zip(want.as_raw())
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(diffs, 0, "{name}: {diffs} bytes differ from Pillow");
}

#[test]
fn defaults_are_lightonocr() {
    let cfg = PreprocessConfig::default();
    assert_eq!(cfg.longest_edge, 1540);
    assert_eq!(cfg.alignment(), 28);
    // Bit patterns of np.float32(value) for the CLIP constants.
    assert_eq!(
        cfg.image_mean.map(f32::to_bits),
        [0x3ef6813a, 0x3eea685e, 0x3ed100ff]
    );
    assert_eq!(
        cfg.image_std.map(f32::to_bits),
        [0x3e8989d0, 0x3e85c974, 0x3e8d32a8]
    );
    assert_eq!(cfg.rescale_factor, 1.0 / 255.0);
}

#[test]
fn target_sizes() {
    let cfg = PreprocessConfig::default();
    // (h, w) -> (H, W)
    let cases = [
        ((1540, 1540), (1540, 1540)),
        ((2000, 600), (1540, 476)), // 600/1.2987 = 461.99 -> 462 -> 476
        ((600, 2000), (476, 1540)),
        ((250, 71), (252, 84)), // no downscale, only alignment
        ((1, 1), (28, 28)),
        ((3000, 10), (1540, 28)), // 10/1.948 = 5.13 -> 5 -> 28
        ((10, 3000), (28, 1540)),
        ((2200, 1700), (1540, 1204)), // US Letter at 200 DPI
        ((1540, 1092), (1540, 1092)), // A4 at 1540 px: already aligned
        ((1541, 1), (1540, 28)),      // 1/1.00065 floors to 0 -> clamped to 1 -> 28
        ((1000, 800), (1008, 812)),
        ((28, 28), (28, 28)),
        ((29, 27), (56, 28)),
    ];
    for ((h, w), want) in cases {
        assert_eq!(target_size(h, w, &cfg), want, "{h}x{w}");
    }
    let tokens = |h, w| {
        let (h, w) = target_size(h, w, &cfg);
        (h / 28) * (w / 28)
    };
    assert_eq!(tokens(1540, 1540), 3025);
    assert_eq!(tokens(1540, 1092), 2145);
    assert_eq!(tokens(2200, 1700), 55 * 43);
}

#[test]
fn target_size_survives_degenerate_config() {
    let cfg = PreprocessConfig {
        longest_edge: 0,
        patch_size: 0,
        ..PreprocessConfig::default()
    };
    assert_eq!(cfg.alignment(), 1);
    assert_eq!(target_size(5, 3, &cfg), (1, 1));
}

#[test]
fn target_size_floors_like_python() {
    // ratio = 1547/1540; 1547/ratio = 1539.9999999999998 in f64, which Python floors to
    // 1539 (the alignment then rounds it back up to 1540).
    let ratio = 1547f64 / 1540f64;
    assert_eq!((1547f64 / ratio).floor(), 1539.0);
    let cfg = PreprocessConfig {
        patch_size: 1,
        merge_size: 1,
        ..PreprocessConfig::default()
    };
    assert_eq!(target_size(1547, 600, &cfg), (1539, 597));
    assert_eq!(
        target_size(1547, 600, &PreprocessConfig::default()),
        (1540, 616)
    );
}

#[test]
fn resize_matches_pillow_small() {
    // (fixture, kind, in_w, in_h, out_w, out_h): see tests/fixtures/resize/gen.py.
    let cases = [
        ("down2_3", 0, 161, 115, 70, 50),
        ("up_noise", 0, 50, 37, 56, 56),
        ("identity", 1, 57, 43, 57, 43),
        ("vert_only", 1, 90, 60, 90, 28),
        ("horiz_only", 0, 45, 60, 56, 60),
        ("down7", 1, 300, 200, 43, 29),
        ("one_px", 0, 1, 1, 28, 28),
        ("thin", 1, 3, 100, 28, 14),
        ("mixed", 1, 200, 20, 84, 28),
        // Pillow 13 pass order: the height shrinks by 56 px, the width by 28 (56 = 2 * 28:
        // horizontal pass first) or by 27 (56 > 2 * 27: vertical pass first).
        ("hfirst_edge", 0, 60, 60, 32, 4),
        ("vfirst_edge", 0, 60, 60, 33, 4),
    ];
    for (name, kind, iw, ih, ow, oh) in cases {
        let src = synth(kind, iw, ih);
        let got = resize_bicubic(&src, ow, oh);
        assert_same(name, &got, &fixture(&format!("{name}.png")));
    }
}

#[test]
fn resize_matches_pillow_page_sizes() {
    // Pillow 13.0 output checksums (FNV-1a 64 over the RGB bytes) from gen.py.
    let cases = [
        (
            "wide_2000x600",
            1,
            2000,
            600,
            1540,
            476,
            0x4cae_bb20_c75a_c94c_u64,
        ),
        (
            "letter_1700x2200",
            1,
            1700,
            2200,
            1204,
            1540,
            0x06c4_5fa1_033c_47a6,
        ),
        (
            "upish_1000x800",
            0,
            1000,
            800,
            1008,
            812,
            0x98da_bcb9_2904_0611,
        ),
    ];
    let cfg = PreprocessConfig::default();
    for (name, kind, iw, ih, ow, oh, want) in cases {
        assert_eq!(target_size(ih, iw, &cfg), (oh, ow), "{name}: target size");
        let got = resize_bicubic(&synth(kind, iw, ih), ow, oh);
        assert_eq!(
            fnv1a64(got.as_raw()),
            want,
            "{name}: bytes differ from Pillow"
        );
    }
}

#[test]
fn resize_edge_cases_do_not_panic() {
    let src = synth(0, 5, 4);
    assert_eq!(resize_bicubic(&src, 0, 3).dimensions(), (0, 3));
    let empty = RgbImage::new(0, 0);
    let out = resize_bicubic(&empty, 2, 2);
    assert_eq!(out.as_raw(), &vec![0u8; 12]);
}

#[test]
fn alpha_is_pasted_onto_white_like_pillow() {
    // Every (colour, alpha) pair: R = x, G = 255 - x, B = 7x mod 256, A = y.
    let mut rgba = image::RgbaImage::new(256, 256);
    for (x, y, px) in rgba.enumerate_pixels_mut() {
        let x = x as u8;
        px.0 = [x, 255 - x, x.wrapping_mul(7), y as u8];
    }
    let want = fixture("alpha_over_white.png");
    let got = to_rgb_over_white(DynamicImage::ImageRgba8(rgba.clone()));
    assert_same("alpha_over_white", &got, &want);
    // Spot values: opaque keeps the colour, transparent is white, half blends.
    assert_eq!(over_white(0, 255), 0);
    assert_eq!(over_white(0, 0), 255);
    assert_eq!(over_white(0, 128), 127);
    assert_eq!(over_white(100, 200), 133);

    // The same through the file loader (PNG written by the `image` crate).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rgba.png");
    rgba.save(&path).unwrap();
    let loaded = load_image(&path, DEFAULT_MAX_PIXELS).unwrap();
    assert_same("load_image(rgba)", &loaded, &want);
}

#[test]
fn grey_is_replicated() {
    let grey = image::GrayImage::from_raw(2, 1, vec![7, 200]).unwrap();
    let rgb = to_rgb_over_white(DynamicImage::ImageLuma8(grey));
    assert_eq!(rgb.as_raw(), &vec![7, 7, 7, 200, 200, 200]);
    let grey16 =
        image::ImageBuffer::<image::Luma<u16>, _>::from_raw(1, 1, vec![0xABCDu16]).unwrap();
    let rgb = to_rgb_over_white(DynamicImage::ImageLuma16(grey16));
    assert_eq!(rgb.as_raw(), &vec![0xAB; 3]);
}

fn png_bytes(img: &RgbImage) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

#[test]
fn decode_checks_size_before_decoding() {
    let bytes = png_bytes(&synth(0, 40, 30));
    let img = decode_image_bytes(&bytes, "upload", 1200).unwrap();
    assert_eq!(img, synth(0, 40, 30));
    let err = decode_image_bytes(&bytes, "upload", 1199).unwrap_err();
    assert!(matches!(
        err,
        PreprocessError::TooLarge {
            pixels: 1200,
            max_pixels: 1199,
            ..
        }
    ));
    assert!(err.to_string().contains("upload"), "{err}");

    // A header claiming 100000 x 100000 is refused without touching the (absent) data.
    let mut bomb = png_bytes(&synth(0, 1, 1));
    bomb[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    bomb[20..24].copy_from_slice(&100_000u32.to_be_bytes());
    // Fix the IHDR CRC so that the decoder accepts the header.
    let crc = crc32(&bomb[12..29]);
    bomb[29..33].copy_from_slice(&crc.to_be_bytes());
    let err = decode_image_bytes(&bomb, "bomb.png", DEFAULT_MAX_PIXELS).unwrap_err();
    assert!(
        matches!(
            err,
            PreprocessError::TooLarge {
                width: 100_000,
                height: 100_000,
                ..
            }
        ),
        "{err}"
    );
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn decode_errors_name_the_image() {
    let err =
        decode_image_bytes(b"definitely not an image", "req-42", DEFAULT_MAX_PIXELS).unwrap_err();
    assert!(matches!(err, PreprocessError::UnknownFormat { .. }));
    assert!(err.to_string().starts_with("req-42:"), "{err}");

    let bytes = png_bytes(&synth(0, 64, 64));
    let truncated = &bytes[..bytes.len() / 2];
    let err = decode_image_bytes(truncated, "cut.png", DEFAULT_MAX_PIXELS).unwrap_err();
    assert!(matches!(err, PreprocessError::Decode { .. }), "{err}");
    assert!(err.to_string().starts_with("cut.png:"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.png");
    let err = load_image(&missing, DEFAULT_MAX_PIXELS).unwrap_err();
    assert!(matches!(err, PreprocessError::Io { .. }));
    assert!(err.to_string().contains("nope.png"), "{err}");

    let cut = dir.path().join("cut.png");
    std::fs::write(&cut, truncated).unwrap();
    let err = load_image(&cut, DEFAULT_MAX_PIXELS).unwrap_err();
    assert!(err.to_string().contains("cut.png"), "{err}");
}

#[test]
fn normalisation_matches_numpy() {
    // Values computed with transformers' PIL-backend arithmetic:
    // np.float32(x * (1/255)) then (x - np.float32(mean)) / np.float32(std) in float32.
    let lut = normalisation_table(&PreprocessConfig::default());
    let want: [(usize, usize, u32); 9] = [
        (0, 0, 0xbfe5_68dc),   // -1.7922626
        (0, 255, 0x3ff7_1541), // 1.9303361
        (1, 0, 0xbfe0_44b8),   // -1.7520971
        (1, 128, 0x3e2c_f36b), // 0.16889732
        (2, 0, 0xbfbd_77d8),   // -1.4802198
        (2, 255, 0x4009_5660), // 2.145897
        (0, 1, 0xbfe3_8a7f),   // -1.7776641
        (1, 77, 0xbf18_b427),  // -0.5964989
        (2, 200, 0x3fae_90c9), // 1.3637935
    ];
    for (c, v, bits) in want {
        assert_eq!(
            lut[c][v].to_bits(),
            bits,
            "channel {c}, value {v}: {}",
            lut[c][v]
        );
    }
    let all: Vec<u8> = lut
        .iter()
        .flatten()
        .flat_map(|f| f.to_bits().to_le_bytes())
        .collect();
    assert_eq!(
        fnv1a64(&all),
        0x4535_6f74_8d92_31c1,
        "checksum of all 768 values"
    );
}

#[test]
fn preprocess_layout_and_tokens() {
    let src = synth(1, 71, 250); // w = 71, h = 250 -> 252 x 84
    let out = preprocess(&src, &PreprocessConfig::default());
    assert_eq!((out.height, out.width), (252, 84));
    assert_eq!(out.pixel_values.shape(), [1, 3, 252, 84]);
    assert_eq!(
        out.pixel_values.held_bytes(),
        252 * 84 * 3,
        "8-bit pixels are held"
    );
    let values = out.pixel_values.to_array();
    assert_eq!(out.num_image_tokens, 9 * 3);
    let resized = resize_bicubic(&src, 84, 252);
    let lut = normalisation_table(&PreprocessConfig::default());
    for (x, y) in [(0u32, 0u32), (83, 251), (40, 100)] {
        let px = resized.get_pixel(x, y).0;
        for c in 0..3 {
            assert_eq!(
                values[[0, c, y as usize, x as usize]],
                lut[c][usize::from(px[c])]
            );
        }
    }
    // Already aligned: no resampling, values straight from the source.
    let src = synth(0, 56, 28);
    let out = preprocess(&src, &PreprocessConfig::default());
    assert_eq!(out.num_image_tokens, 2);
    let v = src.get_pixel(55, 27).0[2];
    assert_eq!(
        out.pixel_values.to_array()[[0, 2, 27, 55]],
        lut[2][usize::from(v)]
    );
}

#[test]
fn config_from_model_dir() {
    let dir = tempfile::tempdir().unwrap();
    // Missing file: defaults with the model's patch and merge sizes.
    let cfg = PreprocessConfig::from_model_dir(dir.path(), 16, 2).unwrap();
    assert_eq!(cfg.alignment(), 32);
    assert_eq!(cfg.longest_edge, 1540);

    let path = dir.path().join(PROCESSOR_CONFIG_FILE);
    std::fs::write(
            &path,
            r#"{"image_processor_type": "PixtralImageProcessorFast", "patch_size": 14,
                "size": {"longest_edge": 1024}, "resample": 3, "do_rescale": true,
                "image_mean": [0.5, 0.5, 0.5], "image_std": 0.25, "rescale_factor": 0.00392156862745098}"#,
        )
        .unwrap();
    let cfg = PreprocessConfig::from_model_dir(dir.path(), 14, 2).unwrap();
    assert_eq!(cfg.longest_edge, 1024);
    assert_eq!(cfg.alignment(), 28);
    assert_eq!(cfg.image_mean, [0.5; 3]);
    assert_eq!(cfg.image_std, [0.25; 3]);
    assert_eq!(cfg.rescale_factor, 1.0 / 255.0);

    // transformers >= 5 nests the settings under `image_processor`.
    std::fs::write(
        &path,
        r#"{"image_processor": {"size": {"longest_edge": 700}}}"#,
    )
    .unwrap();
    let cfg = PreprocessConfig::from_model_dir(dir.path(), 14, 2).unwrap();
    assert_eq!(cfg.longest_edge, 700);
    assert_eq!(cfg.image_std, PreprocessConfig::default().image_std);

    let bad = [
        (r#"{"size": {"longest_edge": "big"}}"#, "size.longest_edge"),
        (
            r#"{"size": {"height": 10, "width": 10}}"#,
            "size.longest_edge",
        ),
        (
            r#"{"image_processor": {"image_mean": [0.5, 0.5]}}"#,
            "image_processor.image_mean",
        ),
        (r#"{"image_std": [0.5, 0.0, 0.5]}"#, "image_std"),
        (r#"{"rescale_factor": -1}"#, "rescale_factor"),
        (r#"{"resample": 2}"#, "resample"),
        (r#"{"do_normalize": false}"#, "do_normalize"),
    ];
    for (text, field) in bad {
        std::fs::write(&path, text).unwrap();
        let err = PreprocessConfig::from_model_dir(dir.path(), 14, 2).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(&err, PreprocessError::Field { field: f, .. } if f == field),
            "{text}: {msg}"
        );
        assert!(
            msg.contains(PROCESSOR_CONFIG_FILE) && msg.contains(field),
            "{msg}"
        );
    }
    std::fs::write(&path, "{not json").unwrap();
    let err = PreprocessConfig::from_model_dir(dir.path(), 14, 2).unwrap_err();
    assert!(matches!(err, PreprocessError::Json { .. }));
    assert!(err.to_string().contains(PROCESSOR_CONFIG_FILE));
}

/// The v1 layout (LightOnOCR-1B-1025): `processor_config.json` holds the processor keys alone,
/// the image settings are in `preprocessor_config.json`; a processor file with settings wins.
#[test]
fn v1_image_settings_come_from_preprocessor_config() {
    let dir = tempfile::tempdir().unwrap();
    let proc = dir.path().join(PROCESSOR_CONFIG_FILE);
    let pre = dir.path().join(PREPROCESSOR_CONFIG_FILE);
    std::fs::write(
        &proc,
        r#"{"image_break_token": "<|vision_pad|>", "image_end_token": "<|vision_end|>",
            "image_token": "<|image_pad|>", "patch_size": 14,
            "processor_class": "LightOnOCRProcessor", "spatial_merge_size": 2}"#,
    )
    .unwrap();
    std::fs::write(
        &pre,
        r#"{"image_processor_type": "PixtralImageProcessorFast", "size": {"longest_edge": 980},
            "image_mean": [0.5, 0.5, 0.5], "resample": 3}"#,
    )
    .unwrap();
    let cfg = PreprocessConfig::from_model_dir(dir.path(), 14, 2).unwrap();
    assert_eq!((cfg.longest_edge, cfg.image_mean), (980, [0.5; 3]));
    // Only the preprocessor file: read too.
    std::fs::remove_file(&proc).unwrap();
    let cfg = PreprocessConfig::from_model_dir(dir.path(), 14, 2).unwrap();
    assert_eq!(cfg.longest_edge, 980);
    // A malformed one is reported by its own name.
    std::fs::write(&pre, r#"{"size": {"longest_edge": 0}}"#).unwrap();
    let msg = PreprocessConfig::from_model_dir(dir.path(), 14, 2)
        .unwrap_err()
        .to_string();
    assert!(msg.contains(PREPROCESSOR_CONFIG_FILE), "{msg}");
    // Settings in the processor file take precedence (the v2 layout keeps both).
    std::fs::write(&pre, r#"{"size": {"longest_edge": 980}}"#).unwrap();
    std::fs::write(
        &proc,
        r#"{"image_processor": {"size": {"longest_edge": 700}}}"#,
    )
    .unwrap();
    let cfg = PreprocessConfig::from_model_dir(dir.path(), 14, 2).unwrap();
    assert_eq!(cfg.longest_edge, 700);
}
