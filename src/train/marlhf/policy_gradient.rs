//! The MAGRPO family of MARLHF backends (`rl_algorithm` = magrpo | mareinforce | maremax |
//! marloo): group advantages per item, the policy-gradient loss on padded rows (steps 3–4 of
//! the module's algorithm).
use anyhow::Result;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::algo::advantages::{group_advantages, AdvantageMode, AdvantageRule};
use crate::algo::policy_gradient::{chunk_loss, group_loss};
use crate::config::MarlhfConfig;
use crate::rng::{derive_seed, purpose};
use crate::run::RunDir;
use crate::team::rollout::Rollout;
use crate::team::Agent;
use crate::train::session::{all_weights, Plan, Session, SessionSetup, TrainingData, TrainingSummary};
use pbrl_model::scoring::{sequence_log_probs, LastToken, ScoreRow};
use pbrl_model::Mode;

use super::setup::{abs_mean, mean, rollout_pad, ScoredRollout, Setup};
use super::TrainOptions;

/// Items whose groups one update scores: `train_batch_size`, at most a buffer's.
pub(super) fn items_per_update(cfg: &MarlhfConfig) -> usize {
    cfg.pairs_per_update.min(cfg.rollout_buffer_size).max(1)
}

/// The MAGRPO family: group advantages per item, the policy-gradient loss on padded rows.
pub(super) fn train_policy_gradient(
    cfg: &MarlhfConfig,
    run_dir: &RunDir,
    setup: &Setup,
    mode: AdvantageMode,
    opts: &TrainOptions,
) -> Result<TrainingSummary> {
    let rule = AdvantageRule { mode, normalize: cfg.advantage_normalization, kl_coef: cfg.reference_kl };
    let Setup { team, items, .. } = setup;
    let buffer = cfg.rollout_buffer_size;
    let chunk_items = items_per_update(cfg);
    let centralized = cfg.team.centralized;
    let mut session = open_team_session(cfg, run_dir, setup, opts)?;

    session.run(items.len(), buffer, |step, chunk, metrics| {
        let epoch = step.epoch;
        // returns[j][s]: the reward model's score of joint response s of item j; kls[a][j][s]:
        // agent a's reference KL on its completion there.
        let ScoredRollout { out, returns, kls } =
            setup.scored_rollout(cfg, (epoch, chunk), step.tokens, false, metrics)?;
        for (a, agent) in team.iter().enumerate() {
            let advantages: Vec<Vec<f64>> =
                (0..chunk.len()).map(|j| group_advantages(&returns[j], &kls[a][j], rule)).collect();
            let flat: Vec<f64> = advantages.iter().flatten().copied().collect();
            metrics[format!("marlhf/advantage_mean/agent_{a}")] = json!(mean(&flat));
            metrics[format!("marlhf/advantage_abs_mean/agent_{a}")] = json!(abs_mean(&flat));
            // The buffer in a seeded order, cut into the chunks of one update each.
            let mut order: Vec<usize> = (0..chunk.len()).collect();
            let update = step.progress.updates;
            order.shuffle(&mut ChaCha8Rng::seed_from_u64(derive_seed(
                cfg.seed,
                &[purpose::RL_BUFFER, epoch, update, a as u64],
            )));
            let mut losses = Vec::new();
            for part in order.chunks(chunk_items) {
                let groups = part
                    .iter()
                    .map(|&j| {
                        let (rows, scored, last) = if centralized {
                            let rows = joint_rows(agent, &out, j);
                            let scored = vec![true; rows.len()];
                            (rows, scored, LastToken::Include)
                        } else {
                            let (rows, scored) = padded_rows(agent, &out, j);
                            (rows, scored, LastToken::Exclude)
                        };
                        let pad = agent.model.tokenizer.pad_id;
                        let lp = sequence_log_probs(&agent.model.model, &rows, last, pad, Mode::Train)?;
                        group_loss(&lp, &advantages[j], &scored)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let Some(loss) = chunk_loss(groups)? else { continue };
                if let Some((value, grad_norm)) = step.apply(a, loss, || {})? {
                    losses.push(value);
                    metrics[format!("marlhf/grad_norm/agent_{a}")] = json!(grad_norm);
                }
            }
            if !losses.is_empty() {
                metrics[format!("marlhf/loss/agent_{a}")] = json!(mean(&losses));
            }
        }
        metrics["marlhf/skipped_nonfinite"] = json!(step.progress.skipped_nonfinite.iter().sum::<u64>());
        Ok(())
    })?;
    session.finish()
}

/// The MAGRPO family's session: every weight of every agent trains (lr `agent_learning_rate`),
/// the items walked in file order, state in `marlhf_training/`.
pub(super) fn open_team_session<'a>(
    cfg: &MarlhfConfig,
    run_dir: &'a RunDir,
    setup: &'a Setup,
    opts: &TrainOptions,
) -> Result<Session<'a>> {
    let team = &setup.team;
    let plan = Plan {
        stage: "train-marlhf",
        models: team.iter().map(|a| &a.model).collect(),
        params: team.iter().map(|a| all_weights(&a.model)).collect(),
        learning_rates: vec![cfg.learning_rate; team.len()],
        epochs: cfg.num_train_epochs,
        state_dir: run_dir.marlhf_state(),
        shuffle: None,
        fingerprint_extra: setup.reward.fingerprint(),
    };
    let data = TrainingData { rounds: &[], num_examples: setup.items.len() };
    let session_setup = SessionSetup::of(&cfg.training, data.rounds, &cfg.team.sources, Some(team))?;
    Session::open_plan(session_setup, run_dir, plan, Some(team), data, opts.resume)
}

/// Agent `a`'s completion rows of item `j` as the reference scores them: each completion (with
/// its stop token when it ended) padded with the pad token to the item's longest; and whether a
/// row has anything to score (more than one token: the last position is left out).
pub(super) fn padded_rows(agent: &Agent, out: &Rollout, j: usize) -> (Vec<ScoreRow>, Vec<bool>) {
    let a = agent.index;
    let longest = out.responses[j].iter().map(|joint| joint[a].ids.len()).max().unwrap_or(0);
    let pad = rollout_pad(agent);
    let rows: Vec<ScoreRow> = out.responses[j]
        .iter()
        .map(|joint| {
            let mut completion = joint[a].ids.clone();
            completion.resize(longest, pad);
            ScoreRow { prompt: out.prompt_ids[j][a].clone(), completion }
        })
        .collect();
    let scored = rows.iter().map(|r| r.completion.len() > 1).collect();
    (rows, scored)
}

/// The centralized actor's rows of item `j` as the joint scorer reads them (reference §6.3):
/// each completion cut at its first pad token, which is kept when it is the end-of-turn token,
/// every token scored (an empty row scores 0 and still counts in the group's mean).
fn joint_rows(agent: &Agent, out: &Rollout, j: usize) -> Vec<ScoreRow> {
    let pad = rollout_pad(agent);
    let pad_ends_turn = agent.model.tokenizer.stop_ids.contains(&pad);
    out.responses[j]
        .iter()
        .map(|joint| {
            let ids = &joint[agent.index].ids;
            let end = ids.iter().position(|&t| t == pad).map_or(ids.len(), |p| p + usize::from(pad_ends_turn));
            ScoreRow { prompt: out.prompt_ids[j][agent.index].clone(), completion: ids[..end].to_vec() }
        })
        .collect()
}
