//! The two kinds of forward pass every layer offers.

/// Which kernels a forward pass may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Differentiable ops only: gradients reach every weight.
    Train,
    /// Fused inference kernels (no backward): faster sampling and scoring without gradients.
    Infer,
}
