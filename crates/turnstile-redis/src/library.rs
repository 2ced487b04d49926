//! The Redis Function library: the same Lua as the `EVALSHA` scripts, loaded once per node
//! with `FUNCTION LOAD` and called with `FCALL`, so the definitions run once rather than on
//! every call.
//!
//! Its name is `turnstile_<N>_<hash>`: `N` the release (see [`RELEASE`]), `hash` the first
//! 12 hex digits of the SHA-256 of its body, so two builds with different Lua never share a
//! name. Function names are global across a server's libraries, so its functions carry the
//! library's name too: `<library>_check`, `<library>_config`.

use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::script::LIBRARY_BODY;

/// Every library name begins with this.
pub(crate) const LIBRARY_PREFIX: &str = "turnstile_";

/// This release as one number, `major · 10^6 + minor · 10^3 + patch` of the crate's version
/// (0.1.0 is 1000): later releases have larger numbers, so a release can tell the libraries
/// of older ones (smaller `N`), which it deletes, from those of newer ones, which it keeps.
pub(crate) const RELEASE: u64 = release(
    env!("CARGO_PKG_VERSION_MAJOR"),
    env!("CARGO_PKG_VERSION_MINOR"),
    env!("CARGO_PKG_VERSION_PATCH"),
);

const fn digits(s: &str) -> u64 {
    let b = s.as_bytes();
    let mut i = 0;
    let mut n = 0;
    while i < b.len() {
        assert!(b[i].is_ascii_digit(), "a version part is not a number");
        n = n * 10 + (b[i] - b'0') as u64;
        i += 1;
    }
    n
}

const fn release(major: &str, minor: &str, patch: &str) -> u64 {
    let (major, minor, patch) = (digits(major), digits(minor), digits(patch));
    assert!(
        minor < 1000 && patch < 1000,
        "minor and patch must stay below 1000"
    );
    major * 1_000_000 + minor * 1_000 + patch
}

/// The library this build loads.
#[derive(Debug)]
pub(crate) struct Library {
    /// `turnstile_<N>_<hash>`.
    pub(crate) name: String,
    /// The function `FCALL` calls for checks, refunds and resets.
    pub(crate) check: String,
    /// The function `FCALL` calls for configuration operations.
    pub(crate) config: String,
    /// What `FUNCTION LOAD` is given.
    pub(crate) source: String,
}

/// The library this build loads (composed once).
pub(crate) fn library() -> &'static Library {
    static LIBRARY: OnceLock<Library> = OnceLock::new();
    LIBRARY.get_or_init(|| compose(RELEASE, LIBRARY_BODY))
}

fn compose(release: u64, body: &str) -> Library {
    let digest = Sha256::digest(body.as_bytes());
    let hash: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    let name = format!("{LIBRARY_PREFIX}{release}_{hash}");
    let (check, config) = (format!("{name}_check"), format!("{name}_config"));
    let source = format!(
        "#!lua name={name}\n{body}\nredis.register_function('{check}', check)\n\
         redis.register_function('{config}', config)\n"
    );
    Library {
        name,
        check,
        config,
        source,
    }
}

/// The release `N` of a library named `turnstile_<N>_<hash>`, or `None` for any other name.
pub(crate) fn release_of(name: &str) -> Option<u64> {
    let rest = name.strip_prefix(LIBRARY_PREFIX)?;
    let (n, hash) = rest.split_once('_')?;
    let well_formed = !n.is_empty()
        && n.bytes().all(|b| b.is_ascii_digit())
        && !hash.is_empty()
        && hash.bytes().all(|b| b.is_ascii_alphanumeric());
    well_formed.then(|| n.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_carries_the_release_and_a_hash_of_the_code() {
        let lib = library();
        assert_eq!(release_of(&lib.name), Some(RELEASE));
        assert!(lib
            .source
            .starts_with(&format!("#!lua name={}\n", lib.name)));
        assert_eq!(lib.check, format!("{}_check", lib.name));
        assert_eq!(lib.config, format!("{}_config", lib.name));
        // Other code, another name; the same code, the same name.
        let other = compose(RELEASE, "local function check() end");
        assert_ne!(other.name, lib.name);
        assert_eq!(compose(RELEASE, LIBRARY_BODY).name, lib.name);
        assert_eq!(release("0", "1", "0"), 1000);
        assert!(release("1", "0", "0") > release("0", "999", "999"));
    }

    #[test]
    fn only_turnstile_library_names_have_a_release() {
        assert_eq!(release_of("turnstile_1000_0a1b2c3d4e5f"), Some(1000));
        assert_eq!(release_of("turnstile_7_x"), Some(7));
        for other in [
            "turnstile_",
            "turnstile__abc",
            "turnstile_12",
            "turnstile_12_",
            "turnstile_+1_abc",
            "turnstile_1_a-b",
            "other_1_abc",
            "turnstile_99999999999999999999999_abc",
        ] {
            assert_eq!(release_of(other), None, "{other}");
        }
    }
}
