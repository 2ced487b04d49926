//! `docs/SEMANTICS.md` is a copy of the project's shared decision contract: when the shared
//! one is beside the workspace, the copy must match it exactly.

use std::path::Path;

#[test]
fn the_copy_of_semantics_matches_the_shared_contract() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let copy = std::fs::read(root.join("docs/SEMANTICS.md")).expect("docs/SEMANTICS.md");
    assert!(!copy.is_empty());
    if let Ok(shared) = std::fs::read(root.join("../shared/SEMANTICS.md")) {
        assert!(
            shared == copy,
            "docs/SEMANTICS.md differs from ../shared/SEMANTICS.md: copy it again, verbatim"
        );
    }
}
