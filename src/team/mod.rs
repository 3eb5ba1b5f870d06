//! The team: one model per actor (per agent, or the one centralized actor), on its device, with
//! the recipe for its prompts; which weights it is made of ([`Members`]: the run's current team,
//! the base models, a saved team); what it can hold ([`check_fits`]). `collab.rs` holds the roles
//! and the centralized joint prompt, `rollout.rs` the one function that samples the team's
//! joint responses.
pub mod collab;
pub mod discussion;
pub mod rollout;

use anyhow::{bail, Context, Result};
use candle_core::Device;

use crate::config::{AgentLora, BaseDType, ComputeDType};
use crate::config::{DeviceSpec, TeamConfig};
use crate::device::{ensure_fits, parse_device};
use crate::rng::{derive_seed, purpose};
use crate::run::team::saved_team;
use crate::run::RunDir;
use crate::task::{render_template, TaskItem};
use collab::{joint_prompt, Collaboration};
use pbrl_model::linear::FrozenStorage;
use pbrl_model::lora::LoraSpec;
use pbrl_model::LoadedModel;

pub struct Agent {
    pub index: usize,
    pub model: LoadedModel,
    pub device: Device,
    recipe: PromptRecipe,
    chat_template: bool,
}

/// How an actor's prompt is written for an item.
#[derive(Clone)]
enum PromptRecipe {
    /// A decentralized agent: its own template and system prompt.
    Role { template: String, system_prompt: Option<String> },
    /// The centralized actor: every role's template (and system prompt, as part of its task) in
    /// one tagged prompt (`collab::joint_prompt`).
    Joint { templates: Vec<String>, system_prompts: Option<Vec<String>> },
}

impl Agent {
    /// The same actor (index, prompts) played by another model: a frozen reference policy.
    pub fn with_model(&self, model: LoadedModel, device: Device) -> Agent {
        Agent { index: self.index, model, device, recipe: self.recipe.clone(), chat_template: self.chat_template }
    }

    /// A user message as this actor's model is given it: with its chat template when the task
    /// uses chat templates (no system prompt).
    pub fn format_user_prompt(&self, user: &str) -> Result<String> {
        self.model.tokenizer.format_prompt(self.chat_template, None, user)
    }

    /// The user message this actor is given at a later turn of a discussion of `item`, from the
    /// text the transition wrote for it: that text standing in the item's `prompt` under the
    /// actor's template (as the reference's formatter reads a transition's prompt), or, with
    /// `passthrough` (`external_prompt_passthrough`), that text as it is.
    pub fn turn_message(&self, item: &TaskItem, transition: &str, passthrough: bool) -> Result<String> {
        match &self.recipe {
            PromptRecipe::Role { .. } if passthrough => Ok(transition.to_string()),
            PromptRecipe::Role { template, .. } => {
                let mut item = item.clone();
                item.insert("prompt".into(), serde_json::Value::String(transition.to_string()));
                render_template(template, &item).with_context(|| format!("agent {} prompt", self.index))
            }
            PromptRecipe::Joint { .. } => bail!("a centralized actor writes every role in one turn"),
        }
    }

    /// The user message this actor is given at the first turn: its template on the item.
    pub fn first_message(&self, item: &TaskItem) -> Result<String> {
        match &self.recipe {
            PromptRecipe::Role { template, .. } => {
                render_template(template, item).with_context(|| format!("agent {} prompt", self.index))
            }
            PromptRecipe::Joint { .. } => bail!("a centralized actor writes every role in one turn"),
        }
    }

    /// A user message as this actor is given it: its system prompt and chat template around it.
    pub fn chat_prompt(&self, user: &str) -> Result<String> {
        let system = match &self.recipe {
            PromptRecipe::Role { system_prompt, .. } => system_prompt.as_deref(),
            PromptRecipe::Joint { .. } => None,
        };
        self.model.tokenizer.format_prompt(self.chat_template, system, user)
    }

    /// The exact text this actor is given for an item: its template(s), then the chat template.
    pub fn prompt_for(&self, item: &TaskItem) -> Result<String> {
        let tok = &self.model.tokenizer;
        match &self.recipe {
            PromptRecipe::Role { template, system_prompt } => {
                let user = render_template(template, item).with_context(|| format!("agent {} prompt", self.index))?;
                tok.format_prompt(self.chat_template, system_prompt.as_deref(), &user)
            }
            PromptRecipe::Joint { templates, system_prompts } => {
                let roles = templates
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        let task = render_template(t, item).with_context(|| format!("agent {i} prompt"))?;
                        Ok(match system_prompts {
                            Some(s) => format!("{}\n{task}", s[i]),
                            None => task,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                tok.format_prompt(self.chat_template, None, &joint_prompt(&roles))
            }
        }
    }
}

/// Refuse, before any work, a task the models cannot hold: an item whose prompt plus the actor's
/// `max_new_tokens[a]` does not fit an actor's context (transformers would index past its position
/// table; pbrl would fail mid-run), or a sampling batch of `rows` requests (`rows_keys` names
/// the keys that set it) whose KV cache would not fit in the memory available on the CPU.
pub fn check_fits(
    team: &[Agent],
    items: &[TaskItem],
    max_new_tokens: &[usize],
    rows: (usize, &str),
    split: &str,
) -> Result<()> {
    for agent in team {
        let max_new_tokens = max_new_tokens[agent.index];
        let config = &agent.model.model.config;
        let context = config.context_length();
        let mut longest = 0;
        for (j, item) in items.iter().enumerate() {
            let n = agent.model.tokenizer.encode(&agent.prompt_for(item)?)?.len();
            if n + max_new_tokens > context {
                bail!(
                    "{split} item {j}: actor {}'s prompt is {n} tokens, and with max_new_tokens = {max_new_tokens} \
                     the sequence would need {} positions, beyond the context of `{}` ({context}); lower \
                     max_new_tokens or shorten the prompt",
                    agent.index,
                    n + max_new_tokens,
                    agent.model.source
                );
            }
            longest = longest.max(n);
        }
        let need = pbrl_model::sampling::sampling_bytes(config, rows.0, longest + max_new_tokens);
        ensure_fits(&agent.device, need, |need, free| {
            format!(
                "{split}: sampling {} rows at once ({}) with max_new_tokens = {max_new_tokens} needs about {need} MiB \
                 for actor {}'s KV cache, more than the {free} MiB of memory available; lower them",
                rows.0, rows.1, agent.index,
            )
        })?;
    }
    Ok(())
}

/// Which weights a team is made of.
#[derive(Debug, Clone, PartialEq)]
pub enum Members {
    /// The run's trained agents when it has them, else the base models (what stages use).
    Current,
    /// The configured base models, whatever the run has trained.
    Base,
    /// A team saved whole in a directory (`agents/` of any run: `agent_i` + `team.json`).
    Saved(std::path::PathBuf),
}

/// Load the run's current team: its trained agents (`<run_dir>/agents/agent_i`, saved whole by
/// `run::team::save_team`) when it has them, else the configured base models.
/// A reference policy per actor: `sources[i]` loaded on `reference_devices[i]`, with actor i's
/// prompts (`what` names the sources in errors).
pub fn load_reference_team(cfg: &TeamConfig, team: &[Agent], sources: &[String], what: &str) -> Result<Vec<Agent>> {
    let devices = DeviceSpec::resolve(cfg.reference_devices.as_ref(), team.len(), "reference_devices")?;
    load_as(team, sources, &devices, frozen_storage(cfg.frozen_dtype), what)
}

/// `model` as the frozen base of the adapters `lora` configures: stored as its `base_dtype`
/// says, its products on bf16 inputs when `compute_dtype` says so.
pub fn lora_base(model: LoadedModel, lora: &AgentLora) -> Result<LoadedModel> {
    let base = model.into_frozen_base(frozen_storage(Some(lora.base_dtype)))?;
    match lora.compute_dtype {
        ComputeDType::F32 => Ok(base),
        ComputeDType::Bf16 => base.compute_in_bf16(),
    }
}

/// How `dtype` (`agent_lora.base_dtype`, `frozen_dtype`; absent: f32) stores frozen weights.
pub fn frozen_storage(dtype: Option<BaseDType>) -> FrozenStorage {
    match dtype {
        None | Some(BaseDType::F32) => FrozenStorage::F32,
        Some(BaseDType::Bf16) => FrozenStorage::Bf16,
        Some(BaseDType::Q8_0) => FrozenStorage::Q8_0,
    }
}

/// The team's actors (index, prompts) played by other models that only read their weights:
/// `sources[i]` on `devices[i]`, stored as `storage` says unless served over a LoRA agent's
/// base in memory (`what` names them in errors).
pub fn load_as(
    team: &[Agent],
    sources: &[String],
    devices: &[String],
    storage: FrozenStorage,
    what: &str,
) -> Result<Vec<Agent>> {
    team.iter()
        .zip(devices)
        .zip(sources)
        .map(|((a, d), source)| {
            let device = parse_device(d, what)?;
            let context = || format!("loading {what} `{source}` for agent {}", a.index);
            let model = match over_shared_base(a, &device, source).with_context(context)? {
                Some(model) => model, // the LoRA agent's base keeps its own storage
                None => LoadedModel::load_frozen(source, &device, storage).with_context(|| match storage {
                    FrozenStorage::F32 => context(),
                    _ => format!("{} with frozen_dtype = {:?}", context(), format!("{storage:?}").to_lowercase()),
                })?,
            };
            crate::run::team::refuse_non_finite(&format!("{what} `{source}`"), &model)?;
            Ok(a.with_model(model, device))
        })
        .collect()
}

/// `source` over the base LoRA agent `a` holds in memory, when `a` is on `device` and `source`
/// is that base (a reference: the agent with its adapters off) or an adapter over it (a
/// comparator's snapshot): no second copy of the base. `None` otherwise.
fn over_shared_base(a: &Agent, device: &Device, source: &str) -> Result<Option<LoadedModel>> {
    let Some(base) = a.model.lora_base() else { return Ok(None) };
    if !a.device.same_device(device) {
        return Ok(None);
    }
    if source == base.source {
        tracing::info!(agent = a.index, %source, "the LoRA agent's base in memory, adapters off");
        return Ok(Some(base));
    }
    let dir = std::path::Path::new(source);
    if !dir.join(pbrl_model::lora::ADAPTER_CONFIG).is_file() {
        return Ok(None);
    }
    let adapter = pbrl_model::lora::LoraAgent::read(dir)?;
    if adapter.base != base.source {
        return Ok(None);
    }
    tracing::info!(agent = a.index, %source, "an adapter over the LoRA agent's base in memory");
    Ok(Some(LoadedModel::adapter_over(&base, source, &adapter.spec)?))
}

pub fn load_team(cfg: &TeamConfig, run_dir: &RunDir) -> Result<Vec<Agent>> {
    load_members(cfg, run_dir, &Members::Current)
}

/// The run's current team to train: its layers checkpointed when `gradient_checkpointing` asks,
/// LoRA agents' adapters with `agent_lora.dropout`.
pub fn load_training_team(cfg: &TeamConfig, run_dir: &RunDir) -> Result<Vec<Agent>> {
    let mut team = load_team(cfg, run_dir)?;
    if cfg.gradient_checkpointing {
        team.iter_mut().for_each(|a| a.model.checkpoint_layers());
    }
    if let Some(lora) = &cfg.agent_lora {
        for a in team.iter_mut() {
            a.model.set_lora_dropout(lora.dropout)?;
        }
    }
    Ok(team)
}

/// Load a team of the given members, each actor on its device with its prompt recipe.
pub fn load_members(cfg: &TeamConfig, run_dir: &RunDir, members: &Members) -> Result<Vec<Agent>> {
    let roles = cfg.num_roles;
    let n = cfg.num_actors;
    let (sources, devices) = (&cfg.sources, &cfg.devices);
    let pick = |v: &[String], i: usize| {
        if v.len() == 1 {
            v[0].clone()
        } else {
            v[i].clone()
        }
    };
    let recipe = |i: usize| match Collaboration::new(cfg.centralized, cfg.role_templates.clone()) {
        Collaboration::Decentralized => PromptRecipe::Role {
            template: pick(&cfg.formatters, i),
            system_prompt: cfg.system_prompts.as_ref().map(|s| pick(s, i)),
        },
        Collaboration::Centralized { templates } => PromptRecipe::Joint {
            templates,
            system_prompts: cfg.system_prompts.as_ref().map(|s| (0..roles).map(|r| pick(s, r)).collect()),
        },
    };
    // A saved team must be whole (a partial one is an error, never filled with base models).
    let trained = match members {
        Members::Current => saved_team(&run_dir.agents(), n)?,
        Members::Base => None,
        Members::Saved(dir) => Some(
            saved_team(dir, n)?
                .with_context(|| format!("{} holds no saved team (no such directory)", dir.display()))?,
        ),
    };
    let template_kwargs = &cfg.chat_template_kwargs;
    // LoRA agents not yet trained: fresh adapters on their base, one base in memory per source
    // and device (its weights shared, never copied).
    // Each agent's adapter shape (one for all, or one each).
    let configured_lora = |i: usize| {
        cfg.agent_lora.as_ref().map(|l| {
            let (r, alpha, target_modules, use_rslora) = l.shape_of(i);
            LoraSpec { r, alpha, target_modules, use_rslora }
        })
    };
    let fresh_lora = matches!((members, &trained), (Members::Current, None));
    let mut bases: Vec<((String, String), LoadedModel)> = Vec::new();
    (0..n)
        .map(|i| {
            let device = parse_device(&devices[i], &format!("agent_devices[{i}]"))?;
            let source = match &trained {
                Some(dirs) => dirs[i].display().to_string(),
                None => sources[i].clone(),
            };
            tracing::info!(agent = i, %source, "loading agent");
            let load = |source: &str| -> Result<LoadedModel> {
                let model =
                    LoadedModel::load(source, &device).with_context(|| format!("loading agent {i} from `{source}`"))?;
                crate::run::team::refuse_non_finite(&format!("agent {i} from `{source}`"), &model)?;
                Ok(model)
            };
            // A LoRA agent's base: loaded once per source and device, stored as `base_dtype`
            // says, then shared.
            let base_of = |bases: &mut Vec<((String, String), LoadedModel)>, base: &str| -> Result<usize> {
                let key = (base.to_string(), devices[i].clone());
                if let Some(k) = bases.iter().position(|(k, _)| *k == key) {
                    return Ok(k);
                }
                // `into_frozen_base` refuses a non-finite weight itself: the base is scanned once.
                let lora = cfg.agent_lora.clone().unwrap_or_default();
                let loaded = LoadedModel::load(base, &device)
                    .and_then(|m| lora_base(m, &lora))
                    .with_context(|| format!("loading agent {i}'s base `{base}`"))?;
                bases.push((key, loaded));
                Ok(bases.len() - 1)
            };
            let saved_adapter = std::path::Path::new(&source).join(pbrl_model::lora::ADAPTER_CONFIG).is_file();
            let configured_lora = configured_lora(i);
            let mut model = match configured_lora.as_ref().filter(|_| fresh_lora) {
                Some(spec) => {
                    let seed = derive_seed(cfg.seed, &[purpose::LORA_INIT, i as u64]);
                    let k = base_of(&mut bases, &source)?;
                    LoadedModel::with_lora(&bases[k].1, spec, seed)?
                }
                None if saved_adapter => {
                    let agent = pbrl_model::lora::LoraAgent::read(std::path::Path::new(&source))?;
                    let k = base_of(&mut bases, &agent.base)?;
                    let m = LoadedModel::adapter_over(&bases[k].1, &source, &agent.spec)?;
                    crate::run::team::refuse_non_finite(&format!("agent {i} from `{source}`"), &m)?;
                    m
                }
                None => load(&source)?,
            };
            // The run's own team continues as the config says: full models, or adapters of the
            // configured shape (never silently the other kind).
            if matches!(members, Members::Current) && model.lora.as_ref().map(|l| &l.spec) != configured_lora.as_ref() {
                bail!(
                    "agent {i} in `{source}` is {}, but the config asks for {}; train in a new run directory",
                    model.lora.as_ref().map_or("a whole model".into(), |l| format!("a LoRA adapter ({:?})", l.spec)),
                    configured_lora
                        .as_ref()
                        .map_or("whole models (no [agent_lora])".into(), |l| format!("LoRA agents ({l:?})")),
                );
            }
            model.tokenizer.template_kwargs = template_kwargs.clone();
            Ok(Agent { index: i, model, device, recipe: recipe(i), chat_template: cfg.chat_template })
        })
        .collect()
}
