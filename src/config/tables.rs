//! The `[task]`, `[reward]` and `[agent_lora]` tables.
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::PerActor;

/// The task: its items and how each agent's prompt is written from an item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TaskConfig {
    /// JSONL: one task item (a JSON object) per line; the items collection and training use.
    pub train_file: Option<PathBuf>,
    /// JSONL: the held-out items `pbrl eval` (and, with `eval_split = "eval_file"`, the periodic
    /// evaluations) use.
    pub eval_file: Option<PathBuf>,
    /// JSONL: items only the periodic evaluations use (`eval_split = "validation_file"`), so
    /// that keep-best chooses agents on prompts that are neither trained on nor in `eval_file`.
    pub validation_file: Option<PathBuf>,
    /// One prompt template per agent, or one for all; `{field}` is replaced by the item's field,
    /// `{{` and `}}` are literal braces.
    pub formatters: Vec<String>,
    /// Optional per-agent system prompts for the chat template.
    pub system_prompts: Option<Vec<String>>,
    /// Wrap each prompt in the model's chat template.
    pub chat_template: bool,
    /// Extra variables for the chat template, as keyword arguments of transformers'
    /// `apply_chat_template` (`enable_thinking = false` for Qwen3, `date_string` for Llama 3.x).
    pub chat_template_kwargs: toml::Table,
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            train_file: None,
            eval_file: None,
            validation_file: None,
            formatters: vec!["{prompt}".to_string()],
            system_prompts: None,
            chat_template: true,
            chat_template_kwargs: toml::Table::new(),
        }
    }
}

/// The task reward and its `reward_processor` (x * scale + shift). Parameters of the chosen kind
/// sit in the same table and are checked by the reward itself:
///
/// | kind | parameters | reward |
/// |---|---|---|
/// | `length_ratio` | `target_min` = 2, `target_max` = 3 | r = len(agent 1) / len(agent 0) in characters; 1 inside [min, max], exp(−distance) outside; 0 when agent 0's answer is empty |
/// | `tldr_length` | `target_chars` = 220, `tolerance` = 110 | the reference's TL;DR dual-length reward: the ratio score (1 in [2, 3]) and the concise length's score, averaged, in [−1, 1]; −1 when an answer is empty |
/// | `numeric_answer` | `answer_field` = "answer", `tolerance` = 1e-6 | 1 when the last agent's last `\boxed{}` (else its last number) equals the item's answer |
/// | `keywords` | `keywords` = [], `keywords_field` = "keywords", `regex` = false, `whole_words` = false, `max_words` = [] | the share of the keywords (the config's and the item's) found, case-insensitively, in the agents' texts; `whole_words`: only as whole words; `max_words`: per role, only its first N words are searched (0: all); `split` = false: with true, a keyword counts only when exactly one role's text uses it (the roles share the keywords out) |
/// | `command` | `command` = [program, args...], `env` = [variable names] | an external program speaking JSON lines: one request per item, `{"prompts", "completions", "items"}`, one answer `{"rewards": [...]}`; it gets `PATH`, `HOME`, `LANG` and the variables `env` names, nothing else |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RewardConfig {
    /// Which reward (the table above).
    pub kind: String,
    /// The reward processor's scale: x * scale + shift.
    pub scale: f64,
    /// The reward processor's shift.
    pub shift: f64,
    /// The kind's parameters (the table above).
    #[serde(flatten)]
    pub params: toml::Table,
}

impl Default for RewardConfig {
    fn default() -> Self {
        Self { kind: "length_ratio".into(), scale: 1.0, shift: 0.0, params: toml::Table::new() }
    }
}

/// The transition between turns (`num_turns` > 1; CoMLRL's `external_transition`): what each
/// agent is asked at the next turn of a branch, from the item and that branch of the
/// discussion. `kind = "debate"`: agent i's next prompt renders `template` over the item's fields
/// and `{own}` (its own latest answer), `{others}` (the other agents' latest answers, one
/// `Agent j: ...` paragraph each), `{turn}` (the coming turn's number, from 1) and `{history}`
/// (every answer so far, turn by turn); its system prompt stays its own. `kind = "command"`:
/// an external program speaking JSON lines, as the command reward: one request per branch,
/// `{"item", "turn", "prompts", "responses"}` (`prompts[a][t]`, `responses[a][t]`: agent a's
/// prompt and answer at turn t + 1 of the branch), one answer `{"prompts": [one per agent]}`;
/// it gets `PATH`, `HOME`, `LANG` and the variables `env` names, nothing else.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TransitionConfig {
    /// "debate" (built in) or "command" (an external program).
    pub kind: String,
    /// debate: the next turn's prompt template, one for every agent or one per agent (unset:
    /// the agent's prompt, its answer so far and the others', and an invitation to improve it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<PerActor<String>>,
    /// command: the program and its arguments.
    pub command: Vec<String>,
    /// command: environment variables the program gets besides PATH, HOME and LANG.
    pub env: Vec<String>,
    /// command: seconds to wait for each answer.
    pub timeout_s: f64,
}

impl Default for TransitionConfig {
    fn default() -> Self {
        Self { kind: "debate".into(), template: None, command: Vec::new(), env: Vec::new(), timeout_s: 60.0 }
    }
}

/// LoRA agents (off when the table is absent): each agent is its base model, frozen and shared in
/// memory by the agents of one source, plus a low-rank adapter on the projections
/// `target_modules` name, which is all that trains; its saved `agents/agent_i/` is a PEFT adapter
/// (`adapter_config.json`, `adapter_model.safetensors`) over its source. PEFT's `LoraConfig`
/// keys and meaning. `r`, `alpha`, `target_modules` and `use_rslora` take one value for every
/// agent or a list with one per agent (as `max_new_tokens`). Every stage and every MARLHF
/// backend takes LoRA agents. The actor-critic backends' critics are what they are for whole
/// agents: a separate critic (`iac`'s default, `maac`) is a whole model on `critic_model_name`
/// (default: the agent's base) that trains all its weights; `use_separate_critic = false` puts
/// the value head on the LoRA actor, where it trains with the adapters, is kept in the
/// checkpoints and left out of the saved adapter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentLora {
    /// The adapters' rank, 1 to 1024 (or one per agent).
    pub r: PerActor<i64>,
    /// The scale numerator: the adapter's product is multiplied by alpha / r (alpha / √r with
    /// `use_rslora`); or one per agent.
    pub alpha: PerActor<f64>,
    /// Dropout on the adapters' inputs in training passes (PEFT's `lora_dropout`), in [0, 1):
    /// each input element an adapter reads is dropped with this probability and the rest
    /// scaled by 1 / (1 − dropout); the frozen base reads its input whole.
    pub dropout: f64,
    /// The projections that get adapters: names among q_proj, k_proj, v_proj, o_proj, gate_proj,
    /// up_proj, down_proj, or "all-linear" (or ["all-linear"]) for all of them, as PEFT takes it;
    /// or a list of such, one per agent (`[["q_proj", "v_proj"], "all-linear"]`: a flat list of
    /// names is one list for every agent).
    pub target_modules: PerActor<Modules>,
    /// rsLoRA's scale alpha / √r (or one per agent).
    pub use_rslora: PerActor<bool>,
    /// How the shared frozen base stores its matrices: "f32" (exact), "bf16" (every matrix in
    /// bf16) or "q8_0" (projections in GGUF's q8_0 blocks, which need input sizes that are
    /// multiples of 32; embeddings in bf16). Each product reads them in f32 (QLoRA's rule; see
    /// `compute_dtype`), so the backward pass is exact for the stored weights; adapters,
    /// optimizer state and activations stay f32.
    pub base_dtype: BaseDType,
    /// What the frozen base's products read: "f32" (the exact products, the default) or "bf16"
    /// (bitsandbytes' `bnb_4bit_compute_dtype`: each product with a base matrix, forward and
    /// backward, and the LM head's, takes its input rounded to bf16 and the matrix's bf16
    /// values, summing in f32: those products run about twice as fast on CPUs with
    /// AVX512_BF16, and each matrix is held as two bf16 copies laid out for them, the size of
    /// its f32 copy, in place of its stored one). CPU only; with a base_dtype of "f32" or "bf16".
    #[serde(skip_serializing_if = "ComputeDType::is_f32")]
    pub compute_dtype: ComputeDType,
    /// Also write each trained agent merged into its base (PEFT's `merge_and_unload`: the base
    /// as on disk, in f32, plus s · B A) as a whole Hugging Face directory,
    /// `<run_dir>/agents_merged/agent_i`, whenever a training stage saves the team.
    pub save_merged: bool,
}

/// Projection names: a list of strings, or one string standing for a list of it (PEFT's
/// `target_modules`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Modules(pub Vec<String>);

impl<'de> Deserialize<'de> for Modules {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        Ok(Modules(match OneOrMany::deserialize(d)? {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }))
    }
}

/// How frozen weights are stored: `agent_lora.base_dtype`, `frozen_dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BaseDType {
    F32,
    Bf16,
    #[serde(rename = "q8_0")]
    Q8_0,
}

/// What a frozen base's products read: `agent_lora.compute_dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeDType {
    #[default]
    F32,
    Bf16,
}

impl ComputeDType {
    /// The default, left out of a written config (so fingerprints made before it stay).
    pub fn is_f32(&self) -> bool {
        *self == ComputeDType::F32
    }
}

impl Default for AgentLora {
    fn default() -> Self {
        Self {
            r: PerActor::One(8),
            alpha: PerActor::One(16.0),
            dropout: 0.0,
            target_modules: PerActor::One(Modules(vec!["all-linear".into()])),
            use_rslora: PerActor::One(false),
            base_dtype: BaseDType::F32,
            compute_dtype: ComputeDType::F32,
            save_merged: false,
        }
    }
}

/// The projections a Llama-family decoder has (PEFT's "all-linear" on it, the LM head excluded);
/// `model::lora::ALL_LINEAR`, which a test keeps equal (the config imports nothing from the model).
pub const LORA_PROJECTIONS: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

impl AgentLora {
    /// Agent `i`'s adapter shape: rank, alpha, projection names ("all-linear" expanded), rsLoRA.
    pub fn shape_of(&self, i: usize) -> (usize, f64, Vec<String>, bool) {
        let modules = &self.target_modules.of(i).0;
        let targets = match modules.iter().any(|t| t == "all-linear") {
            true => LORA_PROJECTIONS.map(String::from).to_vec(),
            false => modules.clone(),
        };
        (*self.r.of(i) as usize, *self.alpha.of(i), targets, *self.use_rslora.of(i))
    }

    /// Whether any key gives one value per agent (a list).
    pub fn per_agent(&self) -> bool {
        matches!(self.r, PerActor::Each(_))
            || matches!(self.alpha, PerActor::Each(_))
            || matches!(self.target_modules, PerActor::Each(_))
            || matches!(self.use_rslora, PerActor::Each(_))
    }

    /// The table's rules, lists checked against `actors`; `key` names the table in errors.
    pub(super) fn validate(&self, actors: usize, key: &str) -> Result<(), super::ConfigError> {
        let bad = |m: String| Err(super::ConfigError(m));
        self.r.check_len(actors, &format!("{key}.r"))?;
        self.alpha.check_len(actors, &format!("{key}.alpha"))?;
        self.target_modules.check_len(actors, &format!("{key}.target_modules"))?;
        self.use_rslora.check_len(actors, &format!("{key}.use_rslora"))?;
        if self.r.values().iter().any(|r| !(1..=1024).contains(*r)) {
            return bad(format!("{key}.r must be in [1, 1024]."));
        }
        if self.alpha.values().iter().any(|a| !(**a > 0.0 && a.is_finite())) {
            return bad(format!("{key}.alpha must be > 0."));
        }
        if self.compute_dtype == ComputeDType::Bf16 && self.base_dtype == BaseDType::Q8_0 {
            return bad(format!(
                "{key}.compute_dtype = \"bf16\" reads the base's matrices in bf16: use base_dtype = \"f32\" or \"bf16\", \
                 not \"q8_0\"."
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad(format!("{key}.dropout must be in [0, 1)."));
        }
        for Modules(modules) in self.target_modules.values() {
            if modules.is_empty() {
                return bad(format!("{key}.target_modules is empty: name projections or use [\"all-linear\"]."));
            }
            let all = modules.iter().any(|t| t == "all-linear");
            if let Some(t) = modules.iter().find(|t| !LORA_PROJECTIONS.contains(&t.as_str()) && !all) {
                return bad(format!(
                    "{key}.target_modules: `{t}` is not one of {LORA_PROJECTIONS:?} or \"all-linear\"."
                ));
            }
            if all && modules.len() > 1 {
                return bad(format!(
                    "{key}.target_modules: \"all-linear\" stands alone (one list per agent: a list of lists, \
                     [[\"q_proj\"], \"all-linear\"])."
                ));
            }
        }
        Ok(())
    }
}
