//! `--checkpoint OWNER/NAME[@REV]` not yet in the Hugging Face cache: downloaded into it
//! (the layout `huggingface_hub` writes, so `hf`, transformers and later runs find it), with a
//! progress bar per file on a terminal. `HF_ENDPOINT` picks the server, `HF_TOKEN` (else the
//! cache's `token` file) authorises gated or private repositories, and `HF_HUB_OFFLINE=1`
//! downloads nothing: the export then stops naming the `hf download` command.
//!
//! Only the files an export reads are fetched (configurations, tokenizer, chat template,
//! safetensors), `config.json` last: the cache counts a snapshot with `config.json` as
//! complete, so an interrupted download is resumed by the next run rather than half-used.

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};
use ocrctl_exporters::hub::{cache_root, resolve_in, HubId};
use std::path::Path;

/// Downloads `checkpoint` into the hub cache when it is a hub id that is not there yet (and
/// the environment allows it); anything else is left to the export, which reports it.
pub fn ensure_cached(checkpoint: &str) -> anyhow::Result<()> {
    if checkpoint.starts_with("dummy:") || Path::new(checkpoint).is_dir() {
        return Ok(());
    }
    let (Some(id), Some(root)) = (HubId::parse(checkpoint), cache_root()) else {
        return Ok(());
    };
    if resolve_in(&id, &root).is_ok() || offline() {
        return Ok(());
    }
    download(&id, &root).map_err(|e| {
        anyhow::anyhow!(
            "{}: not in the Hugging Face cache ({}) and the download failed: {e}; download it \
             with `{}` (huggingface_hub's CLI) and run again",
            id.repo(),
            root.display(),
            id.download_command()
        )
    })
}

/// `HF_HUB_OFFLINE` as huggingface_hub reads it (1, true, yes, on).
fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// The repository files an export reads: top-level configurations, tokenizer files, the chat
/// template and the weights.
pub fn wanted(file: &str) -> bool {
    let ext = file.rsplit_once('.').map_or("", |(_, e)| e);
    !file.contains('/') && matches!(ext, "json" | "jinja" | "safetensors" | "txt" | "model")
}

fn download(id: &HubId, root: &Path) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let cache = Cache::new(root.to_path_buf());
    let token = std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .or_else(|| cache.token());
    let mut api = ApiBuilder::from_cache(cache)
        .with_token(token)
        .with_progress(std::io::stderr().is_terminal())
        .with_retries(3);
    if let Ok(endpoint) = std::env::var("HF_ENDPOINT") {
        api = api.with_endpoint(endpoint.trim_end_matches('/').to_string());
    }
    let repo = match &id.revision {
        Some(rev) => Repo::with_revision(id.repo(), RepoType::Model, rev.clone()),
        None => Repo::model(id.repo()),
    };
    let repo = api.build()?.repo(repo);
    let info = repo.info()?;
    let mut files: Vec<&str> = info
        .siblings
        .iter()
        .map(|s| s.rfilename.as_str())
        .filter(|f| wanted(f))
        .collect();
    if !files.contains(&"config.json") {
        anyhow::bail!("the repository has no config.json: not a model checkpoint");
    }
    // config.json last (see the module documentation).
    files.sort_by_key(|f| *f == "config.json");
    eprintln!(
        "ocrctl: downloading {} ({} files, revision {}) into {}",
        id.repo(),
        files.len(),
        &info.sha[..info.sha.len().min(12)],
        root.display()
    );
    for f in files {
        repo.download(f).map_err(|e| anyhow::anyhow!("{f}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_files_an_export_reads_are_fetched() {
        for f in [
            "config.json",
            "model.safetensors",
            "model-00001-of-00002.safetensors",
            "chat_template.jinja",
            "merges.txt",
            "tokenizer.model",
        ] {
            assert!(wanted(f), "{f}");
        }
        for f in [
            "README.md",
            ".gitattributes",
            "banner.png",
            "notebook.ipynb",
            "onnx/model.onnx",
            "onnx/config.json",
            "pytorch_model.bin",
        ] {
            assert!(!wanted(f), "{f}");
        }
    }
}
