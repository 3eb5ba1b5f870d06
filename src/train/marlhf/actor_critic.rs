//! MARLHF's actor-critic backends (reference §7.4): `iac` (a critic per agent, or
//! with `use_separate_critic = false` a value head on each actor) and `maac` (one centralized
//! critic of the joint prompt, or with `critic_type = "q"` of the joint prompt and response).
//!
//! 1. the critics: a fresh value head (N(0, 0.02), bias 0) on `critic_model_name` (default:
//!    each agent's own source; `maac`: the first agent's) on `critic_devices`, or on the actor;
//!    one AdamW per critic at `critic_learning_rate` (default `agent_learning_rate`);
//! 2. a buffer is the items whose `num_generations` samples per agent reach
//!    `rollout_buffer_size` samples (the reference drains an agent's buffer once an item's
//!    samples take it there); per buffer: the rollouts, the reward model's score of each joint
//!    response (no gradients), the reference KLs, and each sample's value under its critic
//!    before any update (V_old);
//! 3. per agent: return R = score − c·KL, advantage R − V_old normalized over the agent's
//!    buffer; its samples shuffled (seeded) and cut into chunks of `train_batch_size` samples;
//!    per chunk: actor loss mean −A · log π(response), value loss mean (R − V)² (clipped
//!    around V_old by `value_clip_range` for `iac`'s shared head only, as the reference does);
//!    separate critics: an actor step, then a critic step on `value_loss_coef` × value loss;
//!    shared head: one step on their sum;
//! 4. metrics, periodic evaluations with the task reward, the agents saved (value heads left
//!    out: an exported agent is its language model only). Critics live in the checkpoints.
//!
//! V is the value head on the final hidden state at the last token of: `iac` "v" the agent's
//! prompt, "q" its prompt and response; `maac` "v" the text `[Agent i] prompt_i` of all agents
//! (from 0, joined by blank lines), "q" that followed by `[Joint Action]` and each
//! `[Agent i action]\nresponse_i`, tokenized with the critic's tokenizer.
use anyhow::{bail, Context, Result};
use candle_core::Tensor;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use super::setup::{abs_mean, mean, rollout_pad, ScoredRollout, Setup};
use super::TrainOptions;
use crate::algo::actor_critic::{actor_loss, buffer_advantages, value_loss};
use crate::config::{MarlhfBackend, MarlhfConfig};
use crate::device::parse_device;
use crate::rng::{derive_seed, purpose};
use crate::run::fingerprint::source_digest;
use crate::run::RunDir;
use crate::team::rollout::Rollout;
use crate::team::Agent;
use crate::train::session::{all_weights, Plan, Session, SessionSetup, TrainingData, TrainingSummary};
use pbrl_model::heads::ValueHead;
use pbrl_model::scoring::{sequence_log_probs, LastToken, ScoreRow};
use pbrl_model::{LoadedModel, Mode};

/// The value heads' prefix in their model's `VarMap`.
pub const VALUE_HEAD: &str = "value_head";

/// Rows per no-gradient critic forward pass.
const VALUE_BATCH: usize = 8;

/// Items per buffer: the fewest whose samples reach `rollout_buffer_size`.
pub fn items_per_buffer(cfg: &MarlhfConfig) -> usize {
    cfg.rollout_buffer_size.div_ceil(cfg.num_generations).max(1)
}

/// A critic model with its value head (in the model's `VarMap`).
pub struct Critic {
    pub model: LoadedModel,
    pub head: ValueHead,
}

/// Where the values come from.
enum Critics {
    /// `iac`: one critic model per agent, reading the agent's own tokens.
    PerAgent(Vec<Critic>),
    /// `iac` with `use_separate_critic = false`: a value head on each actor.
    Shared(Vec<ValueHead>),
    /// `maac`: one critic of the joint text.
    Central(Box<Critic>),
}

/// One sample of an agent's buffer.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The agent's prompt and response (to the first pad token, as the reference cuts it).
    pub row: ScoreRow,
    /// What the critic reads.
    pub critic_row: Vec<u32>,
    /// The KL-shaped return (the value target).
    pub target: f64,
    /// The critic's value at rollout time.
    pub old_value: f64,
}

/// The values of token rows under a critic, without gradients.
pub fn values_without_grad(model: &LoadedModel, head: &ValueHead, rows: &[Vec<u32>]) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(rows.len());
    for part in rows.chunks(VALUE_BATCH) {
        let v = head.values(model, part, Mode::Infer)?.detach();
        out.extend(v.to_dtype(candle_core::DType::F64)?.to_vec1::<f64>()?);
    }
    Ok(out)
}

/// One chunk's losses: the actor's, mean −A · log π(response), and the critic's,
/// `coef` × mean (R − V)² (clipped around V_old by `clip` when given), V from `head` on `critic`
/// (with gradients; the actor itself for a shared head).
pub fn chunk_losses(
    actor: &LoadedModel,
    critic: (&LoadedModel, &ValueHead),
    chunk: &[&Sample],
    advantages: &[f64],
    clip: Option<f64>,
    coef: f64,
) -> Result<(Tensor, Tensor)> {
    let rows: Vec<ScoreRow> = chunk.iter().map(|s| s.row.clone()).collect();
    let lp = sequence_log_probs(&actor.model, &rows, LastToken::Include, actor.tokenizer.pad_id, Mode::Train)?;
    let actor_loss = actor_loss(&lp, advantages)?;
    let critic_rows: Vec<Vec<u32>> = chunk.iter().map(|s| s.critic_row.clone()).collect();
    let values = critic.1.values(critic.0, &critic_rows, Mode::Train)?;
    let targets: Vec<f64> = chunk.iter().map(|s| s.target).collect();
    let olds: Vec<f64> = chunk.iter().map(|s| s.old_value).collect();
    let critic_loss = (value_loss(&values, &targets, &olds, clip)? * coef)?;
    Ok((actor_loss, critic_loss))
}

pub(super) fn train(
    cfg: &MarlhfConfig,
    run_dir: &RunDir,
    setup: &Setup,
    opts: &TrainOptions,
) -> Result<TrainingSummary> {
    let team = &setup.team;
    let n = team.len();
    let critics = build_critics(cfg, team)?;
    let critic_lr = cfg.critic.learning_rate;
    let critic_models: Vec<&LoadedModel> = match &critics {
        Critics::PerAgent(c) => c.iter().map(|c| &c.model).collect(),
        Critics::Shared(_) => Vec::new(),
        Critics::Central(c) => vec![&c.model],
    };
    // The critics' sources, for the fingerprint (their settings are config keys).
    let mut fingerprint_extra = setup.reward.fingerprint();
    for (i, m) in critic_models.iter().enumerate() {
        fingerprint_extra.push((format!("critic {i} model"), source_digest(&m.source)?));
    }
    let mut models: Vec<&LoadedModel> = team.iter().map(|a| &a.model).collect();
    models.extend(&critic_models);
    let mut learning_rates = vec![cfg.learning_rate; n];
    learning_rates.extend(vec![critic_lr; critic_models.len()]);
    let plan = Plan {
        stage: "train-marlhf",
        params: models.iter().map(|m| all_weights(m)).collect(),
        models,
        learning_rates,
        epochs: cfg.num_train_epochs,
        state_dir: run_dir.marlhf_state(),
        shuffle: None,
        fingerprint_extra,
    };
    let data = TrainingData { rounds: &[], num_examples: setup.items.len() };
    let session_setup = SessionSetup::of(&cfg.training, data.rounds, &cfg.team.sources, Some(team))?;
    let mut session = Session::open_plan(session_setup, run_dir, plan, Some(team), data, opts.resume)?;
    let chunk_samples = cfg.pairs_per_update.max(1);
    let clip = match &critics {
        Critics::Shared(_) => cfg.critic.value_clip_range,
        _ => None,
    };

    session.run(setup.items.len(), items_per_buffer(cfg), |step, chunk, metrics| {
        let epoch = step.epoch;
        let ScoredRollout { out, returns, kls } =
            setup.scored_rollout(cfg, (epoch, chunk), step.tokens, true, metrics)?;
        // Every agent's samples and their values, before any update of this buffer.
        let mut buffers = Vec::with_capacity(n);
        for agent in team {
            let a = agent.index;
            let mut samples = Vec::new();
            for (j, responses) in out.responses.iter().enumerate() {
                for (s, joint) in responses.iter().enumerate() {
                    let ids = &joint[a].ids;
                    let len = ids.iter().position(|&t| t == rollout_pad(agent)).unwrap_or(ids.len());
                    let row = ScoreRow { prompt: out.prompt_ids[j][a].clone(), completion: ids[..len].to_vec() };
                    let kl = cfg.reference_kl.map_or(0.0, |coef| coef * kls[a][j][s]);
                    let critic_row = critic_input(cfg.critic.q_critic, &critics, &out, &row, j, s)?;
                    samples.push(Sample { row, critic_row, target: returns[j][s] - kl, old_value: 0.0 });
                }
            }
            let (model, head) = value_model(&critics, team, a);
            let rows: Vec<Vec<u32>> = samples.iter().map(|s| s.critic_row.clone()).collect();
            let old = values_without_grad(model, head, &rows)?;
            if let Some(bad) = old.iter().find(|v| !v.is_finite()) {
                bail!("agent {a}'s critic gave the value {bad}: not usable");
            }
            for (s, v) in samples.iter_mut().zip(old) {
                s.old_value = v;
            }
            buffers.push(samples);
        }
        for (a, samples) in buffers.iter().enumerate() {
            let agent = &team[a];
            let targets: Vec<f64> = samples.iter().map(|s| s.target).collect();
            let olds: Vec<f64> = samples.iter().map(|s| s.old_value).collect();
            let advantages = buffer_advantages(&targets, &olds, cfg.advantage_normalization);
            metrics[format!("marlhf/value_mean/agent_{a}")] = json!(mean(&olds));
            metrics[format!("marlhf/advantage_abs_mean/agent_{a}")] = json!(abs_mean(&advantages));
            let mut order: Vec<usize> = (0..samples.len()).collect();
            order.shuffle(&mut ChaCha8Rng::seed_from_u64(derive_seed(
                cfg.seed,
                &[purpose::RL_BUFFER, epoch, step.progress.updates, a as u64],
            )));
            let (mut actor_losses, mut value_losses) = (Vec::new(), Vec::new());
            for part in order.chunks(chunk_samples) {
                let chunk: Vec<&Sample> = part.iter().map(|&i| &samples[i]).collect();
                let adv: Vec<f64> = part.iter().map(|&i| advantages[i]).collect();
                let critic_model = value_model(&critics, team, a);
                let (actor, critic) =
                    chunk_losses(&agent.model, critic_model, &chunk, &adv, clip, cfg.critic.value_loss_coef)?;
                match critic_index(&critics, n, a) {
                    Some(c) => {
                        // The actor's step, then the critic's, on their own losses.
                        if let Some((l, g)) = step.apply(a, actor, || {})? {
                            actor_losses.push(l);
                            metrics[format!("marlhf/grad_norm/agent_{a}")] = json!(g);
                        }
                        if let Some((l, g)) = step.apply(c, critic, || {})? {
                            value_losses.push(l);
                            metrics[format!("marlhf/critic_grad_norm/agent_{a}")] = json!(g);
                        }
                    }
                    None => {
                        // One step on the sum; the parts' values are logged apart.
                        let (la, lv) = (scalar(&actor)?, scalar(&critic)?);
                        if let Some((_, g)) = step.apply(a, (actor + critic)?, || {})? {
                            actor_losses.push(la);
                            value_losses.push(lv);
                            metrics[format!("marlhf/grad_norm/agent_{a}")] = json!(g);
                        }
                    }
                }
            }
            if !actor_losses.is_empty() {
                metrics[format!("marlhf/loss/agent_{a}")] = json!(mean(&actor_losses));
            }
            if !value_losses.is_empty() {
                metrics[format!("marlhf/value_loss/agent_{a}")] = json!(mean(&value_losses));
            }
        }
        metrics["marlhf/skipped_nonfinite"] = json!(step.progress.skipped_nonfinite.iter().sum::<u64>());
        Ok(())
    })?;
    session.finish()
}

fn scalar(t: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(candle_core::DType::F64)?.to_scalar::<f64>()?)
}

/// The model and head that value agent `a`'s samples.
fn value_model<'c>(critics: &'c Critics, team: &'c [Agent], a: usize) -> (&'c LoadedModel, &'c ValueHead) {
    match critics {
        Critics::PerAgent(c) => (&c[a].model, &c[a].head),
        Critics::Shared(heads) => (&team[a].model, &heads[a]),
        Critics::Central(c) => (&c.model, &c.head),
    }
}

/// The session's index of agent `a`'s critic (after the `n` agents); `None` for a shared head,
/// which the actor's own optimizer updates.
fn critic_index(critics: &Critics, n: usize, a: usize) -> Option<usize> {
    match critics {
        Critics::PerAgent(_) => Some(n + a),
        Critics::Shared(_) => None,
        Critics::Central(_) => Some(n),
    }
}

/// What the critic reads for sample `s` of item `j` (`row`: the agent's prompt and response).
fn critic_input(q: bool, critics: &Critics, out: &Rollout, row: &ScoreRow, j: usize, s: usize) -> Result<Vec<u32>> {
    match critics {
        Critics::PerAgent(_) | Critics::Shared(_) => {
            let mut ids = row.prompt.clone();
            if q {
                ids.extend(&row.completion);
            }
            Ok(ids)
        }
        Critics::Central(c) => {
            let actions = q.then(|| out.texts(j, s));
            let text = maac_critic_text(&out.prompts[j], actions.as_deref());
            let mut ids = c.model.tokenizer.encode_with_special_tokens(&text)?;
            ids.truncate(c.model.model.config.context_length());
            Ok(ids)
        }
    }
}

/// `maac`'s critic input (the reference's `_build_critic_input`): every agent's prompt, and for a
/// Q critic the joint action.
pub fn maac_critic_text(prompts: &[String], actions: Option<&[String]>) -> String {
    let text = prompts.iter().enumerate().map(|(i, p)| format!("[Agent {i}] {p}")).collect::<Vec<_>>().join("\n\n");
    match actions {
        None => text,
        Some(actions) => {
            let mut parts = vec!["[Joint Action]".to_string()];
            parts.extend(actions.iter().enumerate().map(|(i, c)| format!("[Agent {i} action]\n{c}")));
            format!("{text}\n\n{}", parts.join("\n\n"))
        }
    }
}

/// The critics the config asks for, each value head drawn from its own seeded stream.
fn build_critics(cfg: &MarlhfConfig, team: &[Agent]) -> Result<Critics> {
    let n = team.len();
    let rng = |i: usize| ChaCha8Rng::seed_from_u64(derive_seed(cfg.seed, &[purpose::VALUE_HEAD, i as u64]));
    let (sources, devices, settings) = (&cfg.team.sources, &cfg.critic.devices, &cfg.critic);
    let load = |i: usize, source: &str, hidden_dim: Option<usize>, rng: &mut ChaCha8Rng| -> Result<Critic> {
        let device = parse_device(&devices[i], &format!("critic_devices[{i}]"))?;
        let mut model =
            LoadedModel::load_backbone(source, &device).with_context(|| format!("loading critic {i} `{source}`"))?;
        let hidden = model.model.config.hidden_size;
        let head = ValueHead::init(&model.varmap, VALUE_HEAD, hidden, hidden_dim, rng, &device)?;
        // A critic trains its whole backbone, as the actors do: checkpointed the same way.
        if cfg.team.gradient_checkpointing {
            model.checkpoint_layers();
        }
        Ok(Critic { model, head })
    };
    Ok(match cfg.backend {
        MarlhfBackend::Iac { separate: true } => {
            let mut critics = Vec::with_capacity(n);
            for (i, agent) in team.iter().enumerate() {
                let source = settings.model.clone().unwrap_or_else(|| sources[i].clone());
                let critic = load(i, &source, settings.critic_head_hidden, &mut rng(i))?;
                same_tokens(agent, &critic.model)?;
                critics.push(critic);
            }
            Critics::PerAgent(critics)
        }
        MarlhfBackend::Iac { separate: false } => {
            if settings.model.is_some() {
                bail!("critic_model_name is set but use_separate_critic = false puts the value head on each actor");
            }
            let mut heads = Vec::with_capacity(n);
            for (i, agent) in team.iter().enumerate() {
                let m = &agent.model;
                let hidden = m.model.config.hidden_size;
                heads.push(ValueHead::init(
                    &m.varmap,
                    VALUE_HEAD,
                    hidden,
                    settings.value_head_hidden,
                    &mut rng(i),
                    &agent.device,
                )?);
            }
            Critics::Shared(heads)
        }
        MarlhfBackend::Maac => {
            let source = settings.model.clone().unwrap_or_else(|| sources[0].clone());
            Critics::Central(Box::new(load(0, &source, settings.critic_head_hidden, &mut rng(0))?))
        }
        MarlhfBackend::PolicyGradient(_) => {
            bail!("rl_algorithm = \"{}\" is not an actor-critic backend", cfg.algorithm)
        }
    })
}

/// An `iac` critic reads its agent's token ids, so it must share the agent's tokenizer.
fn same_tokens(agent: &Agent, critic: &LoadedModel) -> Result<()> {
    let probe = "Agent prompt: check the critic's tokenizer.";
    let (a, c) = (agent.model.tokenizer.encode(probe)?, critic.tokenizer.encode(probe)?);
    if a != c || agent.model.model.config.vocab_size != critic.model.config.vocab_size {
        bail!(
            "critic `{}` does not share agent {}'s tokenizer (`{}`), and an iac critic reads the agent's tokens; \
             choose a critic_model_name of the same tokenizer",
            critic.source,
            agent.index,
            agent.model.source
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_maac_critic_reads_the_reference_text() {
        let p = vec!["write".to_string(), "expand".to_string()];
        assert_eq!(maac_critic_text(&p, None), "[Agent 0] write\n\n[Agent 1] expand");
        let a = vec!["short".to_string(), "long".to_string()];
        assert_eq!(
            maac_critic_text(&p, Some(&a)),
            "[Agent 0] write\n\n[Agent 1] expand\n\n[Joint Action]\n\n[Agent 0 action]\nshort\n\n[Agent 1 action]\nlong"
        );
        let cfg = crate::config::Config {
            rollout_buffer_size: 5,
            num_generations: 2,
            agent_model: Some("m".into()),
            ..Default::default()
        };
        assert_eq!(items_per_buffer(&cfg.marlhf().unwrap()), 3);
    }
}
