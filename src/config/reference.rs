//! The config reference, `docs/config.md`, generated from this module's sources (`mod.rs`,
//! `tables.rs`): every key of
//! [`Config`], [`TaskConfig`], [`RewardConfig`] and [`AgentLora`] with its doc comment and its default, grouped
//! by the `// --- section ---` comments of the struct. A test (`config::tests`) fails when the
//! file is stale; `PBRL_BLESS=1 cargo test --lib config_reference` rewrites it.
use super::defaults::iterative_defaults;
use super::{AgentLora, ComputeDType, Config, RewardConfig, TaskConfig, TransitionConfig};

/// The sources the reference is read from: the flat keys, then the tables.
const SOURCES: [&str; 2] = [include_str!("mod.rs"), include_str!("tables.rs")];

const INTRO: &str = "\
# Config reference

Generated from the doc comments of `src/config/mod.rs` and `tables.rs` by `PBRL_BLESS=1 cargo test --lib \
config_reference`; a test fails when this file is stale. Do not edit it by hand.

A config is a TOML file. Flat keys carry the names, defaults and validation rules of CoMLRL
1.4.3's `MADPOConfig` / `MARLHFConfig` (so its settings copy over); pbrl's own keys, the
`[task]` table and the `[reward]` table sit beside them. Unknown keys are refused. TOML has no
null: write `\"none\"` where the reference takes `None`. Every key can be set on the command line
too, as `KEY=VALUE` after the subcommand (`seed=3`, `task.train_file=\"t.jsonl\"`), and
`--print-config` prints the resolved config.
";

/// One documented key.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    pub name: String,
    pub doc: String,
    /// The Rust type as written (an `Option` has no default value).
    pub ty: String,
}

/// A struct's documentation: its own doc comment, and its keys by section.
#[derive(Debug, Clone, PartialEq)]
pub struct StructDoc {
    pub doc: String,
    pub sections: Vec<(String, Vec<Key>)>,
}

/// Read `pub struct <name> { ... }` from the source: its doc comment and each field's.
pub fn struct_doc(name: &str) -> StructDoc {
    let lines: Vec<&str> = SOURCES.iter().flat_map(|s| s.lines()).collect();
    let start = lines
        .iter()
        .position(|l| *l == format!("pub struct {name} {{"))
        .unwrap_or_else(|| panic!("`pub struct {name}` is in neither src/config/mod.rs nor tables.rs"));
    let doc_comment = |upto: usize| {
        let mut docs: Vec<&str> = Vec::new();
        for l in lines[..upto].iter().rev() {
            let t = l.trim();
            if let Some(d) = t.strip_prefix("///") {
                docs.push(d.strip_prefix(' ').unwrap_or(d));
            } else if !t.starts_with("#[") {
                break;
            }
        }
        docs.reverse();
        docs
    };
    let own = doc_comment(start);
    let mut sections: Vec<(String, Vec<Key>)> = vec![(String::new(), Vec::new())];
    for (i, l) in lines.iter().enumerate().skip(start + 1) {
        let t = l.trim();
        if *l == "}" {
            break;
        }
        if let Some(title) = t.strip_prefix("// ---") {
            sections.push((title.trim_matches(|c: char| c == '-' || c.is_whitespace()).to_string(), Vec::new()));
        } else if let Some((field, ty)) = t.strip_prefix("pub ").and_then(|f| f.split_once(':')) {
            let doc = doc_comment(i).join(" ");
            let ty = ty.trim().trim_end_matches(',').to_string();
            sections.last_mut().expect("a section").1.push(Key { name: field.to_string(), doc, ty });
        }
    }
    sections.retain(|(_, keys)| !keys.is_empty());
    StructDoc { doc: paragraphs(&own), sections }
}

/// Doc comment lines as markdown: lines joined into paragraphs, table rows kept whole.
fn paragraphs(lines: &[&str]) -> String {
    let mut out = String::new();
    for l in lines {
        if l.is_empty() {
            out.push_str("\n\n");
        } else if l.starts_with('|') {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(l);
            out.push('\n');
        } else {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push(' ');
            }
            out.push_str(l);
        }
    }
    out.trim().to_string()
}

/// The default of each key of a serialized struct, as TOML writes it (`none` for an unset
/// option; a value the config leaves out of its TOML when it is the default is serialized on
/// its own).
fn default_of(table: &toml::Table, key: &Key, whole: &toml::Value) -> String {
    if key.name == "task" || key.name == "reward" || key.name == "transition" {
        return format!("`[{}]` below", key.name);
    }
    let value = table.get(&key.name).or_else(|| whole.get(&key.name));
    match value {
        Some(toml::Value::String(s)) => format!("`\"{s}\"`"),
        Some(toml::Value::Table(t)) if t.is_empty() => "`{}`".into(),
        Some(v) => format!("`{v}`"),
        None if key.ty.starts_with("Option<") => "none".into(),
        None => panic!("config key `{}` has no default to show (it is skipped when serialized)", key.name),
    }
}

/// Serialize every field, the ones `Config`'s TOML leaves out at their defaults included.
fn all_fields(cfg: &Config) -> toml::Value {
    let mut t = toml::Table::new();
    t.insert("reward_head".into(), toml::Value::try_from(cfg.reward_head).expect("serializes"));
    t.insert("lr_scheduler_type".into(), toml::Value::try_from(cfg.lr_scheduler_type).expect("serializes"));
    t.insert("gradient_checkpointing".into(), toml::Value::Boolean(cfg.gradient_checkpointing));
    t.insert("keep_best_tolerance".into(), toml::Value::Float(cfg.keep_best_tolerance));
    t.insert("history_reward".into(), toml::Value::String(cfg.history_reward.clone()));
    t.insert("rl_reward".into(), toml::Value::String(cfg.rl_reward.clone()));
    toml::Value::Table(t)
}

fn table_of(keys: &[Key], defaults: &toml::Table, whole: &toml::Value, prefix: &str) -> String {
    let mut out = String::from("| key | default | meaning |\n|---|---|---|\n");
    for key in keys {
        let doc = key.doc.replace('|', "\\|");
        out += &format!("| `{prefix}{}` | {} | {doc} |\n", key.name, default_of(defaults, key, whole));
    }
    out
}

/// `docs/config.md`.
pub fn markdown() -> String {
    let cfg = Config::default();
    let defaults = toml::Table::try_from(&cfg).expect("the config serializes");
    let whole = all_fields(&cfg);
    let mut out = String::from(INTRO);
    let config = struct_doc("Config");
    for (title, keys) in &config.sections {
        let keys: Vec<Key> = keys.iter().filter(|k| k.name != "iterative" && k.name != "modes").cloned().collect();
        out += &format!("\n## {title}\n\n{}", table_of(&keys, &defaults, &whole, ""));
    }
    out += "\n`pbrl iterate` takes the reference's iterative defaults for the keys its config leaves unset: ";
    let iter: Vec<String> = iterative_defaults(false).iter().map(|(k, v)| format!("`{k} = {v}`")).collect();
    out += &iter.join(", ");
    let marlhf: Vec<String> = iterative_defaults(true)
        .iter()
        .filter(|kv| !iterative_defaults(false).contains(kv))
        .map(|(k, v)| format!("`{k} = {v}`"))
        .collect();
    out += &format!("; with `algorithm = \"marlhf\"` also {}.\n", marlhf.join(", "));
    for (name, table, value) in [
        ("task", "TaskConfig", toml::Value::try_from(TaskConfig::default())),
        ("reward", "RewardConfig", toml::Value::try_from(RewardConfig::default())),
        ("agent_lora", "AgentLora", toml::Value::try_from(AgentLora::default())),
        ("transition", "TransitionConfig", toml::Value::try_from(TransitionConfig::default())),
    ] {
        let doc = struct_doc(table);
        let mut value = value.expect("serializes");
        if let Some(t) = value.as_table_mut().filter(|_| name == "agent_lora") {
            // Left out of a written config at its default (`ComputeDType::is_f32`).
            t.insert("compute_dtype".into(), toml::Value::try_from(ComputeDType::F32).expect("serializes"));
        }
        let defaults = value.as_table().cloned().unwrap_or_default();
        let keys: Vec<Key> = doc.sections.iter().flat_map(|(_, k)| k.clone()).filter(|k| k.name != "params").collect();
        out += &format!("\n## `[{name}]`\n\n{}\n\n{}", doc.doc, table_of(&keys, &defaults, &value, ""));
    }
    out
}
