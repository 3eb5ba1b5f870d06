//! The loop every trainer shares. A stage opens a [`Session`] on its team (or, through a
//! [`Plan`], on any models, as `fit-rm` does on its reward model) and data, then hands it one
//! closure that turns a batch of example indices into losses; the session does the rest:
//!
//! 1. one AdamW per model (PyTorch defaults, the given learning rate) over the weights it trains;
//! 2. the run's fingerprint (config, round files, model sources); with `--resume`, the newest
//!    checkpoint if its fingerprint matches and its run did not finish, else a fresh start
//!    (which never discards an unfinished run's checkpoints);
//! 3. per epoch, the examples shuffled with the run's training stream, cut into batches; before
//!    a batch, an evaluation when `updates % eval_interval == 0`; after it, a metrics line;
//! 4. a checkpoint every `checkpoint_interval` epochs; at the end, one more evaluation (of the
//!    final agents), the team saved whole (with `keep_best`: the agents of the best evaluation,
//!    kept in `best_agents/` as they were found), `training_summary.json`, a plot of the run's
//!    metrics (`training_plot.svg`), and the run marked finished.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Tensor, Var};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use super::optim::{AdamW, AdamWConfig};
use super::summary::keeps_best;
use crate::config::{SessionConfig, TrainingConfig};
use crate::evaluation::{evaluate, periodic_eval, PeriodicEval};
use crate::progress;
use crate::rng::{derive_seed, purpose};
use crate::run::checkpoint::{self, EvalPoint, Progress};
use crate::run::fingerprint::Fingerprint;
use crate::run::team::{copy_team, save_merged_team, save_team, save_team_to};
use crate::run::RunDir;
use crate::team::Agent;
use pbrl_model::LoadedModel;

/// What a training phase learns from: the rounds (their files are fingerprinted) and how many
/// examples they hold.
pub struct TrainingData<'a> {
    pub rounds: &'a [(u32, &'a Path)],
    pub num_examples: usize,
}

/// The mutable state a batch step works on.
pub struct Step<'s> {
    pub optims: &'s mut [AdamW],
    pub progress: &'s mut Progress,
    /// The epoch this batch belongs to (from 1).
    pub epoch: u64,
    /// Tokens the batch computed on (for `tokens_per_s`); the step adds its own.
    pub tokens: &'s mut usize,
    /// Seconds this batch spent in backward passes and in AdamW (all agents together).
    pub times: PhaseTimes,
}

/// Where an update's time went, logged as `time/*`: the backward passes and the AdamW steps
/// are timed in [`Step::apply`]; the rest of `time/update_s` is the stage's own work (forward
/// passes, and rollouts for RL).
#[derive(Debug, Default, Clone, Copy)]
pub struct PhaseTimes {
    pub backward_s: f64,
    pub optimizer_s: f64,
}

impl Step<'_> {
    /// Backward and AdamW step of actor `i` on `loss`; a non-finite loss skips the update (with a
    /// warning and a count). Returns the loss value and gradient norm when the step was taken.
    pub fn apply(&mut self, i: usize, loss: Tensor, keep_alive: impl FnOnce()) -> Result<Option<(f64, f64)>> {
        let value = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        if !value.is_finite() {
            tracing::warn!(agent = i, update = self.progress.updates, "non-finite loss; update skipped");
            self.progress.skipped_nonfinite[i] += 1;
            return Ok(None);
        }
        let backward = std::time::Instant::now();
        let grads = pbrl_model::weight_grads::backward(&loss).with_context(|| format!("agent {i}: backward pass"))?;
        drop(loss);
        keep_alive(); // free the activations before the optimizer touches its moments
        self.times.backward_s += backward.elapsed().as_secs_f64();
        let adamw = std::time::Instant::now();
        let grad_norm = self.optims[i].step(&grads).with_context(|| format!("agent {i}: AdamW update"))?;
        self.times.optimizer_s += adamw.elapsed().as_secs_f64();
        self.progress.optimizer_steps[i] = self.optims[i].step;
        Ok(Some((value, grad_norm)))
    }
}

/// What a session takes from the run's config, built once by its trainer: its own settings,
/// the fingerprint a resume must match, and the periodic evaluation of the team.
pub struct SessionSetup {
    pub config: SessionConfig,
    /// The config's, the round files' and the models' sources' (a [`Plan`]'s extras are added).
    pub fingerprint: Fingerprint,
    pub eval: Option<PeriodicEval>,
}

impl SessionSetup {
    /// The setup of a training on `rounds` of models from `sources`; the periodic evaluation
    /// when there is a team to evaluate and `eval_interval` asks for it.
    pub fn of(
        cfg: &TrainingConfig,
        rounds: &[(u32, &Path)],
        sources: &[String],
        team: Option<&[Agent]>,
    ) -> Result<Self> {
        let numbers: Vec<u32> = rounds.iter().map(|(r, _)| *r).collect();
        let eval = match team {
            Some(team) if cfg.session.eval_interval > 0 => periodic_eval(&cfg.evaluation, team, &numbers)?,
            _ => None,
        };
        let fingerprint = Fingerprint::of_training(&cfg.fingerprint, rounds, sources)?;
        Ok(Self { config: cfg.session.clone(), fingerprint, eval })
    }
}

pub use super::summary::TrainingSummary;

/// The sizes of a session's batches: one size, or what a function of the examples left in the
/// epoch gives before each batch.
pub enum Batches<'f> {
    Fixed(usize),
    Dynamic(&'f mut dyn FnMut(usize) -> usize),
}

pub struct Session<'a> {
    config: SessionConfig,
    run_dir: &'a RunDir,
    stage: &'static str,
    /// The agents, when the session trains them (evaluated, saved at the end).
    team: Option<&'a [Agent]>,
    models: Vec<&'a LoadedModel>,
    epochs: u64,
    state_dir: PathBuf,
    shuffle: bool,
    optims: Vec<AdamW>,
    /// Each optimizer's configured learning rate, before `lr_scheduler_type`.
    learning_rates: Vec<f64>,
    pub progress: Progress,
    rng: ChaCha8Rng,
    eval: Option<PeriodicEval>,
    /// The newest periodic evaluation.
    last_eval: Option<EvalPoint>,
}

/// What a session trains and how: the models (the team's agents first, when it trains a team;
/// then any others, such as critics), with the weights each one's optimizer updates, their
/// learning rates, the epochs, where checkpoints and the summary go, and the random stream that
/// shuffles the examples.
pub struct Plan<'a> {
    pub stage: &'static str,
    pub models: Vec<&'a LoadedModel>,
    pub params: Vec<Vec<(String, Var)>>,
    /// Each model's learning rate.
    pub learning_rates: Vec<f64>,
    pub epochs: u64,
    /// Holds `checkpoints/`, `training_summary.json` and `training_plot.svg`.
    pub state_dir: PathBuf,
    /// Shuffle the examples every epoch with this random stream, or keep them in order (`None`).
    pub shuffle: Option<u64>,
    /// More inputs the result depends on, as (name, digest), for the fingerprint.
    pub fingerprint_extra: Vec<(String, String)>,
}

impl<'a> Session<'a> {
    /// A session on the team: every weight trained at `learning_rate` for `num_train_epochs`,
    /// with the periodic evaluation and keep-best, the state in the run directory itself.
    pub fn open(
        setup: SessionSetup,
        run_dir: &'a RunDir,
        stage: &'static str,
        team: &'a [Agent],
        data: TrainingData,
        learning_rate: f64,
        resume: bool,
    ) -> Result<Self> {
        let plan = Plan {
            stage,
            models: team.iter().map(|a| &a.model).collect(),
            params: team.iter().map(|a| all_weights(&a.model)).collect(),
            learning_rates: vec![learning_rate; team.len()],
            epochs: setup.config.num_train_epochs,
            state_dir: run_dir.root.clone(),
            shuffle: Some(purpose::TRAIN),
            fingerprint_extra: Vec::new(),
        };
        Self::open_plan(setup, run_dir, plan, Some(team), data, resume)
    }

    /// A session on any models (`team`: the agents, for the periodic evaluation and for saving
    /// them at the end; `None` for a reward model, which its stage saves itself).
    pub fn open_plan(
        setup: SessionSetup,
        run_dir: &'a RunDir,
        plan: Plan<'a>,
        team: Option<&'a [Agent]>,
        data: TrainingData,
        resume: bool,
    ) -> Result<Self> {
        let SessionSetup { config, mut fingerprint, eval } = setup;
        let n = plan.models.len();
        if plan.learning_rates.len() != n || plan.params.len() != n {
            bail!("a training plan needs one learning rate and one weight list per model");
        }
        if team.is_some_and(|t| t.len() > n) {
            bail!("a training plan must train every agent of its team");
        }
        let mut optims = plan
            .params
            .into_iter()
            .zip(&plan.learning_rates)
            .enumerate()
            .map(|(i, (params, &lr))| {
                AdamW::new(params, AdamWConfig::torch_defaults(lr))
                    .with_context(|| format!("model {i}: allocating the AdamW state"))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(config.seed, &[plan.shuffle.unwrap_or(purpose::TRAIN)]));
        let rounds: Vec<u32> = data.rounds.iter().map(|(r, _)| *r).collect();
        fingerprint.0.extend(plan.fingerprint_extra);
        let mut progress = Progress {
            kind: plan.stage.into(),
            epoch: 0,
            updates: 0,
            rng_word_pos: 0,
            optimizer_steps: vec![0; n],
            skipped_nonfinite: vec![0; n],
            rounds: rounds.clone(),
            num_pairs: data.num_examples,
            num_train_epochs: plan.epochs,
            fingerprint,
            best: None,
        };
        let state_dir = plan.state_dir;
        if resume {
            progress = checkpoint::resume(&state_dir, &plan.models, &mut optims, progress)?;
            rng.set_word_pos(progress.rng_word_pos);
        } else {
            checkpoint::start_fresh(&state_dir)?;
            if team.is_some() {
                for old in [run_dir.best_agents(), run_dir.final_agents()] {
                    if old.exists() {
                        std::fs::remove_dir_all(&old)
                            .with_context(|| format!("removing the last run's {}", old.display()))?;
                    }
                }
            }
        }
        // Where this run's metrics start, for the plot (a resumed run continues its lines).
        run_dir.log_metrics(&json!({"stage": plan.stage, "event": if resume { "resume" } else { "start" },
            "update": progress.updates}))?;
        Ok(Self {
            config,
            run_dir,
            stage: plan.stage,
            team,
            models: plan.models,
            epochs: plan.epochs,
            state_dir,
            shuffle: plan.shuffle.is_some(),
            optims,
            learning_rates: plan.learning_rates,
            progress,
            rng,
            eval,
            last_eval: None,
        })
    }

    pub fn models(&self) -> Vec<&'a LoadedModel> {
        self.models.clone()
    }

    /// The team's agents among the models (the first ones; none without a team).
    fn team_models(&self) -> Vec<&'a LoadedModel> {
        self.models[..self.team.map_or(0, <[Agent]>::len)].to_vec()
    }

    /// Every remaining epoch over `num_examples` shuffled examples in batches of `batch_size`;
    /// `step` adds the batch's metrics to the line the session logs.
    pub fn run(
        &mut self,
        num_examples: usize,
        batch_size: usize,
        step: impl FnMut(&mut Step, &[usize], &mut Value) -> Result<()>,
    ) -> Result<()> {
        self.run_batches(num_examples, Batches::Fixed(batch_size), step)
    }

    /// [`Session::run`] with batches whose sizes `next_size` gives from the examples left in the
    /// epoch (multi-turn RL: as many items as fit before a rollout buffer drains). The learning
    /// rate's schedule then follows the share of the examples done, as it follows the updates
    /// done for batches of one size.
    pub fn run_batches(
        &mut self,
        num_examples: usize,
        mut sizes: Batches,
        mut step: impl FnMut(&mut Step, &[usize], &mut Value) -> Result<()>,
    ) -> Result<()> {
        let epochs = self.epochs;
        // Batches of one size: the updates are known (`batches` per epoch); else the examples.
        let (sized, fixed) = match sizes {
            Batches::Fixed(b) => (true, b),
            Batches::Dynamic(_) => (false, 0),
        };
        let batches = if sized { num_examples.div_ceil(fixed) as u64 } else { num_examples as u64 };
        let bar = progress::bar((epochs - self.progress.epoch.min(epochs)) * batches, self.stage);
        let (started, first_update) = (std::time::Instant::now(), self.progress.updates);
        let (mut tokens, mut examples_done) = (0usize, 0usize);
        let salt = stage_salt(self.stage, &self.progress.rounds);
        for epoch in self.progress.epoch..epochs {
            let mut order: Vec<usize> = (0..num_examples).collect();
            if self.shuffle {
                order.shuffle(&mut self.rng);
            }
            let mut at = 0;
            while at < num_examples {
                let size = match &mut sizes {
                    Batches::Fixed(b) => *b,
                    Batches::Dynamic(next) => next(num_examples - at).max(1),
                };
                let chunk = &order[at..(at + size).min(num_examples)];
                self.maybe_evaluate()?;
                let mut metrics = json!({"stage": self.stage, "epoch": epoch + 1, "update": self.progress.updates + 1});
                let factor = match sized {
                    true => self.config.lr_schedule.factor(self.progress.updates, epochs * batches),
                    false => self.config.lr_schedule.factor(epoch * num_examples as u64 + at as u64, epochs * batches),
                };
                for (optim, lr) in self.optims.iter_mut().zip(&self.learning_rates) {
                    optim.config.lr = lr * factor;
                }
                if !self.config.lr_schedule.is_constant() {
                    metrics["lr_factor"] = json!(factor);
                }
                // The update's adapter-dropout masks: a function of the seed, the stage, the
                // rounds it trains on, the model and the update (`model::dropout`).
                for (i, m) in self.models.iter().enumerate() {
                    let path = [purpose::LORA_DROPOUT, salt, i as u64, self.progress.updates];
                    m.model.begin_dropout_step(derive_seed(self.config.seed, &path));
                }
                let progress = &mut self.progress;
                let update_started = std::time::Instant::now();
                let mut ctx = Step {
                    optims: &mut self.optims,
                    progress,
                    epoch: epoch + 1,
                    tokens: &mut tokens,
                    times: PhaseTimes::default(),
                };
                step(&mut ctx, chunk, &mut metrics)?;
                let times = ctx.times;
                metrics["time/update_s"] = json!(update_started.elapsed().as_secs_f64());
                metrics["time/backward_s"] = json!(times.backward_s);
                metrics["time/optimizer_s"] = json!(times.optimizer_s);
                self.progress.updates += 1;
                examples_done += chunk.len();
                let secs = started.elapsed().as_secs_f64();
                metrics["pairs_per_s"] = match sized {
                    true => json!((self.progress.updates - first_update) as f64 * fixed as f64 / secs),
                    false => json!(examples_done as f64 / secs),
                };
                metrics["tokens_per_s"] = json!(tokens as f64 / secs);
                self.run_dir.log_metrics(&metrics)?;
                let loss = metrics.as_object().and_then(|m| m.iter().find(|(k, _)| k.ends_with("/loss")));
                if let Some(loss) = loss.and_then(|(_, v)| v.as_f64()) {
                    bar.set_message(format!("loss {loss:.4}"));
                }
                bar.inc(if sized { 1 } else { chunk.len() as u64 });
                at += chunk.len();
            }
            self.progress.epoch = epoch + 1;
            self.progress.rng_word_pos = self.rng.get_word_pos();
            let interval = self.config.checkpoint_interval;
            if interval > 0 && self.progress.epoch.is_multiple_of(interval) {
                let limit = self.config.checkpoint_total_limit;
                let models = self.models();
                checkpoint::save(&self.state_dir, self.progress.epoch, &models, &self.optims, &self.progress, limit)?;
            }
        }
        bar.finish_and_clear();
        // The final agents are evaluated too (unless that evaluation just ran).
        if self.eval.is_some() && self.last_eval.is_none_or(|l| l.update != self.progress.updates) {
            self.evaluate_now()?;
        }
        Ok(())
    }

    /// The periodic evaluation, before the updates where `updates % eval_interval == 0`.
    fn maybe_evaluate(&mut self) -> Result<()> {
        if self.eval.is_some() && self.progress.updates.is_multiple_of(self.config.eval_interval) {
            self.evaluate_now()?;
        }
        Ok(())
    }

    /// Evaluate the agents as they are now, log it, and with `keep_best` keep them when they
    /// beat the best so far (strictly: a tie keeps the earlier, less trained agents).
    fn evaluate_now(&mut self) -> Result<()> {
        let (Some(ev), Some(team)) = (self.eval.as_mut(), self.team) else { return Ok(()) };
        let out = evaluate(&ev.config, team, &ev.items, &mut ev.oracle, ev.stream)?;
        let point = EvalPoint {
            update: self.progress.updates,
            reward_mean: out.reward_mean(),
            reward_stderr: out.reward_stderr,
        };
        self.last_eval = Some(point);
        self.run_dir.log_metrics(&out.with_metrics(json!({"stage": self.stage, "update": point.update})))?;
        if self.progress.best.is_none_or(|b| point.reward_mean > b.reward_mean) {
            if self.config.keep_best {
                let dir = self.run_dir.best_agents();
                let record = serde_json::to_vec_pretty(&point)?;
                save_team_to(&dir, &self.team_models(), &self.config.sampling, Some(("best.json", &record)))?;
            }
            self.progress.best = Some(point);
        }
        Ok(())
    }

    /// Save the team whole (with the run's sampling settings; with `keep_best`, the best
    /// evaluation's agents), write the summary and the plot, and mark the run finished. A
    /// session without a team saves nothing itself: its stage has saved what it trained.
    pub fn finish(self) -> Result<TrainingSummary> {
        let final_eval = self.last_eval;
        let best = self.progress.best;
        let use_best = self.config.keep_best && keeps_best(best, final_eval, self.config.keep_best_tolerance);
        if self.team.is_some() {
            self.save_team(use_best)?;
            if self.config.save_merged {
                save_merged_team(self.run_dir, &self.config.sampling)?;
            }
        }
        let summary = TrainingSummary {
            stage: self.stage.into(),
            updates: self.progress.updates,
            final_eval,
            best_eval: best,
            saved: if use_best { "best" } else { "final" },
        };
        let plot = super::training_plot::training_plot(self.run_dir, self.stage)?;
        crate::run::atomic_write(&RunDir::training_summary(&self.state_dir), &serde_json::to_vec_pretty(&summary)?)?;
        crate::run::atomic_write(&RunDir::training_plot(&self.state_dir), plot.as_bytes())?;
        checkpoint::mark_finished(&self.state_dir, &checkpoint::Finished { epochs: self.progress.epoch })?;
        Ok(summary)
    }
}

impl Session<'_> {
    /// The team into `agents/`: the last agents, or with `use_best` the best evaluation's (kept
    /// in `best_agents/`), the last ones then going to `final_agents/`.
    fn save_team(&self, use_best: bool) -> Result<()> {
        if !use_best {
            return save_team(self.run_dir, &self.team_models(), &self.config.sampling);
        }
        let best = self.progress.best;
        let dir = self.run_dir.best_agents();
        let kept: EvalPoint = serde_json::from_slice(&std::fs::read(dir.join("best.json"))?)
            .with_context(|| format!("{}/best.json: not a pbrl evaluation record", dir.display()))?;
        if Some(kept.update) != best.map(|b| b.update) {
            bail!(
                "{} holds the agents after update {}, but the best evaluation was after update {}; train again",
                dir.display(),
                kept.update,
                best.map_or(0, |b| b.update)
            );
        }
        copy_team(&dir, &self.run_dir.agents())?;
        // The last agents stay available (`pbrl eval --team <run_dir>/final_agents`).
        save_team_to(&self.run_dir.final_agents(), &self.team_models(), &self.config.sampling, None)
    }
}

/// A number for a stage and the rounds it trains on (an `iterate` round's training draws other
/// dropout masks than the round before it).
fn stage_salt(stage: &str, rounds: &[u32]) -> u64 {
    let stage = stage.bytes().fold(0u64, |h, b| derive_seed(h, &[b as u64]));
    rounds.iter().fold(stage, |h, &r| derive_seed(h, &[r as u64]))
}

/// Every weight of a model, by name (the team's optimizers update them all).
pub fn all_weights(m: &LoadedModel) -> Vec<(String, Var)> {
    let data = m.varmap.data().lock().expect("VarMap lock");
    data.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}
