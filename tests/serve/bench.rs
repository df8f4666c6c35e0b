//! scripts/serve_bench/serve_bench.py (the steady-state serving benchmark) against the fixture server:
//! its page accounting agrees with the server's, and a page that did not get its forced
//! tokens is a failure. No timing is asserted.

use super::*;

/// `python3` (3.10+, which the script needs), or a skip line.
fn python3(test: &str) -> bool {
    common::require_tool(
        test,
        "python3 3.10+",
        common::runs(
            "python3",
            &["-c", "import sys; sys.exit(sys.version_info < (3, 10))"],
        ),
        "apt-get install python3",
    )
}

fn serve_bench(args: &[&str]) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/serve_bench/serve_bench.py");
    Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 runs")
}

fn generated_tokens(s: &Server) -> u64 {
    let m = s.get("/metrics").unwrap().text();
    let line = m
        .lines()
        .find(|l| l.starts_with("ocrctl_generated_tokens_total "))
        .expect("ocrctl_generated_tokens_total");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn runs(out: &Path) -> Vec<Value> {
    let mut files: Vec<_> = std::fs::read_dir(out.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap())
        .collect()
}

#[test]
fn serve_bench_counts_every_forced_token_the_server_generated() {
    if !python3("serve_bench_counts_every_forced_token_the_server_generated") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), 2, 64, &[]);
    let before = generated_tokens(&s);
    let out = dir.path().join("bench");
    let o = serve_bench(&[
        "run",
        "--url",
        &format!("http://{}", s.addr),
        "--engine",
        "ocrctl",
        "--kv-cache",
        "fp32",
        "--concurrency",
        "3",
        "--rate",
        "20",
        "--runs",
        "2",
        "--pages",
        "5",
        "--scale",
        "0.1",
        "--max-new",
        "40",
        "--sample-every",
        "0.1",
        "--strict",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let runs = runs(&out);
    assert_eq!(runs.len(), 4, "2 load points x 2 runs");
    let mut forced = 0;
    for r in &runs {
        let pages = r["pages"].as_array().unwrap();
        assert_eq!(pages.len(), 5, "{}", r["file"]);
        for p in pages {
            let n = p["max_tokens"].as_u64().unwrap();
            assert!((32..=40).contains(&n), "drawn then capped: {p}");
            assert_eq!(p["completion_tokens"].as_u64(), Some(n), "{p}");
            assert_eq!(p["finish_reason"], "length", "{p}");
            assert_eq!(p["ok"], true, "{p}");
            assert!(p["ttft_s"].as_f64().unwrap() <= p["latency_s"].as_f64().unwrap());
            forced += n;
        }
        assert_eq!(r["stats"]["pages_completed"], 5);
        assert_eq!(r["stats"]["failures"], 0);
        assert_eq!(r["stop"]["by"], "pages");
        assert!(!r["samples"].as_array().unwrap().is_empty());
        let svg = out
            .join("occupancy")
            .join(r["file"].as_str().unwrap().replace(".json", ".svg"));
        assert!(std::fs::read_to_string(svg).unwrap().contains("<polyline"));
    }
    // The warm-up sends one 8-token page of each of the workload's 6 sizes first.
    assert_eq!(generated_tokens(&s) - before, forced + 6 * 8);
    let summary: Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    let rows = summary["rows"].as_array().unwrap();
    let keys: Vec<_> = rows.iter().map(|r| (&r["mode"], &r["load"])).collect();
    assert_eq!(
        keys,
        [
            (&json!("concurrency"), &json!(3)),
            (&json!("rate"), &json!(20))
        ]
    );
    for r in rows {
        assert_eq!(r["engine"], "ocrctl");
        assert_eq!(r["failures"], 0);
        assert_eq!(r["pages_per_s"].as_array().unwrap().len(), 2);
        assert_eq!(r["p95_page_latency_s"].as_array().unwrap().len(), 2);
        assert_eq!(r["p50_ttft_s"].as_array().unwrap().len(), 2);
    }
}

#[test]
fn serve_bench_counts_refused_pages_as_failures() {
    if !python3("serve_bench_counts_refused_pages_as_failures") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The test profile allows 256 new tokens: pages forced to 400 are refused (400). A JSON
    // workload of one page size, every page 400 tokens.
    let s = server(dir.path(), 2, 64, &[]);
    let out = dir.path().join("bench");
    let workload = dir.path().join("long.json");
    let wl = json!({"seed": 1, "pages": 3, "sizes": [{"size": "300x400", "share": 1}],
        "new_tokens": {"distribution": "lognormal", "median": 400, "sigma": 0, "min": 32, "max": 4096}});
    std::fs::write(&workload, wl.to_string()).unwrap();
    let o = serve_bench(&[
        "run",
        "--url",
        &format!("http://{}", s.addr),
        "--engine",
        "ocrctl",
        "--concurrency",
        "2",
        "--runs",
        "1",
        "--workload",
        workload.to_str().unwrap(),
        "--no-warmup",
        "--strict",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = &runs(&out)[0];
    assert_eq!(r["stats"]["failures"], 3);
    assert_eq!(r["stats"]["pages_completed"], 0);
    for p in r["pages"].as_array().unwrap() {
        assert_eq!(p["ok"], false);
        assert!(
            p["failure"].as_str().unwrap().starts_with("HTTP 400"),
            "{p}"
        );
    }
}

#[test]
fn serve_bench_draws_the_workload_mix() {
    if !python3("serve_bench_draws_the_workload_mix") {
        return;
    }
    let draw = || {
        let o = serve_bench(&["draw", "--pages", "2000", "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice::<Value>(&o.stdout).unwrap()
    };
    let v = draw();
    assert_eq!(v, draw(), "seeded: the same pages every time");
    let pages = v["pages"].as_array().unwrap();
    assert_eq!(pages.len(), 2000);
    let mut n: Vec<u64> = pages
        .iter()
        .map(|p| p["max_tokens"].as_u64().unwrap())
        .collect();
    assert!(n.iter().all(|t| (32..=4096).contains(t)));
    n.sort();
    let median = n[1000] as f64;
    assert!(
        (800.0..1000.0).contains(&median),
        "median {median}, drawn around 900"
    );
    let a4 = pages.iter().filter(|p| p["size"] == "1654x2339").count() as f64;
    assert!(
        (0.45..0.55).contains(&(a4 / 2000.0)),
        "A4 share {a4}/2000, 0.5 in the file"
    );
}
