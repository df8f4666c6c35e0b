//! `bench`'s report on stdout: the model line, the sweep's settings, the KV cache, the
//! phase table and the sweep table, all read from the JSON report `--json-out` writes.

use serde_json::Value;

/// `1234` for a number, `-` for null.
fn mib(v: &serde_json::Value) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.0}"))
}

/// A JSON number, NaN when absent.
fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// The human-readable report of `ocrctl bench`'s JSON.
pub(super) fn print_table(out: &Value) {
    print_model_line(out);
    print_sweep_settings(out);
    print_kv_line(&out["kv"]);
    print_phase_table(out);
    print_sweep_table(out);
}

/// The model, its load time and memory peaks.
fn print_model_line(out: &Value) {
    println!(
        "model {} ({}, {}, {}{}, {} pixels), load {:.1}s, peak RSS {:.0} MiB",
        out["model"].as_str().unwrap_or(""),
        out["precision"].as_str().unwrap_or(""),
        out["provider"].as_str().unwrap_or(""),
        out["decoder"].as_str().unwrap_or(""),
        match (&out["vision_stage"], &out["prefill_stage"]) {
            (Value::Bool(true), Value::Bool(true)) => ", vision and prefill stage",
            (Value::Bool(true), _) => ", vision stage",
            _ => "",
        },
        out["vision_pixels"].as_str().unwrap_or("lent"),
        num(&out["load_s"]),
        num(&out["peak_rss_mib"]),
    );
    let g = &out["gpu_memory"];
    if !g.is_null() {
        println!(
            "GPU memory: this process peak {} MiB, device used peak {} of {} MiB",
            mib(&g["process_peak_mib"]),
            mib(&g["used_peak_mib"]),
            mib(&g["total_mib"]),
        );
    }
}

/// The sweep's sampling, when it is not plain greedy decoding.
fn print_sweep_settings(out: &Value) {
    let penalty = out["repetition_penalty"].as_f64().unwrap_or(1.0);
    let top_logprobs = out["top_logprobs"].as_u64().unwrap_or(0);
    let (pres, freq) = (
        out["presence_penalty"].as_f64().unwrap_or(0.0),
        out["frequency_penalty"].as_f64().unwrap_or(0.0),
    );
    let biases = out["logit_bias"].as_array().map_or(0, Vec::len);
    let penalised = penalty != 1.0 || pres != 0.0 || freq != 0.0 || biases > 0;
    if out["temperature"].as_f64().unwrap_or(0.0) > 0.0 || penalised || top_logprobs > 0 {
        println!(
            "sweep at temperature {} top-p {} top-k {} penalties repetition {penalty} presence \
             {pres} frequency {freq}, {biases} logit biases, top log-probabilities \
             {top_logprobs}: {} rows needed full logits after the device's candidates",
            out["temperature"], out["top_p"], out["top_k"], out["kv"]["step_logits_fallbacks"]
        );
    }
}

/// Where the KV cache lived and how decoder runs moved it.
fn print_kv_line(kv: &Value) {
    println!(
        "KV cache: {} path, in {} memory ({} bound / {} host decoder runs, {} repacks){}",
        kv["path"].as_str().unwrap_or(""),
        kv["location"].as_str().unwrap_or("-"),
        kv["bound_runs"],
        kv["host_runs"],
        kv["repacks"],
        kv["fallback"]
            .as_str()
            .map_or(String::new(), |e| format!("; fell back to host: {e}")),
    );
}

/// One line per page size: its phases.
fn print_phase_table(out: &Value) {
    println!(
        "{:>10} {:>7} {:>11} {:>11} {:>10} {:>10} {:>11} {:>12} {:>8}",
        "size",
        "tokens",
        "vision ms",
        "prefill ms",
        "of it host",
        "TTFT ms",
        "first TTFT",
        "logits tok/s",
        "GPU MiB"
    );
    for r in out["results"].as_array().into_iter().flatten() {
        println!(
            "{:>10} {:>7} {:>11.1} {:>11.1} {:>10.1} {:>10.1} {:>11.1} {:>12.2} {:>8}",
            r["size"].as_str().unwrap_or(""),
            r["image_tokens"].to_string(),
            num(&r["vision_ms"]),
            num(&r["prefill_ms"]),
            num(&r["prefill_embed_ms"]),
            num(&r["ttft_ms"]),
            num(&r["first_vision_ms"]) + num(&r["first_prefill_ms"]),
            num(&r["decode_tokens_per_s"]),
            mib(&r["gpu_process_mib"]),
        );
    }
}

/// One line per batch size of the throughput sweep.
fn print_sweep_table(out: &Value) {
    println!(
        "{:>6} {:>6} {:>10} {:>9} {:>9} {:>10} {:>16} {:>8}",
        "batch", "pages", "size", "seconds", "pages/s", "tokens/s", "decode tokens/s", "GPU MiB"
    );
    for r in out["batch_sweep"].as_array().into_iter().flatten() {
        println!(
            "{:>6} {:>6} {:>10} {:>9.2} {:>9.3} {:>10.2} {:>16.2} {:>8}",
            r["batch"].to_string(),
            r["pages"].to_string(),
            r["size"].as_str().unwrap_or(""),
            num(&r["seconds"]),
            num(&r["pages_per_s"]),
            num(&r["tokens_per_s"]),
            num(&r["decode_tokens_per_s"]),
            mib(&r["gpu_process_mib"]),
        );
    }
}
