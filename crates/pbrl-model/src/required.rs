//! Weights fetched by name, refusing a missing one.
use anyhow::{bail, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;

/// Fetch a weight that must exist (a `VarMap`-backed `VarBuilder` would otherwise create a fresh
/// random one for a missing name, which would silently train a broken model).
pub(crate) fn required<S: Into<candle_core::Shape>>(vb: &VarBuilder, shape: S, name: &str) -> Result<Tensor> {
    if !vb.contains_tensor(name) {
        bail!("the model has no weight `{}`", vb.prefix_name(name));
    }
    Ok(vb.get(shape, name)?)
}

trait PrefixName {
    fn prefix_name(&self, name: &str) -> String;
}
impl PrefixName for VarBuilder<'_> {
    fn prefix_name(&self, name: &str) -> String {
        let p = self.prefix();
        if p.is_empty() {
            name.to_string()
        } else {
            format!("{p}.{name}")
        }
    }
}
