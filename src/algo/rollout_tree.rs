//! The multi-turn rollout tree of the MAGRPO family (CoMLRL 1.4.3's
//! `MAGRPOTrainer._train_step_returns`), as pure arithmetic on its rewards.
//!
//! A node is one turn of one branch: each agent samples K completions, which make the node's
//! joint actions (`aligned`: completion j of every agent; `cross`: every combination), each
//! scored by the reward. Unless it is the last turn, or early termination stops the branch (the
//! node's mean reward above `early_termination_threshold`), every joint action is expanded into
//! a child node whose prompts the transition writes from it. Then, undiscounted:
//!
//!   return_j = reward_j + mean(returns of child j)      (a leaf: return_j = reward_j)
//!
//! and each agent's completion k at a node gets the return of its joint action (`aligned`) or
//! the sum over the joint actions it takes part in (`cross`). The reference numbers the nodes
//! as it builds them, depth first, advancing its environment step by a node's joint actions;
//! the samples (one per node and agent) enter the agents' buffers in that order, each node's
//! agents in order, and a buffer full after a node is trained on, its turns one at a time.

/// How the agents' completions at a node form joint actions (`joint_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JointMode {
    /// Completion j of every agent is joint action j: K joint actions.
    Aligned,
    /// Every combination of the agents' completions: K^N joint actions, the last agent's index
    /// turning fastest (Python's `itertools.product`).
    Cross,
}

/// A node's joint actions, each as every agent's completion index. One agent: its K completions
/// in either mode.
pub fn joint_actions(mode: JointMode, num_agents: usize, k: usize) -> Vec<Vec<usize>> {
    match mode {
        JointMode::Cross if num_agents > 1 => {
            let mut all = vec![Vec::with_capacity(num_agents)];
            for _ in 0..num_agents {
                all = all
                    .into_iter()
                    .flat_map(|prefix| (0..k).map(move |c| [prefix.clone(), vec![c]].concat()))
                    .collect();
            }
            all
        }
        _ => (0..k).map(|j| vec![j; num_agents]).collect(),
    }
}

/// Whether a node of turn `turn` (0-based) with these rewards is expanded into children: not on
/// the last turn, and not when early termination ends the branch (its mean reward above
/// `threshold`).
pub fn expands(turn: usize, num_turns: usize, rewards: &[f64], threshold: Option<f64>) -> bool {
    let terminated = threshold.is_some_and(|t| !rewards.is_empty() && mean(rewards) > t);
    turn + 1 < num_turns && !terminated
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// One node: its turn, each joint action's reward, and (when expanded) one child per joint action.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub turn: usize,
    pub rewards: Vec<f64>,
    pub children: Vec<Node>,
}

impl Node {
    /// Each joint action's return: its reward plus the mean return of its child.
    pub fn returns(&self) -> Vec<f64> {
        if self.children.is_empty() {
            return self.rewards.clone();
        }
        self.rewards.iter().zip(&self.children).map(|(r, child)| r + mean_or_zero(&child.returns())).collect()
    }

    /// The nodes depth first, each before its children (the order the reference builds them).
    pub fn pre_order(&self) -> Vec<&Node> {
        let mut out = vec![self];
        for child in &self.children {
            out.extend(child.pre_order());
        }
        out
    }
}

fn mean_or_zero(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        mean(xs)
    }
}

/// Each agent's return for each of its `k` completions at a node with these joint actions and
/// returns: the joint action's return (`aligned`), or the sum over the joint actions the
/// completion takes part in (`cross`, no averaging, as the reference).
pub fn completion_returns(mode: JointMode, actions: &[Vec<usize>], returns: &[f64], k: usize) -> Vec<Vec<f64>> {
    let num_agents = actions.first().map_or(0, Vec::len);
    match mode {
        JointMode::Aligned => vec![returns.to_vec(); num_agents],
        JointMode::Cross => (0..num_agents)
            .map(|a| {
                let mut sums = vec![0.0; k];
                for (action, r) in actions.iter().zip(returns) {
                    sums[action[a]] += r;
                }
                sums
            })
            .collect(),
    }
}

/// What one agent trains on from one node: its completions there with their returns.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSample {
    pub agent: usize,
    pub turn: usize,
    /// The node's place in [`Node::pre_order`].
    pub node: usize,
    /// One per completion of the agent at the node.
    pub returns: Vec<f64>,
    pub mean_reward: f64,
    pub mean_return: f64,
    /// The environment step when the node was scored: the joint actions scored so far, this
    /// node's included (`env_step_before` plus those of the nodes built before it).
    pub env_step: u64,
}

/// A tree's samples in the order they enter the buffers (environment-step order, each node's
/// agents in order), and the environment step after the tree.
pub fn tree_samples(
    root: &Node,
    mode: JointMode,
    num_agents: usize,
    k: usize,
    env_step_before: u64,
) -> (Vec<NodeSample>, u64) {
    let actions = joint_actions(mode, num_agents, k);
    let mut step = env_step_before;
    let mut samples = Vec::new();
    for (index, node) in root.pre_order().into_iter().enumerate() {
        step += node.rewards.len() as u64;
        let returns = node.returns();
        let per_agent = completion_returns(mode, &actions, &returns, k);
        for (agent, returns) in per_agent.into_iter().enumerate() {
            samples.push(NodeSample {
                agent,
                turn: node.turn,
                node: index,
                returns,
                mean_reward: mean_or_zero(&node.rewards),
                mean_return: mean_or_zero(&node.returns()),
                env_step: step,
            });
        }
    }
    (samples, step)
}

/// The agents' rollout buffers across items: samples go in in order; after each node, a
/// buffer holding `size` samples is trained on, one turn at a time (turns in order, each turn's
/// samples in arrival order), and emptied. What is left at the end of an epoch is trained on
/// the same way ([`Buffers::flush`]).
#[derive(Debug, Clone)]
pub struct Buffers {
    size: usize,
    held: Vec<Vec<NodeSample>>,
}

/// One update's worth: an agent's samples of one turn from a drained buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnBatch {
    pub agent: usize,
    pub turn: usize,
    pub samples: Vec<NodeSample>,
}

impl Buffers {
    pub fn new(num_agents: usize, size: usize) -> Self {
        Self { size: size.max(1), held: vec![Vec::new(); num_agents] }
    }

    /// The samples each agent holds.
    pub fn held(&self) -> usize {
        self.held.first().map_or(0, Vec::len)
    }

    /// The nodes the held samples come from.
    pub fn held_nodes(&self) -> std::collections::HashSet<usize> {
        self.held.iter().flatten().map(|s| s.node).collect()
    }

    /// Add a tree's samples (in [`tree_samples`]' order); returns the batches drained on the way,
    /// in the order they are trained on.
    pub fn push(&mut self, samples: Vec<NodeSample>) -> Vec<TurnBatch> {
        let mut out = Vec::new();
        let mut samples = samples.into_iter().peekable();
        while let Some(first) = samples.next() {
            // One node's samples (one environment step) go in together, then full buffers drain.
            let step = first.env_step;
            let mut ready = Vec::new();
            let mut add = |s: NodeSample, ready: &mut Vec<usize>| {
                let a = s.agent;
                self.held[a].push(s);
                if self.held[a].len() >= self.size {
                    ready.push(a);
                }
            };
            add(first, &mut ready);
            while let Some(s) = samples.next_if(|s| s.env_step == step) {
                add(s, &mut ready);
            }
            ready.sort_unstable();
            ready.dedup();
            for a in ready {
                out.extend(self.drain(a));
            }
        }
        out
    }

    /// Drain every non-empty buffer (the end of an epoch).
    pub fn flush(&mut self) -> Vec<TurnBatch> {
        (0..self.held.len()).flat_map(|a| self.drain(a)).collect()
    }

    fn drain(&mut self, agent: usize) -> Vec<TurnBatch> {
        let held = std::mem::take(&mut self.held[agent]);
        let mut turns: Vec<usize> = held.iter().map(|s| s.turn).collect();
        turns.sort_unstable();
        turns.dedup();
        turns
            .into_iter()
            .map(|turn| TurnBatch { agent, turn, samples: held.iter().filter(|s| s.turn == turn).cloned().collect() })
            .collect()
    }
}

/// How many more items can be sampled together before a buffer could drain: enough for the
/// buffers to fill if every tree is whole (`nodes_per_tree` nodes), and no more, so items sampled
/// together are sampled by the same agents as the reference's one-at-a-time loop samples them.
pub fn items_until_drain(held: usize, size: usize, nodes_per_tree: usize) -> usize {
    size.max(1).saturating_sub(held).div_ceil(nodes_per_tree.max(1)).max(1)
}

/// The nodes of a whole tree: 1 + J + J² + ... over `num_turns` turns, J joint actions per node.
pub fn nodes_per_tree(mode: JointMode, num_agents: usize, k: usize, num_turns: usize) -> usize {
    let j = joint_actions(mode, num_agents, k).len();
    (0..num_turns).map(|t| j.saturating_pow(t as u32)).fold(0usize, usize::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(turn: usize, rewards: &[f64]) -> Node {
        Node { turn, rewards: rewards.to_vec(), children: Vec::new() }
    }

    #[test]
    fn joint_actions_are_aligned_or_the_cartesian_product() {
        assert_eq!(joint_actions(JointMode::Aligned, 2, 3), vec![vec![0, 0], vec![1, 1], vec![2, 2]]);
        assert_eq!(joint_actions(JointMode::Cross, 2, 2), vec![vec![0, 0], vec![0, 1], vec![1, 0], vec![1, 1]]);
        assert_eq!(joint_actions(JointMode::Cross, 1, 2), vec![vec![0], vec![1]]);
        assert_eq!(joint_actions(JointMode::Cross, 3, 2).len(), 8);
        assert_eq!(nodes_per_tree(JointMode::Aligned, 2, 2, 3), 1 + 2 + 4);
        assert_eq!(nodes_per_tree(JointMode::Cross, 2, 2, 2), 1 + 4);
    }

    #[test]
    fn returns_add_the_mean_of_the_childs_returns() {
        let root =
            Node { turn: 0, rewards: vec![1.0, 0.0], children: vec![leaf(1, &[0.5, 1.5]), leaf(1, &[2.0, 0.0])] };
        assert_eq!(root.returns(), vec![2.0, 1.0]);
    }

    #[test]
    fn early_termination_stops_a_branch_whose_mean_exceeds_the_threshold() {
        assert!(!expands(0, 1, &[0.0], None), "the last turn");
        assert!(expands(0, 2, &[-0.5, -0.1], Some(-0.2)));
        assert!(!expands(0, 2, &[0.0, 0.1], Some(-0.2)), "the reference's default ends non-negative branches");
        assert!(expands(0, 2, &[0.0, 0.1], None));
    }

    #[test]
    fn cross_returns_sum_over_the_joint_actions_of_a_completion() {
        let actions = joint_actions(JointMode::Cross, 2, 2);
        let r = completion_returns(JointMode::Cross, &actions, &[1.0, 2.0, 3.0, 4.0], 2);
        assert_eq!(r, vec![vec![3.0, 7.0], vec![4.0, 6.0]]);
    }

    #[test]
    fn buffers_drain_when_full_and_train_each_turn_apart() {
        let root =
            Node { turn: 0, rewards: vec![1.0, 0.0], children: vec![leaf(1, &[0.5, 1.5]), leaf(1, &[2.0, 0.0])] };
        let (samples, step) = tree_samples(&root, JointMode::Aligned, 2, 2, 10);
        assert_eq!(step, 16);
        assert_eq!(
            samples.iter().map(|s| (s.agent, s.node, s.env_step)).collect::<Vec<_>>()[..4],
            [(0, 0, 12), (1, 0, 12), (0, 1, 14), (1, 1, 14)]
        );
        let mut buffers = Buffers::new(2, 2);
        let drained = buffers.push(samples);
        // After node 1 both buffers hold 2 samples (turns 0 and 1): each trains turn 0, then turn 1.
        assert_eq!(
            drained.iter().map(|b| (b.agent, b.turn, b.samples.len())).collect::<Vec<_>>(),
            [(0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 1)]
        );
        assert_eq!(buffers.held(), 1);
        assert_eq!(buffers.flush().len(), 2);
        assert_eq!(items_until_drain(1, 4, 3), 1);
        assert_eq!(items_until_drain(0, 7, 3), 3);
        assert_eq!(items_until_drain(0, 1, 3), 1);
    }
}
