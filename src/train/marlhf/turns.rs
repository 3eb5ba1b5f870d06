//! The MAGRPO family over multi-turn discussions (`num_turns` > 1), as CoMLRL 1.4.3's
//! MAGRPOTrainer with an external transition (the tree's arithmetic: `algo::rollout_tree`).
//!
//! Per batch of items (as many as the rollout buffers take before they could drain):
//! 1. grow each item's rollout tree level by level, every level's nodes of every item sampled
//!    in one call per agent: turn 1 as a one-turn rollout (the same streams); each node's joint
//!    actions (aligned or cross) scored by the reward model or the task reward; a node not on
//!    the last turn and not ended by early termination expands each joint action into a child,
//!    whose prompts the transition writes from that branch;
//! 2. returns: a joint action's reward plus the mean return of its child (undiscounted); each
//!    agent's completion at a node gets its joint action's return (the sum over its joint
//!    actions, cross);
//! 3. each node gives each agent one sample, into the agent's buffer in environment-step
//!    order; a full buffer (and every buffer at the epoch's end) is trained on turn by turn:
//!    its samples in a seeded order, cut into chunks of `train_batch_size`, each chunk the mean
//!    over its nodes of mean_k −A_k · log π(completion k), the advantages per node (the mode's
//!    baseline, the reference KL when enabled, normalized), AdamW step.
use std::cell::Cell;
use std::collections::HashMap;

use anyhow::Result;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use crate::algo::advantages::{group_advantages, AdvantageMode, AdvantageRule};
use crate::algo::policy_gradient::{chunk_loss, group_loss};
use crate::algo::rollout_tree::{
    expands, items_until_drain, joint_actions, nodes_per_tree, tree_samples, Buffers, JointMode, Node, NodeSample,
    TurnBatch,
};
use crate::config::{MarlhfConfig, TransitionSpec, TurnsConfig};
use crate::rng::{derive_seed, purpose};
use crate::run::RunDir;
use crate::task::transition::{Branch, Transition};
use crate::team::discussion::{check_discussion_fits, next_turn};
use crate::team::rollout::{rollout_prompts, Rollout};
use crate::train::session::{Batches, TrainingSummary};
use pbrl_model::scoring::{sequence_log_probs, LastToken};
use pbrl_model::Mode;

use super::policy_gradient::{items_per_update, open_team_session, padded_rows};
use super::setup::{abs_mean, mean, Setup};
use super::TrainOptions;

/// One node of a batch's trees as it is grown: its item (place in the batch), its path of joint
/// actions from the root, the branch before it, each agent's message at it, where its samples
/// are (level, place in that level's rollout), its rewards and children.
struct GrowingNode {
    item: usize,
    path: Vec<u64>,
    branch: Branch,
    users: Vec<String>,
    turn: usize,
    at: (usize, usize),
    rewards: Vec<f64>,
    children: Vec<usize>,
}

/// What a node's samples train on: its rollout (one item: the node), and each agent's
/// reference KLs there, `[agent][k]`.
struct NodeData {
    rollout: Rollout,
    kls: Vec<Vec<f64>>,
}

/// The multi-turn trainer's settings, from the config.
struct Shape<'c> {
    turns: &'c TurnsConfig,
    mode: JointMode,
    actions: Vec<Vec<usize>>,
    k: usize,
}

/// Train the team over multi-turn discussions (`cfg.turns` set).
pub(super) fn train_discussions(
    cfg: &MarlhfConfig,
    run_dir: &RunDir,
    setup: &Setup,
    mode: AdvantageMode,
    opts: &TrainOptions,
) -> Result<TrainingSummary> {
    // One turn of cross joint actions is a tree of one node.
    let one_turn = TurnsConfig {
        num_turns: 1,
        transition: TransitionSpec::Debate(Vec::new()),
        passthrough: false,
        history_reward: crate::config::HistoryReward::Last,
    };
    let turns = cfg.turns.as_ref().unwrap_or(&one_turn);
    let Setup { team, items, .. } = setup;
    let (n, k) = (team.len(), cfg.num_generations);
    let joint = if cfg.cross { JointMode::Cross } else { JointMode::Aligned };
    let shape = Shape { turns, mode: joint, actions: joint_actions(joint, n, k), k };
    let whole_tree = nodes_per_tree(joint, n, k, turns.num_turns);
    // The widest level of a batch: its items' nodes at the last turn, K requests each.
    let widest = joint_actions(joint, n, k).len().saturating_pow(turns.num_turns as u32 - 1);
    let batch_items = items_until_drain(0, cfg.rollout_buffer_size, whole_tree);
    let rows = batch_items.saturating_mul(widest).saturating_mul(k);
    let keys = "rollout_buffer_size, num_generations, num_turns and joint_mode";
    if turns.num_turns > 1 {
        check_discussion_fits(team, items, &cfg.max_new_tokens, (rows, keys), "train", turns)?;
    }
    let mut warned = false;
    let rule = AdvantageRule { mode, normalize: cfg.advantage_normalization, kl_coef: cfg.reference_kl };
    let mut session = open_team_session(cfg, run_dir, setup, opts)?;
    let mut transition = Transition::of(&turns.transition)?;
    let mut buffers = Buffers::new(n, cfg.rollout_buffer_size);
    let held = Cell::new(0usize);
    let mut store: HashMap<usize, NodeData> = HashMap::new();
    let (mut env_step, mut next_id, mut seen) = (0u64, 0usize, 0usize);
    let mut sizes = |_left: usize| items_until_drain(held.get(), cfg.rollout_buffer_size, whole_tree);

    session.run_batches(items.len(), Batches::Dynamic(&mut sizes), |step, chunk, metrics| {
        let epoch = step.epoch;
        let started = std::time::Instant::now();
        let (nodes, levels, kls, roots) = grow(cfg, setup, &shape, &mut transition, epoch, chunk, &mut *step.tokens)?;
        metrics["time/rollout_s"] = json!(started.elapsed().as_secs_f64());
        if turns.num_turns > 1 && nodes.len() == roots.len() && !warned {
            warned = true;
            let t = cfg.early_termination.unwrap_or(f64::NAN);
            let msg = format!(
                "early termination ended every branch of this batch at turn 1 (its mean reward above \
                 early_termination_threshold = {t}, the reference's default when unset): no later turn is trained; \
                 set early_termination_threshold = \"none\" (or a higher threshold) for the discussion to go on"
            );
            tracing::warn!("{msg}");
            eprintln!("warning: {msg}");
        }
        let mut drained: Vec<TurnBatch> = Vec::new();
        for &root in &roots {
            let mut order = Vec::new();
            let tree = tree_of(&nodes, root, &mut order);
            let (mut samples, after) = tree_samples(&tree, shape.mode, n, k, env_step);
            env_step = after;
            for s in &mut samples {
                s.node += next_id;
            }
            for (i, &id) in order.iter().enumerate() {
                let (level, pos) = nodes[id].at;
                let out = &levels[level];
                let rollout = Rollout {
                    prompts: vec![out.prompts[pos].clone()],
                    prompt_ids: vec![out.prompt_ids[pos].clone()],
                    responses: vec![out.responses[pos].clone()],
                };
                let node_kls = (0..n).map(|a| kls[level][a][pos].clone()).collect();
                store.insert(next_id + i, NodeData { rollout, kls: node_kls });
            }
            next_id += order.len();
            drained.extend(buffers.push(samples));
        }
        seen += chunk.len();
        if seen == items.len() {
            drained.extend(buffers.flush());
            seen = 0;
        }
        held.set(buffers.held());
        turn_metrics(&drained, metrics);
        let chunk_nodes = items_per_update(cfg);
        let mut losses = vec![Vec::new(); n];
        for batch in &drained {
            let (a, agent) = (batch.agent, &team[batch.agent]);
            let mut order: Vec<&NodeSample> = batch.samples.iter().collect();
            let update = step.progress.updates;
            let path = [purpose::RL_BUFFER, epoch, update, a as u64, batch.turn as u64];
            order.shuffle(&mut ChaCha8Rng::seed_from_u64(derive_seed(cfg.seed, &path)));
            let mut advantages_seen = Vec::new();
            for part in order.chunks(chunk_nodes) {
                let groups = part
                    .iter()
                    .map(|s| {
                        let data = &store[&s.node];
                        let advantages = group_advantages(&s.returns, &data.kls[a], rule);
                        advantages_seen.extend(advantages.iter().copied());
                        let (rows, scored) = padded_rows(agent, &data.rollout, 0);
                        let pad = agent.model.tokenizer.pad_id;
                        let lp = sequence_log_probs(&agent.model.model, &rows, LastToken::Exclude, pad, Mode::Train)?;
                        group_loss(&lp, &advantages, &scored)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let Some(loss) = chunk_loss(groups)? else { continue };
                if let Some((value, grad_norm)) = step.apply(a, loss, || {})? {
                    losses[a].push(value);
                    metrics[format!("marlhf/grad_norm/agent_{a}")] = json!(grad_norm);
                }
            }
            let t = batch.turn + 1;
            metrics[format!("turn_{t}/advantage_abs_mean/agent_{a}")] = json!(abs_mean(&advantages_seen));
        }
        for (a, l) in losses.iter().enumerate().filter(|(_, l)| !l.is_empty()) {
            metrics[format!("marlhf/loss/agent_{a}")] = json!(mean(l));
        }
        // Drop what no buffer holds any more.
        let kept = buffers.held_nodes();
        store.retain(|id, _| kept.contains(id));
        metrics["marlhf/skipped_nonfinite"] = json!(step.progress.skipped_nonfinite.iter().sum::<u64>());
        Ok(())
    })?;
    session.finish()
}

/// The reference's per-turn metrics of the drained samples (agent 0's, one per node): the mean
/// of the nodes' mean rewards and mean returns.
fn turn_metrics(drained: &[TurnBatch], metrics: &mut Value) {
    for batch in drained.iter().filter(|b| b.agent == 0) {
        let t = batch.turn + 1;
        let rewards: Vec<f64> = batch.samples.iter().map(|s| s.mean_reward).collect();
        let returns: Vec<f64> = batch.samples.iter().map(|s| s.mean_return).collect();
        metrics[format!("turn_{t}/reward_mean")] = json!(mean(&rewards));
        metrics[format!("turn_{t}/expected_return")] = json!(mean(&returns));
    }
}

/// A node's tree for the arithmetic, and the nodes' ids in its pre-order (`order`).
fn tree_of(nodes: &[GrowingNode], id: usize, order: &mut Vec<usize>) -> Node {
    order.push(id);
    let node = &nodes[id];
    let children = node.children.iter().map(|&c| tree_of(nodes, c, order)).collect();
    Node { turn: node.turn, rewards: node.rewards.clone(), children }
}

/// Grow the trees of the batch's items (`chunk`: indices into the train items) level by level:
/// the nodes, each level's rollout, each level's reference KLs `[level][agent][node][k]`, and
/// the roots.
#[allow(clippy::type_complexity)]
fn grow(
    cfg: &MarlhfConfig,
    setup: &Setup,
    shape: &Shape,
    transition: &mut Transition,
    epoch: u64,
    chunk: &[usize],
    tokens: &mut usize,
) -> Result<(Vec<GrowingNode>, Vec<Rollout>, Vec<Vec<Vec<Vec<f64>>>>, Vec<usize>)> {
    let team = &setup.team;
    let mut nodes = Vec::new();
    for (j, &i) in chunk.iter().enumerate() {
        let users = team.iter().map(|a| a.first_message(&setup.items[i])).collect::<Result<Vec<_>>>()?;
        let (branch, path, at) = (Branch::default(), Vec::new(), (0, j));
        nodes.push(GrowingNode {
            item: j,
            path,
            branch,
            users,
            turn: 0,
            at,
            rewards: Vec::new(),
            children: Vec::new(),
        });
    }
    let roots: Vec<usize> = (0..chunk.len()).collect();
    let mut levels = vec![setup.rollout(cfg, epoch, chunk, tokens)?];
    let mut kls = Vec::new();
    let mut frontier = roots.clone();
    for turn in 0..shape.turns.num_turns {
        let out = &levels[turn];
        for (pos, &id) in frontier.iter().enumerate() {
            let joints = joint_texts(out, pos, &shape.actions);
            let item = &setup.items[chunk[nodes[id].item]];
            nodes[id].rewards = setup.reward.score(item, &out.prompts[pos], &joints)?;
        }
        kls.push(setup.reference_kls(out)?);
        let expanding: Vec<usize> = frontier
            .iter()
            .copied()
            .filter(|&id| expands(turn, shape.turns.num_turns, &nodes[id].rewards, cfg.early_termination))
            .collect();
        if expanding.is_empty() {
            break;
        }
        let mut next = Vec::new();
        let mut texts = vec![Vec::new(); team.len()];
        for id in expanding {
            let pos = frontier.iter().position(|&f| f == id).expect("in the frontier");
            let joints = joint_texts(out, pos, &shape.actions);
            let index = setup.indices[chunk[nodes[id].item]];
            for (q, joint) in joints.iter().enumerate() {
                let branch = nodes[id].branch.then(&nodes[id].users, joint);
                let item = &setup.items[chunk[nodes[id].item]];
                let passthrough = shape.turns.passthrough;
                let (users, prompts) =
                    next_turn(team, transition, passthrough, item, index, &branch, &cfg.max_new_tokens)?;
                for (a, p) in prompts.into_iter().enumerate() {
                    texts[a].push(p);
                }
                let mut path = nodes[id].path.clone();
                path.push(q as u64);
                let child = nodes.len();
                let at = (turn + 1, next.len());
                let (item, turn) = (nodes[id].item, turn + 1);
                nodes.push(GrowingNode {
                    item,
                    path,
                    branch,
                    users,
                    turn,
                    at,
                    rewards: Vec::new(),
                    children: Vec::new(),
                });
                nodes[id].children.push(child);
                next.push(child);
            }
        }
        let seed = |p: usize, a: usize, s: usize| {
            let node = &nodes[next[p]];
            let mut path = vec![purpose::RL_TURN, epoch, setup.indices[chunk[node.item]] as u64, node.turn as u64];
            path.extend(&node.path);
            path.extend([a as u64, s as u64]);
            derive_seed(cfg.seed, &path)
        };
        let out = rollout_prompts(team, &texts, shape.k, &cfg.sampling, seed, |t| *tokens += t)?;
        levels.push(out);
        frontier = next;
    }
    Ok((nodes, levels, kls, roots))
}

/// The joint actions' texts at node `pos` of a level's rollout: per joint action, each agent's
/// completion it takes.
fn joint_texts(out: &Rollout, pos: usize, actions: &[Vec<usize>]) -> Vec<Vec<String>> {
    let responses = &out.responses[pos];
    actions.iter().map(|act| act.iter().enumerate().map(|(a, &c)| responses[c][a].text.clone()).collect()).collect()
}
