//! The wire protocol between this crate and its Lua: the scripts composed from `lua/`
//! ([`compose`]), the arguments a call sends ([`args`], with each policy set's text encoded
//! once per thread in [`encoded`]) and the replies it gets back ([`reply`]). One protocol,
//! documented in full in `lua/check.lua`'s header (check, refund, reset) and
//! `lua/config.lua`'s (a key's configuration); in short:
//!
//! - **Keys.** One: the client's state string `<prefix>:{<tag>}:f4` (see `keys.rs`); the
//!   script derives the key's configuration hash (`~cfg`) and sliding logs' lists (`~log:`)
//!   from it, all in its Cluster slot.
//! - **Arguments.** `"<op> <unconfigured> <least TTL ms> <cost>[ <time ms>]"`, then one
//!   argument per policy set (the defaults first, then each tier): the tier's name, then a
//!   line `\n<alg.L.P.B> <name>` per policy, where `alg` is the algorithm's wire id
//!   ([`Algorithm::wire_id`](turnstile_core::Algorithm::wire_id)) and the same text begins
//!   every stored state of the policy.
//! - **Replies.** `{now, version, applied, [tier], per policy: [an override's alg, L, P, B,
//!   name] and its result}` or, for the common case, the compact `{-1 - now, results...}`;
//!   a result is [`Algorithm::wire_width`](turnstile_core::Algorithm::wire_width) integers:
//!   retry, remaining, reset (numerators over L ms for buckets, whole ms for windows), the
//!   leaky bucket's delay, the sliding window's retry as whole, numerator, denominator.
//! - **Batches.** Several checks of one key in one call (`lua/batch.lua`): the check's
//!   arguments with `"<budget> "` before the first and the checks' costs in order,
//!   comma-separated, where a check has its one cost; the reply is one flat list, for each
//!   check decided (the first ones, within the budget of policy evaluations) the count of
//!   values of its reply, then the reply — or `-1` and the text of its error.
//! - **Configuration.** An override is stored as lines `"alg L P B name"`; the
//!   configuration script replies `{override, tier, version}`.
//!
//! Core's [`Algorithm`](turnstile_core::Algorithm) holds the one table of wire ids and
//! widths; `lua/prelude.lua`'s `ALG` is its Lua twin (a test in [`compose`] compares them).
//! Errors come back as Redis error replies whose first word names them
//! (`TURNSTILE_ARGS`, `TURNSTILE_INVALID_STATE`).

pub(crate) mod args;
pub(crate) mod compose;
pub(crate) mod encoded;
pub(crate) mod reply;

pub(crate) use args::{batch_args, check_args, encode_override, Op, Sets};
pub(crate) use compose::LIBRARY_BODY;
pub use compose::{BATCH_SCRIPT, CHECK_SCRIPT, CONFIG_SCRIPT};
pub(crate) use reply::{array, parse_batch, parse_config, parse_reply};
