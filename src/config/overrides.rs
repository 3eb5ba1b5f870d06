//! `KEY=VALUE` overrides from the command line, and the one-line messages that say where a
//! bad value came from (the file and line, or the override).
use super::{err, ConfigError};

/// A `KEY=VALUE` override from the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    pub key: String,
    pub value: toml::Value,
}

impl Override {
    /// `key=value`; the value is a TOML literal (`1e-5`, `"a"`, `[1, 2]`, `true`), and anything
    /// that does not parse as one is taken as a plain string (`comparator_policy=model`).
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let Some((key, raw)) = s.split_once('=') else {
            return err(format!("override `{s}` is not KEY=VALUE"));
        };
        let key = key.trim();
        if key.is_empty() || key.split('.').any(|p| p.is_empty()) {
            return err(format!("override `{s}` has an empty key"));
        }
        let raw = raw.trim();
        let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.to_string()));
        Ok(Self { key: key.to_string(), value })
    }

    pub(super) fn apply(&self, table: &mut toml::Table) -> Result<(), ConfigError> {
        let parts: Vec<&str> = self.key.split('.').collect();
        let mut t = table;
        for p in &parts[..parts.len() - 1] {
            let entry = t.entry(p.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            t = match entry {
                toml::Value::Table(inner) => inner,
                _ => return err(format!("override `{}`: `{p}` is not a table", self.key)),
            };
        }
        t.insert(parts[parts.len() - 1].to_string(), self.value.clone());
        Ok(())
    }
}

/// The smallest edit distance wins; `None` when nothing is reasonably close.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    fn lev(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut cur = vec![i + 1; b.len() + 1];
            for (j, &cb) in b.iter().enumerate() {
                cur[j + 1] = (prev[j] + (ca != cb) as usize).min(prev[j + 1] + 1).min(cur[j] + 1);
            }
            prev = cur;
        }
        prev[b.len()]
    }
    candidates
        .into_iter()
        .map(|c| (lev(word, c), c))
        .filter(|(d, c)| *d <= (c.len().max(word.len()) / 2).max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Where a key's value came from: the command-line override that set it, else the file (with the
/// line that sets it, when one does).
fn place_of(key: &str, text: &str, origin: &str, overrides: &[Override]) -> String {
    if let Some(o) = overrides.iter().rev().find(|o| o.key == key) {
        return format!("command-line override `{}={}`", o.key, o.value);
    }
    file_place(key.rsplit('.').next().unwrap_or(key), text, origin)
}

/// `FILE line N` for the line that sets `leaf` (`FILE` alone when none does).
fn file_place(leaf: &str, text: &str, origin: &str) -> String {
    let line = text
        .lines()
        .position(|l| {
            let t = l.trim_start();
            t.starts_with(leaf) && t[leaf.len()..].trim_start().starts_with('=')
        })
        .map(|i| format!(" line {}", i + 1))
        .unwrap_or_default();
    format!("{origin}{line}")
}

/// TOML accepts `nan` and `inf`; no pbrl setting means either, so every float anywhere in the
/// configuration (the `[reward]` parameters included) must be finite.
pub(super) fn reject_non_finite(
    prefix: &str,
    t: &toml::Table,
    text: &str,
    origin: &str,
    overrides: &[Override],
) -> Result<(), ConfigError> {
    for (k, v) in t {
        let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        let bad = match v {
            toml::Value::Float(f) => !f.is_finite(),
            toml::Value::Array(a) => a.iter().any(|x| x.as_float().is_some_and(|f| !f.is_finite())),
            toml::Value::Table(inner) => {
                reject_non_finite(&key, inner, text, origin, overrides)?;
                false
            }
            _ => false,
        };
        if bad {
            return err(format!("{}: `{key}` = {v} is not a finite number", place_of(&key, text, origin, overrides)));
        }
    }
    Ok(())
}

/// Turn serde's message into one line that names the key, its origin and, for an unknown key,
/// the closest known one.
pub(super) fn describe_de_error(
    e: &serde_path_to_error::Error<toml::de::Error>,
    text: &str,
    origin: &str,
    overrides: &[Override],
) -> ConfigError {
    let msg = e.inner().message().to_string();
    let first = msg.lines().next().unwrap_or(&msg).trim();
    if let Some(rest) = first.strip_prefix("unknown field `") {
        let (key, expected) = rest.split_once('`').unwrap_or((rest, ""));
        // The error's path ends with the unknown key itself.
        let path = e.path().to_string();
        let parent = path.rsplit_once('.').map(|(p, _)| p.to_string()).unwrap_or_default();
        let qualify = |k: &str| {
            if parent.is_empty() {
                k.to_string()
            } else {
                format!("{parent}.{k}")
            }
        };
        let full = qualify(key);
        let known: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        let hint = closest(key, known.iter().copied())
            .map(|c| format!("; did you mean `{}`?", qualify(c)))
            .unwrap_or_default();
        let from_override = overrides.iter().any(|o| o.key == full);
        let place = if from_override { "command-line override".to_string() } else { file_place(key, text, origin) };
        return ConfigError(format!("{place}: unknown key `{full}`{hint}"));
    }
    let path = e.path().to_string();
    if overrides.iter().any(|o| o.key == path) {
        return ConfigError(format!("{}: {first}", place_of(&path, text, origin, overrides)));
    }
    ConfigError(format!("{origin}: key `{path}`: {first}"))
}
