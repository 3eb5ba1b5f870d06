//! Fitting a joint reward model to the stored preference rounds with a Bradley–Terry loss
//! (reference §7.2–7.3); `pbrl fit-rm` and `iterate`'s MARLHF rounds run it.
//!
//! 1. select the pairs from the round files with the replay rules (as `train-madpo` does) and
//!    hold out `reward_eval_fraction` of the items (chosen by the seed) with all their pairs, to
//!    measure the fit on prompts it never saw;
//! 2. a fresh reward model: the backbone from `reward_model_name` (default: the first actor's
//!    source) on `reward_model_device`, a scalar head with PyTorch's default init drawn from the
//!    seed; each joint text tokenized once (`reward_max_length` tokens kept);
//! 3. open a training session on it (one AdamW, PyTorch defaults with weight decay 0.01, lr
//!    `reward_learning_rate`, over the head and, unless `reward_freeze_backbone`, the backbone;
//!    `--resume` restores the newest checkpoint in `<run_dir>/reward_model_training/`);
//! 4. per batch of `reward_train_batch_size` pairs (shuffled by the seed every epoch, for
//!    `reward_num_train_epochs` epochs): score winners and losers, loss
//!    mean −log σ(s_w − s_l), backward, AdamW step (a non-finite loss skips the step); log the
//!    loss, the share of pairs ordered right and the mean margin; after every epoch (and once
//!    before the first update), the same on the held-out pairs. With a frozen backbone the
//!    final hidden states cannot change, so they are computed once before the first update and
//!    the epochs train the head on them (one backbone pass per text, not one per epoch);
//! 5. save the reward model to `<run_dir>/reward_model/` (backbone, head, joint-text format);
//! 6. the order RL reads: the current team samples `reward_fresh_samples` fresh joint responses
//!    to each held-out item (the held-out pairs' items, and the train items `eval_split` holds
//!    out of collection that no fitted pair has); `rm/fresh_rank_acc` is the share of their pairs with an oracle gap
//!    that the reward model orders the oracle's way (held-out pairs are a round's extremes, and
//!    a model can order those while it ranks one prompt's typical samples at chance), written
//!    with the model as `fit_report.json` for `train-marlhf` to warn on.
use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use serde_json::json;

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::algo::bradley_terry::{bradley_terry_loss, pair_stats, within_prompt_order, PairStats};
use crate::config::RewardFitConfig;
use crate::device::{ensure_fits, parse_device, sum_of_largest};
use crate::oracle::Oracle;
use crate::prefs::replay::training_pairs;
use crate::prefs::{check_actors, check_turns, round_path, PreferencePair};
use crate::reward_model::{JointRewardModel, JointRow};
use crate::rng::{derive_seed, purpose};
use crate::run::{atomic_write, RunDir};
use crate::task::split::{choose_held_out_groups, held_out_items, train_items};
use crate::task::TaskItem;
use crate::team::rollout::rollout;
use crate::team::{check_fits, frozen_storage, load_team};
use crate::train::session::{Plan, Session, SessionSetup, TrainingData};
use pbrl_model::batch::distinct_rows;
use pbrl_model::lora::LoraSpec;
use pbrl_model::{LoadedModel, Mode};

pub struct FitOptions {
    pub resume: bool,
}

pub struct FitReport {
    pub updates: u64,
    /// The pairs selected, the ones fitted, from the rounds; the held-out items.
    pub num_pairs: usize,
    pub fitted_pairs: usize,
    pub rounds: Vec<u32>,
    pub held_out_pairs: usize,
    pub held_out_items: usize,
    /// The backbone's source, where the model was saved, and the fit's seconds.
    pub source: String,
    pub saved_in: std::path::PathBuf,
    pub secs: f64,
    /// The held-out pairs' statistics after the fit (none when nothing was held out).
    pub held_out: Option<PairStats>,
    /// `rm/fresh_rank_acc` (none when not measured).
    pub fresh_rank: Option<FreshRank>,
}

impl FitReport {
    /// What the fit did, as `pbrl fit-rm` prints it.
    pub fn describe(&self) -> String {
        let mut out = format!(
            "fitted the joint reward model ({}) on {} pairs from rounds {:?}: {} updates in {:.1} s",
            self.source, self.fitted_pairs, self.rounds, self.updates, self.secs
        );
        match &self.held_out {
            Some(s) => {
                out += &format!(
                    "; held-out pairs ({} from {} items never fitted): accuracy {:.3}, mean margin {:.4}, loss {:.4}",
                    self.held_out_pairs, self.held_out_items, s.accuracy, s.margin_mean, s.loss
                )
            }
            None => out += "; no pairs held out",
        }
        if let Some(f) = &self.fresh_rank {
            out += &format!(
                "\nrm/fresh_rank_acc {:.3}: fresh samples of {} held-out items, {} pairs with an oracle gap",
                f.fresh_rank_acc, f.fresh_rank_items, f.fresh_rank_pairs
            );
        }
        out + &format!("\nreward model saved in {}", self.saved_in.display())
    }
}

/// How the reward model orders fresh samples of held-out prompts (see step 6).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FreshRank {
    /// `rm/fresh_rank_acc`: the share of pairs ordered the oracle's way.
    pub fresh_rank_acc: f64,
    /// Pairs of fresh samples of one prompt whose oracle rewards differ.
    pub fresh_rank_pairs: usize,
    pub fresh_rank_items: usize,
}

/// Below this `rm/fresh_rank_acc`, `train-marlhf` warns that its advantages are mostly noise.
pub const FRESH_RANK_WARN: f64 = 0.6;

/// `reward_model/fit_report.json`: what the fit measured that a later stage reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FitReportFile {
    pub fresh_rank: Option<FreshRank>,
}

/// A pair's two joint responses as the reward model reads them.
struct EncodedPair {
    winner: JointRow,
    loser: JointRow,
}

/// Joint texts scored per forward pass when no gradient is needed.
const SCORE_BATCH: usize = 8;

/// Refuse, before training, a batch of `batch_size` pairs whose pass through the whole backbone
/// would not fit in memory: the largest batch runs at least the longer text of each of its
/// pairs (a pair is packed on its common prefix), and keeps their activations for the backward.
fn check_batch_fits(rm: &JointRewardModel, train: &[EncodedPair], batch_size: usize, device: &Device) -> Result<()> {
    let lengths: Vec<usize> = train.iter().map(|p| p.winner.ids.len().max(p.loser.ids.len())).collect();
    let tokens = sum_of_largest(lengths, batch_size);
    let need = rm.backbone.model.config.train_activation_bytes(tokens);
    ensure_fits(device, need, |need, free| {
        format!(
            "reward_train_batch_size: a batch of {batch_size} pairs runs the whole backbone (reward_freeze_backbone = \
             false) over at least {tokens} tokens, whose activations alone need at least {need} MiB, more than the \
             {free} MiB of memory available; lower reward_train_batch_size or freeze the backbone"
        )
    })
}

/// Fit a fresh reward model to the replay selection and save it in `reward_model/`; `None` when
/// the selected rounds hold no pairs (nothing is fitted).
pub fn fit(cfg: &RewardFitConfig, run_dir: &RunDir, opts: &FitOptions) -> Result<Option<FitReport>> {
    let (pairs, rounds) = training_pairs(run_dir.replay(), &cfg.replay)?;
    if pairs.is_empty() {
        return Ok(None);
    }
    check_actors(&pairs, cfg.training.evaluation.team.num_actors, &cfg.team_setup)?;
    check_turns(&pairs, 1)?;
    // Whole items are held out (all pairs of one prompt set together, across rounds too): a pair
    // whose prompt also has pairs in the fit measures memory of that prompt, not how the model
    // ranks the responses to a prompt it never saw.
    let items: Vec<&Vec<String>> = pairs.iter().map(|p| &p.prompts).collect();
    let num_items = items.iter().collect::<std::collections::HashSet<_>>().len();
    let (train, held): (Vec<&PreferencePair>, Vec<&PreferencePair>) = if cfg.eval_fraction > 0.0 {
        if num_items < 2 {
            bail!(
                "reward_eval_fraction = {} holds out whole items and needs pairs of at least 2 items, the selected \
                 rounds have {num_items}; set reward_eval_fraction = 0 to fit on all of them",
                cfg.eval_fraction,
            );
        }
        let out = choose_held_out_groups(&items, cfg.eval_fraction, derive_seed(cfg.seed, &[purpose::REWARD_SPLIT]));
        let (h, t): (Vec<_>, Vec<_>) = pairs.iter().zip(&out).partition(|(_, &o)| o);
        (t.into_iter().map(|(p, _)| p).collect(), h.into_iter().map(|(p, _)| p).collect())
    } else {
        (pairs.iter().collect(), Vec::new())
    };
    let held_prompts: HashSet<Vec<String>> = held.iter().map(|p| p.prompts.clone()).collect();
    let fitted_prompts: HashSet<Vec<String>> = train.iter().map(|p| p.prompts.clone()).collect();
    let held_items = held_prompts.len();

    let source = &cfg.source;
    let device = parse_device(&cfg.device, "reward_model_device")?;
    // The backbone, before the head joins its variables: trained whole; frozen and only read
    // (stored as `frozen_dtype` says); or frozen under LoRA adapters (`reward_lora`).
    let backbone = LoadedModel::load_backbone(source, &device)
        .and_then(|b| match &cfg.lora {
            Some(lora) => {
                let (r, alpha, target_modules, use_rslora) = lora.shape_of(0);
                let base = crate::team::lora_base(b, lora)?;
                let spec = LoraSpec { r, alpha, target_modules, use_rslora };
                let mut rm = LoadedModel::with_lora(&base, &spec, derive_seed(cfg.seed, &[purpose::REWARD_LORA_INIT]))?;
                rm.set_lora_dropout(lora.dropout)?;
                Ok(rm)
            }
            None if cfg.freeze_backbone => b.stored(frozen_storage(cfg.frozen_dtype)),
            None => Ok(b),
        })
        .with_context(|| format!("loading the reward model's backbone `{source}`"))?;
    let max_length = cfg.max_length;
    let context = backbone.model.config.context_length();
    if let Some(m) = max_length.filter(|&m| m > context) {
        bail!("reward_max_length = {m} is beyond the context of the reward model's backbone `{source}` ({context})");
    }
    let mut rm = JointRewardModel::fresh(
        backbone,
        cfg.num_roles,
        max_length,
        cfg.head,
        cfg.head_hidden,
        derive_seed(cfg.seed, &[purpose::REWARD_HEAD]),
    )?;
    if cfg.gradient_checkpointing && !cfg.freeze_backbone {
        rm.backbone.checkpoint_layers();
    }
    let rm = rm;
    let encode = |p: &PreferencePair| -> Result<EncodedPair> {
        Ok(EncodedPair {
            winner: rm.encode(&p.prompts, &p.winner_completions)?,
            loser: rm.encode(&p.prompts, &p.loser_completions)?,
        })
    };
    let train = train.into_iter().map(encode).collect::<Result<Vec<_>>>()?;
    let held = held.into_iter().map(encode).collect::<Result<Vec<_>>>()?;
    if !cfg.freeze_backbone {
        check_batch_fits(&rm, &train, cfg.batch_size, &device)?;
    }

    let dir = run_dir.replay().to_path_buf();
    let files: Vec<(u32, std::path::PathBuf)> = rounds.iter().map(|&r| (r, round_path(&dir, r))).collect();
    let files: Vec<(u32, &std::path::Path)> = files.iter().map(|(r, p)| (*r, p.as_path())).collect();
    let plan = Plan {
        stage: "fit-rm",
        models: vec![&rm.backbone],
        params: vec![rm.trainable(cfg.freeze_backbone)],
        learning_rates: vec![cfg.learning_rate],
        epochs: cfg.num_train_epochs,
        state_dir: run_dir.reward_model_state(),
        shuffle: Some(purpose::REWARD_TRAIN),
        fingerprint_extra: Vec::new(),
    };
    let data = TrainingData { rounds: &files, num_examples: train.len() };
    let setup = SessionSetup::of(&cfg.training, data.rounds, std::slice::from_ref(source), None)?;
    let mut session = Session::open_plan(setup, run_dir, plan, None, data, opts.resume)?;
    let started = std::time::Instant::now();
    let batch_size = cfg.batch_size;
    let batches_per_epoch = train.len().div_ceil(batch_size) as u64;
    let mut held_out = None;

    // A frozen backbone's hidden states cannot change: computed once here, every epoch then
    // runs the head only (the same scores as through the backbone, without its forward passes).
    let (frozen_train, frozen_held) = match cfg.freeze_backbone {
        true => {
            let t = std::time::Instant::now();
            let f = (PairFeatures::of(&rm, &train)?, PairFeatures::of(&rm, &held)?);
            tracing::info!(
                "final hidden states of {} joint texts in {:.1} s",
                2 * (train.len() + held.len()),
                t.elapsed().as_secs_f64()
            );
            f
        }
        false => (None, None),
    };
    let held_out_now = |rm: &JointRewardModel| held_out_stats(rm, &held, frozen_held.as_ref());
    if !held.is_empty() && session.progress.updates == 0 {
        held_out = Some(log_held_out(held_out_now(&rm)?, held.len(), held_items, run_dir, 0)?);
    }

    session.run(train.len(), batch_size, |step, chunk, metrics| {
        *step.tokens += chunk.iter().map(|&i| train[i].winner.ids.len() + train[i].loser.ids.len()).sum::<usize>();
        // The reference scores winners and losers in two forward passes; one pass over each
        // pair packed on its common prefix (the header and the first agent's prompt) gives the
        // same scores and gradients without running that prefix twice.
        let (w, l) = match &frozen_train {
            Some(f) => f.scores(&rm, chunk)?,
            None => {
                let pairs: Vec<(&JointRow, &JointRow)> =
                    chunk.iter().map(|&i| (&train[i].winner, &train[i].loser)).collect();
                rm.score_pairs(&pairs, Mode::Train)?
            }
        };
        let stats = pair_stats(&values(&w)?, &values(&l)?);
        let loss = bradley_terry_loss(&w, &l)?;
        if let Some((value, grad_norm)) = step.apply(0, loss, || drop((w, l)))? {
            metrics["rm/loss"] = json!(value);
            metrics["rm/grad_norm"] = json!(grad_norm);
        }
        metrics["rm/accuracy"] = json!(stats.accuracy);
        metrics["rm/margin_mean"] = json!(stats.margin_mean);
        metrics["rm/skipped_nonfinite"] = json!(step.progress.skipped_nonfinite[0]);
        // After an epoch's last batch: the held-out pairs.
        let update = step.progress.updates + 1;
        if !held.is_empty() && update.is_multiple_of(batches_per_epoch) {
            let s = held_out_now(&rm)?;
            metrics["rm/eval_accuracy"] = json!(s.accuracy);
            metrics["rm/eval_margin_mean"] = json!(s.margin_mean);
            metrics["rm/eval_loss"] = json!(s.loss);
            held_out = Some(s);
        }
        Ok(())
    })?;
    if !held.is_empty() && held_out.is_none() {
        // A resumed run that had nothing left to train: measure what it saves.
        held_out = Some(held_out_now(&rm)?);
    }
    crate::run::team::check_finite("the reward model", &rm.backbone)?;
    let out_dir = run_dir.reward_model();
    rm.save(&out_dir)?;
    let fresh_rank = fresh_rank(cfg, run_dir, &rm, &held_prompts, &fitted_prompts)?;
    if let Some(f) = &fresh_rank {
        run_dir.log_metrics(&json!({"stage": "fit-rm", "rm/fresh_rank_acc": f.fresh_rank_acc,
            "rm/fresh_rank_pairs": f.fresh_rank_pairs, "rm/fresh_rank_items": f.fresh_rank_items}))?;
    }
    atomic_write(&run_dir.fit_report(), &serde_json::to_vec_pretty(&FitReportFile { fresh_rank })?)?;
    let summary = session.finish()?;
    Ok(Some(FitReport {
        updates: summary.updates,
        num_pairs: pairs.len(),
        fitted_pairs: train.len(),
        rounds,
        held_out_pairs: held.len(),
        held_out_items: held_items,
        source: source.clone(),
        saved_in: out_dir,
        secs: started.elapsed().as_secs_f64(),
        held_out,
        fresh_rank,
    }))
}

/// Step 6: `reward_fresh_samples` fresh joint responses of the current team to each held-out
/// train item, scored by the oracle and by the reward model; how often the model orders a
/// prompt's samples the oracle's way. The held-out items: those whose rendered prompts are the
/// held-out pairs', then those `eval_split` holds out of collection, unless a fitted pair has
/// their prompts (a round of other settings). `None` when not asked for, or when there are none
/// (rounds of another task).
fn fresh_rank(
    cfg: &RewardFitConfig,
    run_dir: &RunDir,
    rm: &JointRewardModel,
    held_prompts: &HashSet<Vec<String>>,
    fitted_prompts: &HashSet<Vec<String>>,
) -> Result<Option<FreshRank>> {
    let k = cfg.fresh_samples;
    let evaluation = &cfg.training.evaluation;
    if k < 2 {
        return Ok(None);
    }
    let team = load_team(&evaluation.team, run_dir)?;
    let prompts_of = |item: &TaskItem| team.iter().map(|a| a.prompt_for(item)).collect::<Result<Vec<_>>>();
    let mut items = Vec::new();
    for (_, item) in train_items(&evaluation.split)? {
        if held_prompts.contains(&prompts_of(&item)?) {
            items.push(item);
        }
    }
    for item in held_out_items(&evaluation.split)? {
        if !fitted_prompts.contains(&prompts_of(&item)?) {
            items.push(item);
        }
    }
    if items.is_empty() {
        return Ok(None);
    }
    check_fits(&team, &items, &evaluation.eval.max_new_tokens(), (k, "reward_fresh_samples"), "train")?;
    let mut oracle = Oracle::new(&evaluation.oracle)?;
    let seed =
        |j: usize, a: usize, s: usize| derive_seed(cfg.seed, &[purpose::REWARD_FRESH, j as u64, a as u64, s as u64]);
    let mut groups = Vec::with_capacity(items.len());
    for (j, item) in items.iter().enumerate() {
        let out =
            rollout(&team, std::slice::from_ref(item), k, &evaluation.eval.sampling, |_, a, s| seed(j, a, s), |_| {})?;
        let prompts = &out.prompts[0];
        let joints: Vec<Vec<String>> = (0..k).map(|s| out.texts(0, s)).collect();
        let truth = oracle.score(item, prompts, &joints)?.processed;
        if let Some((s, r)) = truth.iter().enumerate().find(|(_, r)| !r.is_finite()) {
            bail!("fresh sample {s} of a held-out item: its reward is not finite ({r})");
        }
        let rows = joints.iter().map(|x| rm.encode(prompts, x)).collect::<Result<Vec<_>>>()?;
        groups.push((truth, rm.score(&rows, SCORE_BATCH)?));
    }
    let (right, total) = within_prompt_order(&groups, 1e-9);
    Ok((total > 0).then(|| FreshRank {
        fresh_rank_acc: right as f64 / total as f64,
        fresh_rank_pairs: total,
        fresh_rank_items: items.len(),
    }))
}

/// The final hidden states of pairs' two joint texts (no graph): under a frozen backbone
/// computed once for the whole fit, else afresh for each held-out evaluation.
struct PairFeatures {
    winners: Tensor,
    losers: Tensor,
}

impl PairFeatures {
    fn of(rm: &JointRewardModel, pairs: &[EncodedPair]) -> Result<Option<Self>> {
        if pairs.is_empty() {
            return Ok(None);
        }
        // One backbone pass per distinct text: a candidate is in several pairs of its item.
        // Rows interleaved: pair i's winner is row 2i, its loser row 2i + 1.
        let sides: Vec<&JointRow> = pairs.iter().flat_map(|p| [&p.winner, &p.loser]).collect();
        let (distinct, source) = distinct_rows(sides.iter().map(|r| r.ids.as_slice()));
        // The same tokens are the same joint text, so any of its rows stands for it.
        let mut rows: Vec<Option<JointRow>> = vec![None; distinct.len()];
        for (row, &d) in sides.iter().zip(&source) {
            rows[d as usize].get_or_insert_with(|| (*row).clone());
        }
        let rows: Vec<JointRow> = rows.into_iter().flatten().collect();
        let features = rm.features(&rows, SCORE_BATCH)?;
        let pick = |side: usize| -> Result<Tensor> {
            let idx: Vec<u32> = source.iter().skip(side).step_by(2).copied().collect();
            Ok(features.index_select(&Tensor::new(idx.as_slice(), features.device())?, 0)?)
        };
        Ok(Some(Self { winners: pick(0)?, losers: pick(1)? }))
    }

    /// Differentiable (in the head) scores of the pairs `idx`: winners, losers.
    fn scores(&self, rm: &JointRewardModel, idx: &[usize]) -> Result<(Tensor, Tensor)> {
        let idx: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
        let idx = Tensor::new(idx.as_slice(), self.winners.device())?;
        let score = |f: &Tensor| rm.score_features(&f.index_select(&idx, 0)?);
        Ok((score(&self.winners)?, score(&self.losers)?))
    }
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.detach().to_dtype(candle_core::DType::F64)?.to_vec1()?)
}

/// The held-out pairs' accuracy, mean margin and loss under the model as it is (no gradients):
/// from the frozen backbone's features when given, else from the backbone as it is now.
fn held_out_stats(rm: &JointRewardModel, held: &[EncodedPair], frozen: Option<&PairFeatures>) -> Result<PairStats> {
    let fresh = if frozen.is_none() { PairFeatures::of(rm, held)? } else { None };
    let Some(f) = frozen.or(fresh.as_ref()) else { return Ok(pair_stats(&[], &[])) };
    let (w, l) = f.scores(rm, &(0..held.len()).collect::<Vec<_>>())?;
    Ok(pair_stats(&values(&w)?, &values(&l)?))
}

/// Held-out statistics `s` of `num_pairs` pairs of `num_items` items, logged as the evaluation
/// after `update` updates.
fn log_held_out(s: PairStats, num_pairs: usize, num_items: usize, run_dir: &RunDir, update: u64) -> Result<PairStats> {
    run_dir.log_metrics(&json!({"stage": "fit-rm", "update": update, "rm/eval_accuracy": s.accuracy,
        "rm/eval_margin_mean": s.margin_mean, "rm/eval_loss": s.loss, "rm/eval_pairs": num_pairs,
        "rm/eval_items": num_items}))?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward_model::tests::{test_joint_row as row, tiny_reward_model};

    #[test]
    fn pair_features_of_shared_texts_score_each_side_as_the_backbone_does() {
        let rm = tiny_reward_model();
        // Texts in several pairs, on either side (as every pair of an item's candidates is).
        let pairs: Vec<EncodedPair> = [(0, 1), (0, 2), (2, 1), (3, 0), (1, 3)]
            .into_iter()
            .map(|(w, l)| EncodedPair { winner: row(w), loser: row(l) })
            .collect();
        let f = PairFeatures::of(&rm, &pairs).unwrap().unwrap();
        let (w, l) = f.scores(&rm, &[4, 0, 2]).unwrap();
        let direct = |side: fn(&EncodedPair) -> &JointRow| {
            let rows: Vec<JointRow> = [4, 0, 2].iter().map(|&i| side(&pairs[i]).clone()).collect();
            values(&rm.score_rows(&rows, Mode::Infer).unwrap()).unwrap()
        };
        for (got, want) in [(values(&w).unwrap(), direct(|p| &p.winner)), (values(&l).unwrap(), direct(|p| &p.loser))] {
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{got:?} vs {want:?}");
            }
        }
    }
}
