//! `docs/api-fields.md` is the front end's table of request fields ([`fields::markdown`]): what
//! each API honours, ignores (and why) and refuses. The table decides; the file must say the same.

use std::path::Path;

use mlxcel_frontend::fields;

#[test]
fn fields_doc() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/api-fields.md");
    let want = fields::markdown();
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let fresh = std::env::temp_dir().join("api-fields.md");
        std::fs::write(&fresh, &want).expect("write the fresh table");
        panic!(
            "{} is out of date with frontend/src/fields.rs: copy {} over it",
            path.display(),
            fresh.display()
        );
    }
}
