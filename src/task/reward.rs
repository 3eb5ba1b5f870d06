//! Task rewards: a score for each joint response (one completion per agent).
use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::TaskItem;

/// A task reward. `completions[a]` is agent a's completion of the joint response; the task item
/// is passed so rewards can read its fields (targets, answers, keywords).
pub trait TaskReward: Send {
    fn score(&mut self, item: &TaskItem, prompts: &[String], completions: &[String]) -> Result<f64>;

    /// Scores of several joint responses to one item (`joints[k][a]`); external programs
    /// answer them in one request.
    fn score_batch(&mut self, item: &TaskItem, prompts: &[String], joints: &[Vec<String>]) -> Result<Vec<f64>> {
        joints.iter().map(|c| self.score(item, prompts, c)).collect()
    }
}

/// The reference's quick-start length-ratio reward: agent 1's answer should be between
/// `target_min` and `target_max` times as long (in characters) as agent 0's.
/// 1 inside the band, `exp(-distance)` outside it, 0 when agent 0's answer is empty.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LengthRatio {
    #[serde(default = "two")]
    pub target_min: f64,
    #[serde(default = "three")]
    pub target_max: f64,
}
fn two() -> f64 {
    2.0
}
fn three() -> f64 {
    3.0
}

impl LengthRatio {
    pub fn value(&self, first: &str, second: &str) -> f64 {
        let l1 = first.chars().count();
        if l1 == 0 {
            return 0.0;
        }
        let ratio = second.chars().count() as f64 / l1 as f64;
        if ratio < self.target_min {
            (-(self.target_min - ratio)).exp()
        } else if ratio > self.target_max {
            (-(ratio - self.target_max)).exp()
        } else {
            1.0
        }
    }
}

impl TaskReward for LengthRatio {
    fn score(&mut self, _item: &TaskItem, _prompts: &[String], completions: &[String]) -> Result<f64> {
        if completions.len() != 2 {
            bail!("the length_ratio reward compares exactly 2 agents, got {}", completions.len());
        }
        Ok(self.value(&completions[0], &completions[1]))
    }
}

/// `reward_processor`: x * scale + shift.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RewardProcessor {
    pub scale: f64,
    pub shift: f64,
}

impl RewardProcessor {
    pub fn apply(&self, x: f64) -> f64 {
        x * self.scale + self.shift
    }
}

/// The reference's TL;DR dual-length reward: the detailed summary (agent 1) should be 2-3x as
/// long as the concise one (agent 0), which should be about `target_chars` characters.
/// Empty → −1; ratio score 1 in [2, 3], else 1 − (2 − r)/2 below or 1 − (r − 3)/3 above, floored
/// at −1; length score 1 − |len0 − target|/tolerance clipped to [−1, 1]; reward
/// clip(0.5·(ratio + length), −1, 1).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TldrLength {
    #[serde(default = "tldr_target")]
    pub target_chars: f64,
    #[serde(default = "tldr_tolerance")]
    pub tolerance: f64,
}
fn tldr_target() -> f64 {
    220.0
}
fn tldr_tolerance() -> f64 {
    110.0
}

impl TldrLength {
    pub fn value(&self, concise: &str, detailed: &str) -> f64 {
        let (l0, l1) = (concise.chars().count() as f64, detailed.chars().count() as f64);
        if l0 == 0.0 || l1 == 0.0 {
            return -1.0;
        }
        let r = l1 / l0;
        let ratio = if r < 2.0 {
            1.0 - (2.0 - r) / 2.0
        } else if r > 3.0 {
            1.0 - (r - 3.0) / 3.0
        } else {
            1.0
        }
        .max(-1.0);
        let length = (1.0 - (l0 - self.target_chars).abs() / self.tolerance).clamp(-1.0, 1.0);
        (0.5 * (ratio + length)).clamp(-1.0, 1.0)
    }
}

impl TaskReward for TldrLength {
    fn score(&mut self, _item: &TaskItem, _prompts: &[String], completions: &[String]) -> Result<f64> {
        if completions.len() != 2 {
            bail!("the tldr_length reward compares exactly 2 agents, got {}", completions.len());
        }
        Ok(self.value(&completions[0], &completions[1]))
    }
}

/// Math tasks: the final agent's answer (its last `\boxed{...}`, else its last number) against
/// the item's `answer_field`. 1 when equal within `tolerance`, else 0.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NumericAnswer {
    #[serde(default = "answer_field")]
    pub answer_field: String,
    #[serde(default = "numeric_tolerance")]
    pub tolerance: f64,
}
fn answer_field() -> String {
    "answer".into()
}
fn numeric_tolerance() -> f64 {
    1e-6
}

/// The last `\boxed{...}` content, else the last number in the text, as f64.
pub fn extract_answer(text: &str) -> Option<f64> {
    let number = |s: &str| -> Option<f64> {
        let re = regex::Regex::new(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+").expect("valid regex");
        re.find_iter(s).last().and_then(|m| m.as_str().replace(',', "").parse().ok())
    };
    if let Some(at) = text.rfind("\\boxed{") {
        let inner = &text[at + "\\boxed{".len()..];
        if let Some(end) = inner.find('}') {
            if let Some(v) = number(&inner[..end]) {
                return Some(v);
            }
        }
    }
    number(text)
}

impl TaskReward for NumericAnswer {
    fn score(&mut self, item: &TaskItem, _prompts: &[String], completions: &[String]) -> Result<f64> {
        let want = match item.get(&self.answer_field) {
            Some(serde_json::Value::Number(n)) => n.as_f64(),
            Some(serde_json::Value::String(s)) => extract_answer(s),
            _ => None,
        }
        .with_context(|| format!("numeric_answer: the task item has no numeric `{}` field", self.answer_field))?;
        let last = completions.last().map(String::as_str).unwrap_or("");
        Ok(match extract_answer(last) {
            Some(got) if (got - want).abs() <= self.tolerance => 1.0,
            _ => 0.0,
        })
    }
}

/// Coverage of keywords (or regular expressions) by the joint response: the fraction of them
/// found, case-insensitively, in the agents' texts together. Keywords come from the config
/// (`keywords = [...]`) and/or the item's `keywords_field` (a list of strings).
///
/// `whole_words` matches a keyword only as a whole word ("rain" not in "brain"); `max_words`
/// (one entry per role, 0 for no limit) searches only a role's first N words, so a title cannot
/// collect keywords by growing.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Keywords {
    #[serde(default)]
    pub keywords: Vec<String>,
    #[serde(default = "keywords_field")]
    pub keywords_field: String,
    /// Treat keywords as regular expressions.
    #[serde(default)]
    pub regex: bool,
    #[serde(default)]
    pub whole_words: bool,
    #[serde(default)]
    pub max_words: Vec<u32>,
    /// A keyword counts only when exactly one role's text uses it: the roles share the
    /// keywords out between them, none used twice.
    #[serde(default)]
    pub split: bool,
}
fn keywords_field() -> String {
    "keywords".into()
}

pub struct KeywordReward {
    spec: Keywords,
    fixed: Vec<regex::Regex>,
}

impl Keywords {
    fn pattern(&self, k: &str) -> Result<regex::Regex> {
        let p = if self.regex { k.to_string() } else { regex::escape(k) };
        let p = if self.whole_words { format!(r"\b(?:{p})\b") } else { p };
        regex::RegexBuilder::new(&p)
            .case_insensitive(true)
            .build()
            .with_context(|| format!("reward.keywords: invalid pattern `{k}`"))
    }

    pub fn compile(self) -> Result<KeywordReward> {
        let fixed = self.keywords.iter().map(|k| self.pattern(k)).collect::<Result<Vec<_>>>()?;
        Ok(KeywordReward { spec: self, fixed })
    }
}

impl TaskReward for KeywordReward {
    fn score(&mut self, item: &TaskItem, _prompts: &[String], completions: &[String]) -> Result<f64> {
        let mut patterns = self.fixed.clone();
        if let Some(v) = item.get(&self.spec.keywords_field) {
            let list = v.as_array().with_context(|| {
                format!("keywords: item field `{}` must be a list of strings", self.spec.keywords_field)
            })?;
            for k in list {
                let k = k.as_str().with_context(|| {
                    format!("keywords: item field `{}` must be a list of strings", self.spec.keywords_field)
                })?;
                patterns.push(self.spec.pattern(k)?);
            }
        }
        if patterns.is_empty() {
            bail!("keywords: no keywords (set reward.keywords or give items a `{}` list)", self.spec.keywords_field);
        }
        if !self.spec.max_words.is_empty() && self.spec.max_words.len() != completions.len() {
            bail!(
                "reward.max_words has {} entries but the joint response has {} roles; give one per role (0: no limit)",
                self.spec.max_words.len(),
                completions.len()
            );
        }
        let searched: Vec<&str> = completions
            .iter()
            .enumerate()
            .map(|(a, c)| match self.spec.max_words.get(a) {
                Some(&n) if n > 0 => first_words(c, n as usize),
                _ => c.as_str(),
            })
            .collect();
        let counted = match self.spec.split {
            true => patterns.iter().filter(|p| searched.iter().filter(|t| p.is_match(t)).count() == 1).count(),
            false => {
                let text = searched.join("\n");
                patterns.iter().filter(|p| p.is_match(&text)).count()
            }
        };
        Ok(counted as f64 / patterns.len() as f64)
    }
}

/// The text up to the end of its `n`th whitespace-separated word.
fn first_words(text: &str, n: usize) -> &str {
    let mut words = 0;
    let mut in_word = false;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            if in_word && words == n {
                return &text[..i];
            }
            in_word = false;
        } else if !in_word {
            in_word = true;
            words += 1;
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_ratio_formula() {
        let r = LengthRatio { target_min: 2.0, target_max: 3.0 };
        assert_eq!(r.value("", "abc"), 0.0);
        assert_eq!(r.value("ab", "abcde"), 1.0); // 2.5
        assert_eq!(r.value("ab", "abcd"), 1.0); // exactly 2
        assert_eq!(r.value("ab", "abcdef"), 1.0); // exactly 3
        assert!((r.value("ab", "ab") - (-1.0f64).exp()).abs() < 1e-12); // ratio 1
        assert!((r.value("a", "abcde") - (-2.0f64).exp()).abs() < 1e-12); // ratio 5
        assert!((r.value("é", "日本") - 1.0).abs() < 1e-12); // characters, not bytes
    }

    fn item(v: serde_json::Value) -> TaskItem {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn tldr_length_formula() {
        let r = TldrLength { target_chars: 220.0, tolerance: 110.0 };
        let s = |n: usize| "x".repeat(n);
        assert_eq!(r.value("", "abc"), -1.0);
        assert_eq!(r.value(&s(220), &s(550)), 1.0); // ratio 2.5, exact length
        assert!((r.value(&s(220), &s(220)) - 0.75).abs() < 1e-12); // ratio 1 → 0.5; length 1
        assert!((r.value(&s(110), &s(660)) - 0.0).abs() < 1e-12); // ratio 6 → 0; length 0
        assert!((r.value(&s(440), &s(44000)) - (-1.0)).abs() < 1e-12); // both floored
    }

    #[test]
    fn numeric_answer_reads_boxed_or_last_number() {
        assert_eq!(extract_answer("so \\boxed{1,234} then 7"), Some(1234.0));
        assert_eq!(extract_answer("first 3 then -4.5."), Some(-4.5));
        assert_eq!(extract_answer("no digits"), None);
        let mut r = NumericAnswer { answer_field: "answer".into(), tolerance: 1e-6 };
        let it = item(serde_json::json!({"answer": 12}));
        let c = |a: &str, b: &str| vec![a.to_string(), b.to_string()];
        assert_eq!(r.score(&it, &[], &c("I think 3", "The total is 12.")).unwrap(), 1.0);
        assert_eq!(r.score(&it, &[], &c("12", "The total is 13.")).unwrap(), 0.0, "the final agent answers");
        let it = item(serde_json::json!({"answer": "#### 12"}));
        assert_eq!(r.score(&it, &[], &c("", "\\boxed{12}")).unwrap(), 1.0);
        assert!(r.score(&item(serde_json::json!({})), &[], &c("", "1")).is_err());
    }

    #[test]
    fn keyword_coverage_from_config_and_item() {
        let spec = Keywords { keywords: vec!["dragon".into()], keywords_field: "keywords".into(), ..keyword_spec() };
        let mut r = spec.compile().unwrap();
        let it = item(serde_json::json!({"keywords": ["castle", "a.b"]}));
        let c = vec!["The DRAGON slept.".to_string(), "Near the castle".to_string()];
        assert!((r.score(&it, &[], &c).unwrap() - 2.0 / 3.0).abs() < 1e-12, "a.b is literal, not a pattern");
        let spec =
            Keywords { keywords: vec![r"\bsle\w+".into()], keywords_field: "k".into(), regex: true, ..keyword_spec() };
        assert_eq!(spec.compile().unwrap().score(&it, &[], &c).unwrap(), 1.0);
    }

    #[test]
    fn keywords_as_whole_words_within_each_roles_word_limit() {
        let none = item(serde_json::json!({}));
        let c = |a: &str, b: &str| vec![a.to_string(), b.to_string()];
        let substring = Keywords { keywords: vec!["rain".into()], ..keyword_spec() };
        assert_eq!(substring.compile().unwrap().score(&none, &[], &c("", "A brain.")).unwrap(), 1.0);
        let words = Keywords { keywords: vec!["rain".into(), "sea".into()], whole_words: true, ..keyword_spec() };
        let mut r = words.clone().compile().unwrap();
        assert_eq!(r.score(&none, &[], &c("", "A brain by the seas.")).unwrap(), 0.0);
        assert_eq!(r.score(&none, &[], &c("Rain!", "By the sea.")).unwrap(), 1.0);
        // The title's first 3 words only: "sea" as its 4th word does not count.
        let mut r = Keywords { max_words: vec![3, 0], ..words }.compile().unwrap();
        assert_eq!(r.score(&none, &[], &c("  Rain over the sea", "Nothing.")).unwrap(), 0.5);
        assert_eq!(r.score(&none, &[], &c("Rain\nsea", "")).unwrap(), 1.0);
        let err = r.score(&none, &[], &["a".to_string()]).unwrap_err().to_string();
        assert!(err.contains("reward.max_words has 2 entries but the joint response has 1 roles"), "{err}");
        assert_eq!(first_words(" a  b c", 2), " a  b");
        assert_eq!(first_words("a b", 5), "a b");
    }

    fn keyword_spec() -> Keywords {
        Keywords {
            keywords: vec![],
            keywords_field: "none".into(),
            regex: false,
            whole_words: false,
            max_words: vec![],
            split: false,
        }
    }

    /// Shared out: a keyword counts only in exactly one role's text, never in both.
    #[test]
    fn split_keywords_count_once_and_only_once() {
        let it = item(serde_json::json!({"keywords": ["moon", "bread", "river", "clock"]}));
        let c = |a: &str, b: &str| vec![a.to_string(), b.to_string()];
        let spec = Keywords { keywords_field: "keywords".into(), whole_words: true, split: true, ..keyword_spec() };
        let mut r = spec.compile().unwrap();
        assert_eq!(r.score(&it, &[], &c("The moon and bread.", "A river clock.")).unwrap(), 1.0);
        assert_eq!(r.score(&it, &[], &c("The moon and bread.", "The moon, a river.")).unwrap(), 0.5, "moon twice");
        assert_eq!(r.score(&it, &[], &c("moon bread river clock", "moon bread river clock")).unwrap(), 0.0);
        assert_eq!(r.score(&it, &[], &c("", "")).unwrap(), 0.0);
    }
}
