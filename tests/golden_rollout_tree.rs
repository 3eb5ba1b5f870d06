//! The multi-turn rollout tree against CoMLRL 1.4.3's own `MAGRPOTrainer._train_step_returns`
//! (scripts/fixtures/golden_rollout_tree.py): 1, 2 and 3 agents, 2 and 3 turns, aligned and
//! cross joint actions, with and without early termination (the reference's default threshold
//! among them), buffers that drain in the middle of a tree and at the epoch's end. From the
//! fixture's rewards alone, pbrl rebuilds each tree (which nodes expand), and must make the same
//! updates in the same order: agent, turn, and per sample the returns, advantages, node means and
//! environment step, within 1e-9 (advantages 1e-6).
mod common;

use pbrl::algo::advantages::{group_advantages, AdvantageMode, AdvantageRule};
use pbrl::algo::rollout_tree::{expands, joint_actions, tree_samples, Buffers, JointMode, Node, TurnBatch};
use serde_json::Value;

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// The tree whose nodes, depth first, scored `rewards` (consumed from the front).
fn rebuild(rewards: &mut std::slice::Iter<Vec<f64>>, turn: usize, turns: usize, threshold: Option<f64>) -> Node {
    let own = rewards.next().expect("the fixture has a node here").clone();
    let children = match expands(turn, turns, &own, threshold) {
        true => (0..own.len()).map(|_| rebuild(rewards, turn + 1, turns, threshold)).collect(),
        false => Vec::new(),
    };
    Node { turn, rewards: own, children }
}

#[test]
fn trees_returns_and_buffers_match_comlrl() {
    let g: Value =
        serde_json::from_str(&std::fs::read_to_string(common::fixtures().join("golden_rollout_tree.json")).unwrap())
            .unwrap();
    let cases = g["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 9);
    let mut expanded_any = false;
    for (c, case) in cases.iter().enumerate() {
        let n = case["num_agents"].as_u64().unwrap() as usize;
        let k = case["num_generations"].as_u64().unwrap() as usize;
        let turns = case["num_turns"].as_u64().unwrap() as usize;
        let mode = match case["joint_mode"].as_str().unwrap() {
            "cross" => JointMode::Cross,
            _ => JointMode::Aligned,
        };
        let threshold = case["early_termination_threshold"].as_f64();
        let rule = AdvantageRule {
            mode: AdvantageMode::parse(case["advantage_mode"].as_str().unwrap()).unwrap(),
            normalize: true,
            kl_coef: None,
        };
        let mut buffers = Buffers::new(n, case["rollout_buffer_size"].as_u64().unwrap() as usize);
        let mut updates: Vec<TurnBatch> = Vec::new();
        let mut step = 0;
        for item in case["items"].as_array().unwrap() {
            let nodes: Vec<Vec<f64>> = item.as_array().unwrap().iter().map(floats).collect();
            assert!(nodes.iter().all(|r| r.len() == joint_actions(mode, n, k).len()), "case {c}");
            let mut it = nodes.iter();
            let root = rebuild(&mut it, 0, turns, threshold);
            assert!(it.next().is_none(), "case {c}: the fixture built more nodes than pbrl expands");
            expanded_any |= !root.children.is_empty();
            let (samples, after) = tree_samples(&root, mode, n, k, step);
            step = after;
            updates.extend(buffers.push(samples));
        }
        updates.extend(buffers.flush());
        let want = case["updates"].as_array().unwrap();
        assert_eq!(updates.len(), want.len(), "case {c}: updates");
        for (u, (got, want)) in updates.iter().zip(want).enumerate() {
            assert_eq!(got.agent as u64, want["agent"].as_u64().unwrap(), "case {c} update {u}: agent");
            assert_eq!(got.turn as u64, want["turn"].as_u64().unwrap(), "case {c} update {u}: turn");
            let samples = want["samples"].as_array().unwrap();
            assert_eq!(got.samples.len(), samples.len(), "case {c} update {u}: samples");
            for (s, (g, w)) in got.samples.iter().zip(samples).enumerate() {
                let at = format!("case {c} update {u} sample {s}");
                assert_eq!(g.env_step, w["env_step"].as_u64().unwrap(), "{at}: env step");
                let close =
                    |a: f64, b: f64, tol: f64, what: &str| assert!((a - b).abs() < tol, "{at} {what}: {a} vs {b}");
                close(g.mean_reward, w["mean_reward"].as_f64().unwrap(), 1e-9, "mean reward");
                close(g.mean_return, w["mean_return"].as_f64().unwrap(), 1e-9, "mean return");
                let (rg, rw) = (&g.returns, floats(&w["returns"]));
                assert_eq!(rg.len(), rw.len(), "{at}: returns");
                rg.iter().zip(&rw).for_each(|(a, b)| close(*a, *b, 1e-9, "return"));
                let adv = group_advantages(rg, &[], rule);
                adv.iter().zip(floats(&w["advantages"])).for_each(|(a, b)| close(*a, b, 1e-6, "advantage"));
            }
        }
    }
    assert!(expanded_any, "some tree has a second turn");
}
