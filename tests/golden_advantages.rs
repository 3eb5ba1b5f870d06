//! The MAGRPO-family advantages against CoMLRL 1.4.3's own code (scripts/fixtures/golden_advantages.py):
//! every advantage_mode, with the reference KL on and off, normalized or not, on fixed groups of
//! returns (one of a single sample, one of equal returns), within 1e-5.
mod common;

use pbrl::algo::advantages::{group_advantages, AdvantageMode, AdvantageRule};
use serde_json::Value;

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

#[test]
fn advantages_match_comlrl_for_every_mode() {
    let g: Value =
        serde_json::from_str(&std::fs::read_to_string(common::fixtures().join("golden_advantages.json")).unwrap())
            .unwrap();
    let cases = g["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 4 * 2 * 2 * 5, "modes × KL × normalization × groups");
    for c in cases {
        let rule = AdvantageRule {
            mode: AdvantageMode::parse(c["mode"].as_str().unwrap()).unwrap(),
            normalize: c["normalize"].as_bool().unwrap(),
            kl_coef: c["reference_kl"].as_bool().unwrap().then(|| c["kl_coef"].as_f64().unwrap()),
        };
        let got = group_advantages(&floats(&c["returns"]), &floats(&c["kls"]), rule);
        let want = floats(&c["advantages"]);
        assert_eq!(got.len(), want.len());
        for (k, (a, b)) in got.iter().zip(&want).enumerate() {
            // CoMLRL computes in float32; normalized values are O(1).
            assert!((a - b).abs() < 1e-5, "{rule:?} returns {} sample {k}: {a} vs CoMLRL {b}", c["returns"]);
        }
    }
}
