//! The layers the code keeps: within each crate no file imports another around a circle
//! (`scripts/module_graph.py`); across crates the compiler keeps `pbrl-model` from naming the
//! trainer.
mod common;

fn module_graph(src: &str) -> (bool, String) {
    let out = std::process::Command::new("python3")
        .arg(common::repo().join("scripts/module_graph.py"))
        .arg(common::repo().join(src))
        .arg("--top")
        .output()
        .expect("python3 runs scripts/module_graph.py");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn no_import_circle_in_either_crate() {
    for src in ["src", "crates/pbrl-model/src"] {
        let (ok, text) = module_graph(src);
        assert!(ok && !text.contains("circle:"), "{src}:\n{text}");
        assert!(text.lines().any(|l| l.contains(" -> ")), "{src}: the graph lists its imports:\n{text}");
    }
}

#[test]
fn the_graph_finds_a_circle_when_there_is_one() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("lib.rs"), "pub mod a;\npub mod b;\n").unwrap();
    std::fs::write(d.path().join("a.rs"), "use crate::b::B;\npub struct A;\n").unwrap();
    std::fs::write(d.path().join("b.rs"), "use super::a::A;\npub struct B;\n").unwrap();
    let out = std::process::Command::new("python3")
        .arg(common::repo().join("scripts/module_graph.py"))
        .arg(d.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && text.contains("circle: a b"), "{text}");
}
