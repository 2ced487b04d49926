//! The scripts' Lua, composed from the pieces in `lua/` (the protocol's code side: see
//! `mod.rs`).

/// The definitions every source is composed of, in this order: `lua/prelude.lua` (shared
/// helpers, the algorithms' table `ALG`); each algorithm family's arithmetic, written once
/// and called by every path (`lua/bucket.lua`, `lua/gcra.lua`, `lua/fixed_window.lua`,
/// `lua/sliding_window.lua`, `lua/sliding_log.lua`); `lua/outcome.lua` (the all-or-nothing
/// rule); `lua/fast.lua` (check's path for the common case);
/// `lua/sets.lua` (check's arguments parsed); then `general_path()`, a function holding
/// `lua/reading.lua` (the general path's helpers), the algorithms' methods on the general
/// path's states (`lua/methods.lua`, `lua/log_list.lua`), `lua/states.lua` (a client key's
/// state string) and `lua/general.lua` (the general path) and returning `general`; and last
/// `lua/check.lua` (which defines `check(KEYS, ARGV)`). The general path's definitions run
/// only when `general_path` runs: when a call first needs it (see `lua/general.lua`), so an
/// `EVALSHA` call decided by the fast path creates none of them.
macro_rules! check_definitions {
    () => {
        concat!(
            include_str!("../../lua/prelude.lua"),
            "\n",
            include_str!("../../lua/bucket.lua"),
            "\n",
            include_str!("../../lua/gcra.lua"),
            "\n",
            include_str!("../../lua/fixed_window.lua"),
            "\n",
            include_str!("../../lua/sliding_window.lua"),
            "\n",
            include_str!("../../lua/sliding_log.lua"),
            "\n",
            include_str!("../../lua/outcome.lua"),
            "\n",
            include_str!("../../lua/fast.lua"),
            "\n",
            include_str!("../../lua/sets.lua"),
            "\n-- The general path: the algorithms' methods, states.lua and general.lua, built when \
             a call first needs it (general.lua's header).\nlocal function general_path()\n",
            include_str!("../../lua/reading.lua"),
            "\n",
            include_str!("../../lua/methods.lua"),
            "\n",
            include_str!("../../lua/log_list.lua"),
            "\n",
            include_str!("../../lua/states.lua"),
            "\n",
            include_str!("../../lua/general.lua"),
            "\nreturn general\nend\n",
            include_str!("../../lua/check.lua"),
        )
    };
}

/// The Lua source of the check script (check, refund, reset) run with `EVALSHA`: the
/// definitions (see `check_definitions`), then `return check(KEYS, ARGV)`.
pub const CHECK_SCRIPT: &str = concat!(check_definitions!(), "\nreturn check(KEYS, ARGV)\n");

/// The Lua source of the batch script (several checks of one key in one call, see
/// `lua/batch.lua`) run with `EVALSHA`: the check script's definitions (see
/// `check_definitions`), `lua/batch.lua`, then `return batch(KEYS, ARGV)`. A script of its
/// own, so that a lone check's `EVALSHA` runs none of `lua/batch.lua`'s definitions.
pub const BATCH_SCRIPT: &str = concat!(
    check_definitions!(),
    "\n",
    include_str!("../../lua/batch.lua"),
    "\nreturn batch(KEYS, ARGV)\n"
);

/// The Lua source of the configuration script run with `EVALSHA`: `lua/prelude.lua` and
/// `lua/config.lua`, concatenated in that order, then `return config(KEYS, ARGV)`.
pub const CONFIG_SCRIPT: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    "\n",
    include_str!("../../lua/config.lua"),
    "\nreturn config(KEYS, ARGV)\n",
);

/// The body of the Redis Function library (see `library.rs`, which adds its `#!lua` line and
/// registers `check`, `batch` and `config`): the check script's definitions, the general path
/// built at once (so that every definition runs once, at `FUNCTION LOAD`, and no call pays
/// for it), then `lua/config.lua` and `lua/batch.lua`.
pub(crate) const LIBRARY_BODY: &str = concat!(
    check_definitions!(),
    "\nGENERAL = general_path()\n",
    include_str!("../../lua/config.lua"),
    "\n",
    include_str!("../../lua/batch.lua")
);

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile_core::Algorithm;

    #[test]
    fn the_scripts_algorithm_table_is_cores() {
        // lua/prelude.lua's ALG: entry `id` (in order, one a line) is the algorithm of that
        // wire id, with its reply width; FAST in lua/fast.lua has a decision for each.
        let table = CHECK_SCRIPT
            .split_once("local METHODS, ALG = {}, {")
            .and_then(|(_, rest)| rest.split_once("\n}"))
            .map(|(table, _)| table)
            .expect("ALG in the check script");
        let rows: Vec<&str> = table.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(rows.len(), Algorithm::ALL.len(), "{table}");
        for a in Algorithm::ALL {
            let row = rows[usize::from(a.wire_id()) - 1];
            assert!(
                row.contains(&format!("width = {}}}", a.wire_width()))
                    && row.ends_with(&format!("-- {} {}", a.wire_id(), a.as_str())),
                "{a}: {row}"
            );
        }
        let fast = CHECK_SCRIPT
            .split_once("\nFAST = {")
            .and_then(|(_, rest)| rest.split_once('}'))
            .map(|(list, _)| list.split(", ").count());
        assert_eq!(fast, Some(Algorithm::ALL.len()));
    }

    #[test]
    fn every_piece_is_composed_once_in_order() {
        let order = [
            "-- turnstile: shared helpers of every script",
            "-- turnstile: token bucket (id 1)",
            "-- turnstile: GCRA (id 2)",
            "-- turnstile: fixed window (id 4)",
            "-- turnstile: sliding window counter (id 6)",
            "-- turnstile: sliding log (id 5)",
            "-- turnstile: a check's outcome",
            "-- turnstile: the fast path of check",
            "-- turnstile: check's arguments parsed",
            "local function general_path()",
            "-- turnstile: helpers of check's general path only",
            "-- turnstile: the algorithms' methods",
            "-- turnstile: the sliding log's list",
            "-- turnstile: a client key's state string",
            "-- turnstile: check's general path",
            "-- turnstile: one atomic call for one client key",
        ];
        let mut from = 0;
        for piece in order {
            assert_eq!(CHECK_SCRIPT.matches(piece).count(), 1, "{piece}");
            let at = CHECK_SCRIPT.find(piece).unwrap();
            assert!(at > from || from == 0, "{piece} out of order");
            from = at;
        }
    }
}
