//! Where a model comes from, and what its source directory held besides weights and tokenizer.
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use serde_json::Value;

/// Where a model comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSource {
    Gguf(PathBuf),
    HfDir(PathBuf),
    Hub(String),
}

impl ModelSource {
    /// Classify a config string: an existing `.gguf` file, an existing directory, or a hub id.
    pub fn parse(s: &str) -> Result<Self> {
        let p = Path::new(s);
        if p.is_file() {
            if s.ends_with(".gguf") {
                return Ok(Self::Gguf(p.to_path_buf()));
            }
            bail!("model source `{s}` is a file but not a .gguf file");
        }
        if p.is_dir() {
            if !p.join("config.json").is_file() {
                bail!("model directory `{s}` has no config.json (expected a Hugging Face model directory)");
            }
            return Ok(Self::HfDir(p.to_path_buf()));
        }
        let looks_like_hub = s.split('/').count() == 2
            && !s.starts_with('.')
            && !s.ends_with(".gguf")
            && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
        if looks_like_hub {
            return Ok(Self::Hub(s.to_string()));
        }
        if s.ends_with(".gguf") {
            bail!("model file `{s}` does not exist (for the bundled model run scripts/fetch-model.sh)");
        }
        bail!("model source `{s}` is not a .gguf file, a directory with config.json, or an `org/name` hub id")
    }
}

/// What a Hugging Face source directory had besides weights and tokenizer, kept so an exported
/// agent carries it unchanged (unknown fields included) rather than rebuilt from the few fields
/// pbrl reads. Empty for GGUF and test models: their files are written from what was parsed.
#[derive(Debug, Clone, Default)]
pub struct SourceFiles {
    pub config_json: Option<Value>,
    pub tokenizer_config_json: Option<Value>,
    pub special_tokens_map_json: Option<Value>,
    /// The template of `chat_template.jinja`, when it came from that file (transformers 5).
    pub chat_template_jinja: Option<String>,
    pub generation_config_json: Option<Value>,
}
