//! Task items, prompt templates, and the task reward.
pub mod command;
pub mod configured;
pub mod process;
pub mod reward;
pub mod split;
pub mod transition;

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};

/// One task item: a JSON object from a JSONL file (`{"prompt": ..., ...}`).
pub type TaskItem = Map<String, Value>;

/// Read a JSONL file of task items; errors name the file and line.
pub fn load_items(path: &Path) -> Result<Vec<TaskItem>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read task file {}", path.display()))?;
    let mut items = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value =
            serde_json::from_str(line).with_context(|| format!("{} line {}: invalid JSON", path.display(), i + 1))?;
        match v {
            Value::Object(m) => items.push(m),
            _ => bail!("{} line {}: a task item must be a JSON object", path.display(), i + 1),
        }
    }
    if items.is_empty() {
        bail!("{}: no task items", path.display());
    }
    Ok(items)
}

/// Replace each `{field}` in the template with the item's field (`{{` and `}}` are literal braces).
pub fn render_template(template: &str, item: &TaskItem) -> Result<String> {
    let mut out = String::with_capacity(template.len() + 64);
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            out.push_str(&tail[..1]);
            rest = &tail[2..];
            continue;
        }
        if tail.starts_with('}') {
            bail!("template `{template}`: unmatched `}}` (write `}}}}` for a literal brace)");
        }
        let end = tail.find('}').with_context(|| format!("template `{template}`: unclosed `{{`"))?;
        let field = &tail[1..end];
        let value = item.get(field).with_context(|| {
            let keys: Vec<&str> = item.keys().map(String::as_str).collect();
            format!("template `{template}` uses `{{{field}}}` but the task item has only {keys:?}")
        })?;
        match value {
            Value::String(s) => out.push_str(s),
            other => out.push_str(&other.to_string()),
        }
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Refuse, before any work, an item whose prompt for some role renders to nothing but
/// whitespace (`templates[a]`: role a's template; `items`: each with its index in its file): a
/// model given an empty prompt still answers, and the round would compare answers to nothing.
pub fn check_prompts<'a>(
    templates: &[String],
    items: impl IntoIterator<Item = (usize, &'a TaskItem)>,
    split: &str,
) -> Result<()> {
    for (index, item) in items {
        for (a, template) in templates.iter().enumerate() {
            let text = render_template(template, item).with_context(|| format!("{split} item {index}"))?;
            if text.trim().is_empty() {
                bail!(
                    "{split} item {index}: agent {a}'s prompt is empty (template `{template}`); give every item a \
                     non-empty prompt"
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(v: Value) -> TaskItem {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn template_fills_fields_and_escapes_braces() {
        let it = item(serde_json::json!({"prompt": "a cat", "n": 3}));
        assert_eq!(
            render_template("Write {n} lines on {prompt}. {{ok}}", &it).unwrap(),
            "Write 3 lines on a cat. {ok}"
        );
    }

    #[test]
    fn template_missing_field_names_it() {
        let it = item(serde_json::json!({"prompt": "x"}));
        let e = render_template("{topic}", &it).unwrap_err().to_string();
        assert!(e.contains("{topic}") && e.contains("prompt"), "{e}");
    }

    #[test]
    fn jsonl_errors_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.jsonl");
        std::fs::write(&p, "{\"prompt\": \"a\"}\n\n[1]\n").unwrap();
        let e = load_items(&p).unwrap_err().to_string();
        assert!(e.contains("line 3"), "{e}");
    }
}
