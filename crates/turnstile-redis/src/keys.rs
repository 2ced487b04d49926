//! Redis key names: `<prefix>:{<client key>}:<format>` for a client's state string (every
//! policy's state in one string, see `lua/states.lua`), `<prefix>:{<client key>}~log:<format>:
//! <policy name>` for a sliding log's list (`<format>` is [`STATE_FORMAT`], `f4`), `<prefix>:{<client key>}~cfg` for a client's
//! configuration. All of a client's keys share the hash tag, so one Cluster slot.
//!
//! Design (issue 15, format `f4`): a check makes `TIME`, `GET <state string>` and `PSETEX`
//! whatever the number of policies. The string's header says whether the client had a
//! configuration hash when it was written: `0` (none: the script may decide from the
//! string alone) or `c` (it reads the hash). Whatever creates or changes the hash (a
//! configuration change, a refund's or a reset's version bump) marks the string `c` in the
//! same atomic call, and a client without a state string has its hash probed before any
//! decision, so no decision is ever made under a configuration the script did not see.

use sha2::{Digest, Sha256};

/// How client keys appear inside the Cluster hash tag of Redis key names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyEncoding {
    /// The first 128 bits of the client key's SHA-256, in hex (the default): a fixed size,
    /// the same on every build and platform, and no API keys or addresses in key names.
    #[default]
    Hashed,
    /// The client key itself, after `k:`, with `%`, `{` and `}` percent-encoded so the tag is
    /// never empty and never ends early. For debugging with `redis-cli`.
    Plain,
}

impl KeyEncoding {
    /// The hash tag's content for `client_key` (without the braces).
    pub fn tag(self, client_key: &str) -> String {
        let mut s = String::with_capacity(self.tag_len(client_key));
        self.write_tag(client_key, &mut s);
        s
    }

    /// An upper bound of the tag's length for `client_key`, in bytes.
    fn tag_len(self, client_key: &str) -> usize {
        match self {
            KeyEncoding::Hashed => 32,
            // Each `%`, `{`, `}` becomes three bytes.
            KeyEncoding::Plain => 2 + client_key.len() * 3,
        }
    }

    /// Appends [`tag`](Self::tag)`(client_key)` to `out`.
    fn write_tag(self, client_key: &str, out: &mut String) {
        match self {
            KeyEncoding::Hashed => {
                let digest = Sha256::digest(client_key.as_bytes());
                for b in &digest[..16] {
                    out.push(char::from(HEX[usize::from(b >> 4)]));
                    out.push(char::from(HEX[usize::from(b & 0xf)]));
                }
            }
            KeyEncoding::Plain => {
                out.push_str("k:");
                for c in client_key.chars() {
                    match c {
                        '%' => out.push_str("%25"),
                        '{' => out.push_str("%7B"),
                        '}' => out.push_str("%7D"),
                        c => out.push(c),
                    }
                }
            }
        }
    }

    /// The key of `client_key`'s state string under `prefix`: [`states_key`]`(prefix,
    /// tag(client_key))` built in one string.
    pub(crate) fn states_key_of(self, prefix: &str, client_key: &str) -> String {
        self.key_of(prefix, client_key, &[":", STATE_FORMAT])
    }

    /// The key of the list holding the log of `client_key`'s sliding log policy `name`
    /// under `prefix`: `<prefix>:{<tag>}~log:<format>:<name>` (`logsuffix` in
    /// `lua/sets.lua`).
    pub(crate) fn log_key_of(self, prefix: &str, client_key: &str, name: &str) -> String {
        self.key_of(prefix, client_key, &["~log:", STATE_FORMAT, ":", name])
    }

    /// `<prefix>:{<tag>}` and then each of `rest`, built in one string.
    fn key_of(self, prefix: &str, client_key: &str, rest: &[&str]) -> String {
        let len = prefix.len() + self.tag_len(client_key) + 3;
        let mut s = String::with_capacity(len + rest.iter().map(|r| r.len()).sum::<usize>());
        s.push_str(prefix);
        s.push_str(":{");
        self.write_tag(client_key, &mut s);
        s.push('}');
        for r in rest {
            s.push_str(r);
        }
        s
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The version of the stored states' format, part of every state key whatever the prefix
/// (`STATE_FORMAT` in `lua/prelude.lua`): a release that stores states differently uses
/// other keys, so none ever reads another release's format as its own. `f4`: every policy's
/// state of a client in one string, GCRA's as the token bucket's (updated, debt) and the
/// windows' without their window index (`f3` had the same layout with GCRA's state as
/// updated, ahead, frac and the window index stored; `f2` kept one key per policy,
/// `<prefix>:{<tag>}:f2:<policy name>`; format 1 held GCRA's theoretical arrival time
/// absolute, at keys without a version).
pub(crate) const STATE_FORMAT: &str = "f4";

/// The key of a client's state string: `<prefix>:{<tag>}:<format>` (what
/// [`KeyEncoding::states_key_of`] builds from the client key).
#[cfg(test)]
pub(crate) fn states_key(prefix: &str, tag: &str) -> String {
    format!("{prefix}:{{{tag}}}:{STATE_FORMAT}")
}

/// The key of a client's configuration hash: `<prefix>:{<tag>}~cfg`.
pub(crate) fn config_key(prefix: &str, tag: &str) -> String {
    format!("{prefix}:{{{tag}}}~cfg")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_tags_are_stable_and_fixed_size() {
        // SHA-256("alice") starts 2bd806c97f0e00af1a1fc3328fa763a9.
        assert_eq!(
            KeyEncoding::Hashed.tag("alice"),
            "2bd806c97f0e00af1a1fc3328fa763a9"
        );
        assert_eq!(KeyEncoding::Hashed.tag("").len(), 32);
    }

    #[test]
    fn a_state_key_built_in_one_string_is_the_state_key_of_the_tag() {
        for enc in [KeyEncoding::Hashed, KeyEncoding::Plain] {
            for key in ["", "alice", "a}b{c%", "é{%}"] {
                assert_eq!(
                    enc.states_key_of("turnstile:v1", key),
                    states_key("turnstile:v1", &enc.tag(key))
                );
            }
        }
    }

    #[test]
    fn a_log_key_is_the_state_keys_base_and_the_scripts_suffix() {
        for enc in [KeyEncoding::Hashed, KeyEncoding::Plain] {
            let state = enc.states_key_of("turnstile:v1", "a}b");
            let base = state.strip_suffix(":f4").unwrap();
            assert_eq!(
                enc.log_key_of("turnstile:v1", "a}b", "per ip"),
                format!("{base}~log:f4:per ip")
            );
        }
        // lua/sets.lua builds the same suffix.
        assert!(crate::wire::CHECK_SCRIPT
            .contains("p.logsuffix = '~log:' .. STATE_FORMAT .. ':' .. p.name"));
    }

    #[test]
    fn plain_tags_are_never_empty_and_never_end_early() {
        assert_eq!(KeyEncoding::Plain.tag(""), "k:");
        assert_eq!(KeyEncoding::Plain.tag("a}b{c%"), "k:a%7Db%7Bc%25");
        assert_eq!(
            states_key("turnstile:v1", &KeyEncoding::Plain.tag("}x")),
            "turnstile:v1:{k:%7Dx}:f4"
        );
        assert!(
            crate::wire::CHECK_SCRIPT.contains(&format!("local STATE_FORMAT = '{STATE_FORMAT}'"))
        );
    }
}
