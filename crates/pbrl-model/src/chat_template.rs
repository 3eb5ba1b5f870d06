//! A model's own chat template, rendered as transformers' `apply_chat_template` renders it.
//!
//! transformers compiles the template with Jinja2 (`trim_blocks`, `lstrip_blocks`, loop controls)
//! and gives it `messages`, `add_generation_prompt`, the tokenizer's special tokens
//! (`bos_token`, `eos_token`, ...), any extra keyword arguments, and the globals
//! `raise_exception` and `strftime_now`; its `tojson` is Python's `json.dumps` with
//! `ensure_ascii=False`. pbrl does the same with minijinja and its Python-compatibility methods
//! (`str.strip`, `.startswith`, `dict.items`, ...), so the rendered text is byte for byte the same.
use std::collections::BTreeMap;

use anyhow::{anyhow, Result};
use minijinja::value::{Kwargs, Serde, Value as JValue};
use minijinja::{Environment, Error as JError, ErrorKind};
use serde_json::Value;

/// One turn of a conversation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Message<'a> {
    pub role: &'a str,
    pub content: &'a str,
}

/// A compiled chat template and the variables transformers passes to it besides the messages.
pub struct ChatTemplate {
    /// The template source exactly as the model ships it.
    pub source: String,
    env: Environment<'static>,
    /// `bos_token`, `eos_token`, `pad_token`, `unk_token` where the tokenizer names them.
    special_tokens: BTreeMap<String, String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("source", &self.source).finish()
    }
}

impl Clone for ChatTemplate {
    fn clone(&self) -> Self {
        Self::compile(&self.source, self.special_tokens.clone()).expect("compiled once already")
    }
}

impl PartialEq for ChatTemplate {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source && self.special_tokens == other.special_tokens
    }
}

impl ChatTemplate {
    /// Compile a template; an error names what minijinja could not parse.
    pub fn compile(source: &str, special_tokens: BTreeMap<String, String>) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| anyhow!("configuring the template engine: {e}"))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", |msg: String| -> Result<JValue, JError> {
            Err(JError::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| chrono::Local::now().format(&fmt).to_string());
        env.add_template_owned("chat_template", source.to_string())
            .map_err(|e| anyhow!("the model's chat template does not compile: {e:#}"))?;
        Ok(Self { source: source.to_string(), env, special_tokens })
    }

    /// The text for a conversation; `extra` holds the user's `chat_template_kwargs` (they
    /// override the special tokens, as keyword arguments do in transformers).
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, Value>,
    ) -> Result<String> {
        let mut ctx: BTreeMap<String, JValue> = BTreeMap::new();
        for (k, v) in &self.special_tokens {
            ctx.insert(k.clone(), JValue::from(v.clone()));
        }
        for (k, v) in extra {
            ctx.insert(k.clone(), JValue::from(Serde(v)));
        }
        ctx.insert("messages".into(), JValue::from(Serde(messages)));
        ctx.insert("add_generation_prompt".into(), JValue::from(add_generation_prompt));
        let tmpl = self.env.get_template("chat_template").expect("added at compile");
        tmpl.render(ctx).map_err(|e| anyhow!("rendering the model's chat template: {e:#}"))
    }
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
fn tojson(value: JValue, kwargs: Kwargs) -> Result<JValue, JError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let v = serde_json::to_value(&value).map_err(|e| JError::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let (item, key) = match &separators {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        Some(_) => return Err(JError::new(ErrorKind::InvalidOperation, "tojson separators must be a pair")),
        // Python's defaults: ", " without indent, "," with it (the newline follows).
        None => (if indent.is_some() { "," } else { ", " }.to_string(), ": ".to_string()),
    };
    let mut out = String::new();
    py_dumps(&v, indent, sort_keys.unwrap_or(false), (&item, &key), 0, &mut out);
    Ok(JValue::from_safe_string(out))
}

/// Python's `json.dumps` layout (its float repr aside: JSON numbers are written as serde_json
/// writes them, which agrees for integers and for floats with a fractional part).
fn py_dumps(v: &Value, indent: Option<usize>, sort: bool, seps: (&str, &str), level: usize, out: &mut String) {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    match v {
        Value::Array(a) if !a.is_empty() => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(seps.0);
                }
                newline(out, level + 1);
                py_dumps(x, indent, sort, seps, level + 1, out);
            }
            newline(out, level);
            out.push(']');
        }
        Value::Object(m) if !m.is_empty() => {
            let mut entries: Vec<(&String, &Value)> = m.iter().collect();
            if sort {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, x)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(seps.0);
                }
                newline(out, level + 1);
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(seps.1);
                py_dumps(x, indent, sort, seps, level + 1, out);
            }
            newline(out, level);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, msgs: &[Message], extra: serde_json::Value) -> String {
        let mut sp = BTreeMap::new();
        sp.insert("bos_token".to_string(), "<s>".to_string());
        let t = ChatTemplate::compile(src, sp).unwrap();
        t.render(msgs, true, extra.as_object().unwrap()).unwrap()
    }

    #[test]
    fn python_methods_trim_blocks_and_kwargs() {
        let src =
            "{{ bos_token }}{% for m in messages %}\n  {{ m.role.upper() }}:{{ m.content.strip() }}|\n{% endfor %}\
                   {% if add_generation_prompt %}A{% endif %}{% if flag is defined %}{{ flag }}{% endif %}";
        let msgs = [Message { role: "user", content: "  hi  " }];
        assert_eq!(render(src, &msgs, serde_json::json!({})), "<s>  USER:hi|\nA");
        assert_eq!(render(src, &msgs, serde_json::json!({"flag": 7})), "<s>  USER:hi|\nA7");
    }

    #[test]
    fn tojson_is_pythons_json_dumps() {
        let msgs = [Message { role: "user", content: "x" }];
        let extra = serde_json::json!({"t": {"name": "f", "args": [1, "é<"], "e": {}}});
        assert_eq!(render("{{ t | tojson }}", &msgs, extra.clone()), r#"{"name": "f", "args": [1, "é<"], "e": {}}"#);
        assert_eq!(
            render("{{ t | tojson(indent=2) }}", &msgs, extra),
            "{\n  \"name\": \"f\",\n  \"args\": [\n    1,\n    \"é<\"\n  ],\n  \"e\": {}\n}"
        );
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::compile("{{ raise_exception('no system role') }}", BTreeMap::new()).unwrap();
        let err = t.render(&[], true, &serde_json::Map::new()).unwrap_err();
        assert!(format!("{err:#}").contains("no system role"), "{err:#}");
    }
}
